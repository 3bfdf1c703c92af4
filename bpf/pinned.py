"""Ops view of a running daemon's XDP program through its pinned maps (network.xdp_pin_dir):
read the drop counters, the invoke ports, the rate limit and which authentication checks are
on (with the key ids held, never their keys), and change the budgets live, without BCC and
without restarting the daemon.

    python -m zerolayer.bpf.pinned [--dir /sys/fs/bpf/zerolayer] show
    python -m zerolayer.bpf.pinned [--dir ...] rate PPS [BURST]     # 0 turns the limit off
    python -m zerolayer.bpf.pinned [--dir ...] untagged-rate PPS [BURST]   # requests without
                                                   # the XDP tag, per receiving CPU; 0: no limit
    python -m zerolayer.bpf.pinned [--dir ...] reset-rate-state     # every source starts full

`show --json` prints the same as JSON. Exit status 2 when the pins can't be opened.
"""
from __future__ import annotations

import argparse
import json
import sys

from .loader import AUTH_KEYS, AUTH_REQUIRE_TAG, REASONS, BpfUnavailable, InvokeSteer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="zerolayer.bpf.pinned", description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/sys/fs/bpf/zerolayer")
    sub = ap.add_subparsers(dest="cmd", required=True)
    show = sub.add_parser("show")
    show.add_argument("--json", action="store_true")
    for name in ("rate", "untagged-rate"):
        rate = sub.add_parser(name)
        rate.add_argument("pps", type=int)
        rate.add_argument("burst", type=int, nargs="?", default=0)
    sub.add_parser("reset-rate-state")
    a = ap.parse_args(argv)
    try:
        prog = InvokeSteer.from_pins(a.dir)
    except BpfUnavailable as e:
        print(f"zerolayer.bpf.pinned: {e}", file=sys.stderr)
        return 2
    try:
        if a.cmd == "rate":
            prog.set_rate(a.pps, a.burst)
        elif a.cmd == "untagged-rate":
            prog.set_untagged_rate(a.pps, a.burst)
        elif a.cmd == "reset-rate-state":
            prog.reset_rate_state()
        stats = prog.stats()
        pps, burst = prog.rate()
        u_pps, u_burst = prog.untagged_rate()
        flags, skew_us, _ = prog.auth()
        key_ids = sorted(prog.tag_keys())
        auth = {"key_ids": key_ids, "check_keys": bool(flags & AUTH_KEYS),
                "require_tag": bool(flags & AUTH_REQUIRE_TAG), "skew_us": skew_us}
        ports = sorted(prog.ports())
        state = {"ports": ports, "rate_pps": pps, "burst": burst,
                 "untagged_rate_pps": u_pps, "untagged_burst": u_burst,
                 "packets": stats, "auth": auth}
        if a.cmd == "show" and a.json:
            print(json.dumps(state))
        else:
            print(f"ports {' '.join(map(str, ports)) or '-'}; rate limit "
                  f"{'off' if pps == 0 else f'{pps}/s per source, burst {burst}'}")
            print(f"auth: {len(key_ids)} key id(s), unknown keys "
                  f"{'dropped' if auth['check_keys'] else 'passed'}, untagged "
                  f"{'dropped' if auth['require_tag'] else 'passed'}"
                  f"{'' if auth['require_tag'] or not u_pps else f' up to {u_pps}/s a CPU, burst {u_burst}'}"
                  ", timestamps "
                  f"{f'within {skew_us / 1e6:.0f} s' if skew_us else 'not checked'}")
            for reason in REASONS:
                print(f"  {reason:<22} {stats[reason]}")
    finally:
        prog.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
