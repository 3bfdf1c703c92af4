#!/usr/bin/env bash
# Add a new key to zerolayerd's keys file and make a running daemon use it, without a restart.
#
#   scripts/zl-keygen.sh [--keys-file PATH] [--key-id N] [--user USER] [--unit UNIT]
#
# - Appends "<key_id> <secret_hex>" with `zerolayer keygen --append`: the file is created with
#   mode 0600, and a file that group or others can access is refused, not appended to.
# - A file this script creates is given to the daemon's user (default: zerolayer, if that
#   user exists), since the daemon must be able to read it and nobody else may.
# - If the systemd unit is active, `systemctl reload` makes the daemon re-read the file
#   (SIGHUP). A file that fails to load leaves the daemon on its old keys; check the log.
# - Prints the new key line on stdout: hand it to the client over a secure channel
#   (ZEROLAYER_KEY_ID / ZEROLAYER_SECRET, or a client-side keys file).
#
# Environment: ZEROLAYER_BIN (the zerolayer CLI; default: on PATH, else the repo's .venv).
set -euo pipefail

keys_file=/etc/zerolayer/keys
key_id=
user=zerolayer
unit=zerolayerd

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
  exit "${1:-0}"
}

while (($#)); do
  case $1 in
    --keys-file) keys_file=${2:?--keys-file needs a path}; shift 2 ;;
    --key-id) key_id=${2:?--key-id needs a number}; shift 2 ;;
    --user) user=${2:?--user needs a name}; shift 2 ;;
    --unit) unit=${2:?--unit needs a name}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "zl-keygen: unknown argument: $1" >&2; usage 2 >&2 ;;
  esac
done

repo=$(cd "$(dirname "$0")/.." && pwd)
zerolayer=${ZEROLAYER_BIN:-$(command -v zerolayer || echo "$repo/.venv/bin/zerolayer")}
[[ -x $zerolayer ]] || { echo "zl-keygen: zerolayer CLI not found (set ZEROLAYER_BIN)" >&2; exit 2; }

created=false
if [[ ! -e $keys_file ]]; then
  created=true
  mkdir -p "$(dirname "$keys_file")"
fi

args=(keygen --append "$keys_file")
[[ -n $key_id ]] && args+=(--key-id "$key_id")
# stdout: the new key line; stderr: what was done (or why not).
"$zerolayer" "${args[@]}"

if $created && ((EUID == 0)) && id -u "$user" >/dev/null 2>&1; then
  chown "$user:" "$keys_file"
  echo "zl-keygen: created $keys_file (mode 0600, owner $user)" >&2
fi

sock=${ZEROLAYER_CONTROL_SOCKET:-/run/zerolayer/control.sock}
if [[ -S $sock && -w $sock ]]; then
  # the control socket answers whether the daemon took the new file (and why not)
  if "$zerolayer" ctl reload-keys --socket "$sock" >/dev/null; then
    echo "zl-keygen: the daemon reloaded its keys" >&2
  else
    echo "zl-keygen: the daemon refused the keys file and kept its old keys (see above)" >&2
    exit 3
  fi
elif command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$unit" 2>/dev/null; then
  systemctl reload "$unit"
  echo "zl-keygen: $unit reloaded; check it took the keys: journalctl -u $unit -n 3" >&2
else
  echo "zl-keygen: $unit is not an active systemd unit; a daemon started by hand needs" \
    "kill -HUP <pid> to read the new key" >&2
fi
