"""Compile invoke_steer with BCC in a short-lived helper process, and hand the loaded program
and its maps back as file descriptors.

BCC brings LLVM/clang into the process that compiles: measured here, a compile takes ~0.7 s
and the process stays ~125 MB larger afterwards (libbcc's LLVM pages, the compiler's heap),
for the life of the daemon, to use a 400-instruction program. So the daemon does not
compile: it starts `python -m zerolayer.bpf.compile_helper` with one end of a socketpair, the
helper compiles and loads the program (the kernel verifies it there), sends the program fd
and the five map fds over the socket (SCM_RIGHTS) with a JSON description, and exits. The
kernel objects live on through the daemon's copies of the fds; the daemon drives the maps
through bpf(2) (bpf/bpf_maps.py) and never imports BCC.

    prog = compile_isolated(ports=[7433])      # an InvokeSteer, same API as compile()
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping

from .loader import MAP_NAMES, BpfUnavailable, CompileStats, InvokeSteer

MAX_FDS = 1 + len(MAP_NAMES)


def compile_isolated(*, ports: Iterable[int] = (), rate_pps: int = 0, burst: int = 0,
                     defines: Mapping[str, int] | None = None,
                     timeout_s: float = 60.0) -> InvokeSteer:
    """InvokeSteer.compile() in a helper process; raises BpfUnavailable with its reason."""
    args = {"ports": sorted(int(p) for p in ports), "rate_pps": int(rate_pps), "burst": int(burst),
            "defines": dict(defines or {})}
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with parent:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "zerolayer.bpf.compile_helper", str(child.fileno()),
                 json.dumps(args)], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        finally:
            child.close()
        parent.settimeout(timeout_s)
        try:
            msg, fds, _, _ = socket.recv_fds(parent, 1 << 16, MAX_FDS)
        except (TimeoutError, OSError) as e:
            proc.kill()
            raise BpfUnavailable(f"BCC helper gave no program: {e}") from e
        finally:
            try:
                _, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
    if not msg:
        for fd in fds:
            os.close(fd)
        raise BpfUnavailable(f"BCC helper failed (exit {proc.returncode}): {err.strip()[-2000:]}")
    meta = json.loads(msg)
    if "error" in meta or len(fds) != MAX_FDS:
        for fd in fds:
            os.close(fd)
        raise BpfUnavailable(meta.get("error", f"BCC helper sent {len(fds)} fds"))
    prog = InvokeSteer.from_fds(fds[0], dict(zip(meta["maps"], fds[1:])),
                                CompileStats(**meta["stats"]), meta["defines"])
    prog.helper_rss_bytes = meta.get("rss_bytes", 0)
    return prog


def _main(sock_fd: int, args_json: str) -> int:
    """The helper's side: compile, send the fds, exit (the fds stay valid in the receiver)."""
    args = json.loads(args_json)
    with socket.socket(fileno=sock_fd) as s:
        try:
            prog = InvokeSteer.compile(ports=args["ports"], rate_pps=args["rate_pps"],
                                       burst=args["burst"], defines=args["defines"])
        except Exception as e:  # noqa: BLE001 - every failure goes back as text
            s.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
            return 1
        st = prog.compile_stats
        with open("/proc/self/status") as f:
            rss = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
        meta = {"maps": list(MAP_NAMES), "defines": prog.defines, "rss_bytes": rss,
                "stats": {"seconds": st.seconds, "maxrss_delta_bytes": st.maxrss_delta_bytes,
                          "instructions": st.instructions}}
        fds = [prog.fd] + [prog.table(name).fd for name in MAP_NAMES]
        socket.send_fds(s, [json.dumps(meta).encode()], fds)
    return 0


if __name__ == "__main__":
    sys.exit(_main(int(sys.argv[1]), sys.argv[2]))
