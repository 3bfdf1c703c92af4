"""The client side of tests/test_systemd_unit.py, run inside the systemd container with the
image's own SDK (/opt/zerolayer/.venv): the daemons there listen on the container's loopback.
Prints one JSON line.

  invoke PORT KEY_ID MAX_TOKENS   one streamed invoke with the keys file's key KEY_ID ("last":
                                  the newest well-formed line)
  whole PORT KEY_ID MAX_TOKENS    one invoke, the text only at the end (a restart under it is
                                  replayed by the SDK, where a stream's caller would see it)
  running METRICS_PORT            zerolayer_requests_running and _waiting, from the metrics
                                  endpoint
  ping PORT KEY_ID                one authenticated ping
  loop PORTS STOP_FILE            invokes to each port in turn, over and over, until STOP_FILE
                                  exists: how many completed, and every failure
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import urllib.request

from zerolayer.client import Client

KEYS = "/etc/zerolayer/keys"
COUNT = "Count from one to one thousand: one, two, three,"


def key(key_id: str) -> tuple[int, str]:
    lines = [ln.split() for ln in open(KEYS) if re.match(r"\d+ [0-9a-f]+$", ln.strip())]
    if key_id == "last":
        return int(lines[-1][0]), lines[-1][1]
    return next((int(k), s) for k, s in lines if k == key_id)


def client(port: int, key_id: str = "last", timeout: float = 150) -> Client:
    kid, secret = key(key_id)
    return Client(("127.0.0.1", port), kid, secret, timeout=timeout)


def invoke(port: int, key_id: str, max_tokens: int) -> dict:
    s = client(port, key_id).stream(COUNT, max_tokens=max_tokens)
    text = "".join(s)
    r = s.result
    return {"text": text, "finish_reason": r.finish_reason, "attempts": r.attempts,
            "tokens": r.usage.completion_tokens, "restarts": r.restarts}


def loop(ports: list[int], stop_file: str) -> dict:
    done: list[int] = []
    failed: list[str] = []

    def one_port(port: int) -> None:
        c = client(port)
        while not os.path.exists(stop_file):
            try:
                assert c.invoke(COUNT, max_tokens=6).text
                done.append(port)
            except Exception as e:  # noqa: BLE001 - every failure is reported, none hidden
                failed.append(f"{port}: {e!r}")
            time.sleep(0.05)
    threads = [threading.Thread(target=one_port, args=(p,)) for p in ports for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"completed": len(done), "per_port": {p: done.count(p) for p in ports},
            "failed": failed}


def main(argv: list[str]) -> None:
    cmd = argv[0]
    if cmd == "invoke":
        out = invoke(int(argv[1]), argv[2], int(argv[3]))
    elif cmd == "whole":
        r = client(int(argv[1]), argv[2]).invoke(COUNT, max_tokens=int(argv[3]))
        out = {"text": r.text, "finish_reason": r.finish_reason, "restarts": r.restarts}
    elif cmd == "running":
        text = urllib.request.urlopen(f"http://127.0.0.1:{argv[1]}/metrics", timeout=5).read()
        out = {}
        for name in ("running", "waiting"):
            m = re.search(rb"^zerolayer_requests_" + name.encode() + rb" ([0-9.e+-]+)$", text, re.M)
            out[name] = float(m[1]) if m else 0.0
    elif cmd == "ping":
        out = {"rtt": client(int(argv[1]), argv[2], timeout=10).ping()}
    elif cmd == "loop":
        out = loop([int(p) for p in argv[1].split(",")], argv[2])
    else:
        raise SystemExit(f"unknown command {cmd}")
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
