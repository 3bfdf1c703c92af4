"""The flood's two load generators, each run from the sender's namespace, pinned to one CPU
at the lowest priority, and bounded both in count and in time: netsniff-ng's trafgen for UDP
junk, wrk for HTTP requests with a wrong API key.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# per rate, how many packets at most: the rate times the time bound (a ceiling run is bounded
# by this many per second, far above what one sender core reaches on veth)
CEILING_PPS_BOUND = 5_000_000

WRK_SCRIPT = r"""
-- requests with a wrong API key; each connection waits `gap_ms` between its requests (wrk
-- paces per connection), and the thread stops after `limit` responses
wrk.method = "POST"
wrk.body = '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(key)s"
local gap_ms, limit, n = %(gap_ms)s, %(limit)d, 0
if gap_ms > 0 then
  function delay() return gap_ms end
end
function response(status, headers, body)
  n = n + 1
  if n >= limit then wrk.thread:stop() end
end
"""


def rate_pps(rate: str) -> int | None:
    """'10000' -> 10000; 'max' -> None (the sender's ceiling: no pacing)."""
    return None if rate == "max" else int(rate)


@dataclass
class SenderResult:
    sent: int            # packets (trafgen) or requests completed (wrk)
    seconds: float       # the sender's own time on the wire
    output: str

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0


class Sender:
    """A running generator: started in `ns`, stopped (SIGINT, so it prints its own count) by
    stop(); `bound_s` ends it anyway if stop() never comes. Nice 19: the legitimate clients
    that share its CPU run first, so the flood does not delay them on the client's side.

    `workers`: how many processes named cmd[0] the generator ends with. trafgen pins each of
    its workers itself, the first to CPU 0 whatever the taskset it started under (its -P
    counts workers, it cannot place them), so they are moved back to `cpu` once they exist."""

    def __init__(self, ns: str, cpu: int, cmd: list[str], bound_s: float, log: Path,
                 workers: int = 0):
        self.log = log
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, "timeout", "-s", "INT", "-k", "5", f"{bound_s:.0f}",
             "taskset", "-c", str(cpu), "nice", "-n", "19", *cmd],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if workers:
            pin_workers(self.proc, Path(cmd[0]).name, workers, cpu)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)   # to `ip netns exec`, which exec'd timeout
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text()


def parents() -> dict[int, int]:
    """Every process's parent, from /proc/PID/stat."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:      # gone meanwhile
                continue
            out[int(d)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return out


def proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def workers_of(root: int, name: str) -> list[int]:
    """The processes called `name` below `root` whose parent is called `name` too: a
    generator's forked workers, not the generator itself."""
    ppid = parents()
    below, todo = [], [root]
    while todo:
        parent = todo.pop()
        kids = [c for c, pp in ppid.items() if pp == parent]
        below += kids
        todo += kids
    return [p for p in below if proc_name(p) == name and proc_name(ppid.get(p, 0)) == name]


def pin_workers(root: subprocess.Popen, name: str, workers: int, cpu: int,
                wait_s: float = 10.0, hold_s: float = 0.3) -> None:
    """Wait until `workers` processes called `name`, each the child of one called `name`, run
    below `root`; then keep them on `cpu` for `hold_s` (a worker pins itself right after its
    fork: a pin set before that would be undone). A generator that has already ended needs
    nothing."""
    deadline = time.monotonic() + wait_s
    while True:
        mine = workers_of(root.pid, name)
        if len(mine) >= workers:
            break
        if root.poll() is not None:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(mine)} of {workers} {name} workers to pin to CPU {cpu} "
                               f"within {wait_s:.0f} s")
        time.sleep(0.01)
    until = time.monotonic() + hold_s
    while time.monotonic() < until:
        for p in mine:
            try:
                if os.sched_getaffinity(p) != {cpu}:
                    os.sched_setaffinity(p, {cpu})
            except OSError:       # exited meanwhile
                pass
        time.sleep(0.01)


def trafgen(ns: str, dev: str, cpu: int, config: Path, rate: str, bound_s: float,
            log: Path, count: int | None = None) -> Sender:
    """trafgen on one CPU (-P 1), leaving the host's socket-memory sysctls and IRQ affinity
    alone (--no-sock-mem, --notouch-irq: its defaults change both, machine-wide). A paced rate
    uses its slow mode (-b NNNpps); the ceiling its TX ring at full speed. `count`: packets
    to send at most (default: the rate times the time bound)."""
    pps = rate_pps(rate)
    if count is None:
        count = int((pps or CEILING_PPS_BOUND) * bound_s)
    cmd = ["trafgen", "-o", dev, "-i", str(config), "-P", "1", "-n", str(count),
           "--no-sock-mem", "--notouch-irq"]
    if pps is not None:
        cmd += ["-b", f"{pps}pps"]
    return Sender(ns, cpu, cmd, bound_s, log, workers=1)


def parse_trafgen(out: str) -> SenderResult:
    """trafgen's exit summary: 'N packets outgoing' and 'S sec, U usec on CPUk (...)'."""
    sent = re.search(r"(\d+) packets outgoing", out)
    took = re.search(r"(\d+) sec,\s+(\d+) usec on CPU", out)
    return SenderResult(int(sent.group(1)) if sent else 0,
                        int(took.group(1)) + int(took.group(2)) / 1e6 if took else 0.0, out)


def wrk(ns: str, cpu: int, url: str, api_key: str, rate: str, bound_s: float, tmp: Path,
        log: Path, connections: int = 64) -> Sender:
    pps = rate_pps(rate)
    gap_ms = connections * 1000 / pps if pps else 0
    script = tmp / "wrong_key.lua"
    script.write_text(WRK_SCRIPT % {"key": api_key, "gap_ms": f"{gap_ms:.3f}",
                                    "limit": int((pps or CEILING_PPS_BOUND) * bound_s)})
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{bound_s:.0f}s", "--timeout", "2s",
           "-s", str(script), url]
    return Sender(ns, cpu, cmd, bound_s + 5, log)


def parse_wrk(out: str) -> SenderResult:
    """wrk's summary: 'N requests in T.TTs' (responses of any status)."""
    m = re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)", out)
    if not m:
        return SenderResult(0, 0.0, out)
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(3)]
    return SenderResult(int(m.group(1)), float(m.group(2)) * scale, out)
