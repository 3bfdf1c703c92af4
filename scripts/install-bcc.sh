#!/usr/bin/env bash
# Install BCC (Debian's python3-bpfcc) and kernel headers for the XDP fast path, and link the
# headers where BCC looks for them: /lib/modules/$(uname -r)/{build,source}.
#
# Idempotent and quiet. Exit status: 0 when BCC is importable and the headers are in place,
# 1 otherwise (the caller, scripts/bootstrap.sh, decides whether that is fatal; it is not,
# because hosts without root, apt or BPF still get the portable UDP path).
#
# Why Debian's headers behind symlinks: the running kernel may be a custom build (here a
# Firecracker kernel, `uname -r` = 6.18.x-fc) with no headers package of its own. The XDP
# program only uses stable UAPI (linux/bpf.h, if_ether.h, ip.h, ipv6.h, udp.h) and BPF
# helpers, so any recent kernel's headers compile it; BCC only needs *a* header tree there.
# An existing build/source entry (a real headers package for this kernel) is never replaced.
#
# Override: ZEROLAYER_HEADERS_PKG (default linux-headers-amd64 / -arm64 by architecture).
set -euo pipefail

log() { echo "install-bcc: $*" >&2; }

KREL=$(uname -r)
PY=/usr/bin/python3
# BCC reads the generated config from build/ and the headers proper from source/.
headers_ok() {
  [ -e "/lib/modules/$KREL/build/include/generated/autoconf.h" ] &&
    [ -e "/lib/modules/$KREL/source/include/linux/kconfig.h" ]
}
ready() { headers_ok && $PY -c 'import bcc' 2>/dev/null; }
ready && exit 0  # the common case on a second run: nothing to do, no apt, no root needed

if [ "$(id -u)" != 0 ]; then
  log "not root; skipping (BCC and kernel headers need root to install)"
  exit 1
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then
  log "no apt-get/dpkg; skipping"
  exit 1
fi

ARCH=$(dpkg --print-architecture)
HDR_PKG=${ZEROLAYER_HEADERS_PKG:-linux-headers-$ARCH}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

need=()
installed python3-bpfcc || need+=(python3-bpfcc)
# A headers package for the running kernel wins if the archive has one (a stock Debian
# kernel); otherwise the distribution's generic metapackage, linked below.
if ! headers_ok; then
  installed "$HDR_PKG" || need+=("$HDR_PKG")
fi

if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  aptlog=$(mktemp)
  trap 'rm -f "$aptlog"' EXIT
  # apt's chatter (debconf notes included) is shown only when something fails.
  apt_install() { apt-get install -y -qq --no-install-recommends "${need[@]}" >"$aptlog" 2>&1; }
  # Update the package lists only when they don't know the packages, or when an install
  # from them fails (stale lists point at versions the mirror no longer has).
  fresh=0
  for p in "${need[@]}"; do
    if ! apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
      apt-get update -qq >/dev/null 2>"$aptlog" || cat "$aptlog" >&2
      fresh=1
      break
    fi
  done
  if ! apt_install; then
    if [ "$fresh" = 0 ]; then
      apt-get update -qq >/dev/null 2>"$aptlog" || cat "$aptlog" >&2
      apt_install || { cat "$aptlog" >&2; log "apt-get install ${need[*]} failed"; exit 1; }
    else
      cat "$aptlog" >&2
      log "apt-get install ${need[*]} failed"
      exit 1
    fi
  fi
  log "installed ${need[*]}"
fi

# Link the newest installed Debian header tree for this architecture, the way Debian's own
# kernel packages do: build -> the arch-specific tree, source -> its -common tree.
newest_header_tree() {
  local best="" d
  for d in /usr/src/linux-headers-*-"$ARCH"; do
    [ -d "$d" ] || continue
    if [ -z "$best" ] || [ "$(printf '%s\n%s\n' "$best" "$d" | sort -V | tail -n1)" = "$d" ]; then
      best=$d
    fi
  done
  [ -n "$best" ] && echo "$best"
}
MOD=/lib/modules/$KREL
# `-e` follows links: a dangling one (its tree removed by a headers upgrade) is relinked.
if [ ! -e "$MOD/build" ]; then
  if ! build=$(newest_header_tree); then
    log "no /usr/src/linux-headers-*-$ARCH tree to link"
    exit 1
  fi
  common=${build%-"$ARCH"}-common
  [ -d "$common" ] || common=$build
  mkdir -p "$MOD"
  ln -sfn "$build" "$MOD/build"
  ln -sfn "$common" "$MOD/source"
  log "linked $MOD/build -> $build, $MOD/source -> $common"
elif [ ! -e "$MOD/source" ]; then
  # A real headers tree for this kernel without a source link: the tree serves as both.
  ln -sfn "$(readlink -f "$MOD/build")" "$MOD/source"
  log "linked $MOD/source -> $(readlink -f "$MOD/build")"
fi

if ! ready; then
  log "python3-bpfcc and headers are installed, but 'import bcc' or the header links fail"
  exit 1
fi
