# syntax=docker/dockerfile:1
# The zerolayerd image: Debian 12, Debian's python3.11 and BCC (python3-bpfcc), the project's
# venv built by scripts/bootstrap.sh. Used by the Kubernetes manifests in deploy/k8s/.
#
#   docker build -t zerolayerd:latest .
#   docker run --rm -v "$PWD/keys:/etc/zerolayer/keys:ro" -p 7433:7433/udp zerolayerd:latest \
#       --network-host 0.0.0.0          # a keys file mode 0400/0600 that uid 10001 can read
#
# No keys, tokens or CURVE secrets are in the image (.dockerignore keeps them out of the build
# context); Kubernetes mounts them from a Secret. The runtime user is zerolayer (10001): the
# UDP path needs no privilege. The XDP fast path runs the container as root with a few
# capabilities instead (deploy/k8s/modes/xdp).

ARG DEBIAN_IMAGE=debian:12

# ---- builder: the venv, exactly as on a host (scripts/bootstrap.sh) ------------------------
FROM ${DEBIAN_IMAGE} AS builder
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# The venv is editable (it points at this tree), so the tree lives where it will run.
WORKDIR /opt/zerolayer
COPY . .
# bootstrap.sh: apt packages for the tests (shellcheck, promtool) and BCC, which stay in this
# stage; the venv with --system-site-packages over /usr/bin/python3; the project (editable,
# with its test extra); the bundled model package; the CUDA wheels and CuPy.
RUN bash scripts/bootstrap.sh \
 && .venv/bin/python -m compileall -q daemon gpu client bpf \
 && .venv/bin/zerolayerd --version

# ---- runtime: Debian's interpreter and BCC, the venv and the tree -------------------------
FROM ${DEBIAN_IMAGE}-slim AS runtime
ENV DEBIAN_FRONTEND=noninteractive
# python3: the venv's interpreter (/usr/bin/python3, the same 3.11 as in the builder).
# python3-bpfcc: BCC for the XDP fast path (the venv sees Debian's site-packages).
# libgomp1: numba's OpenMP threading layer.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-bpfcc libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 zerolayer \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin zerolayer \
 && install -d -o zerolayer -g zerolayer -m 0750 /var/cache/zerolayer /run/zerolayer \
 && install -d -m 0755 /etc/zerolayer
COPY --from=builder /opt/zerolayer /opt/zerolayer
ENV PATH=/opt/zerolayer/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    ZEROLAYER_CACHE_DIR=/var/cache/zerolayer \
    RUNTIME_DIRECTORY=/run/zerolayer \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 7433/udp 9433/tcp
# SIGTERM drains (docs/OPERATIONS.md "Draining and restarts"); the daemon is PID 1 and
# handles it itself.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/zerolayer/.venv/bin/zerolayerd"]
CMD ["--config", "/etc/zerolayer/zerolayerd.toml"]
