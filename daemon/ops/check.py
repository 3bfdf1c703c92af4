"""`zerolayerd --check`: the dry run. Everything a start needs, checked without serving.

    zerolayerd --config /etc/zerolayer/zerolayerd.toml --check

In order, going on after a failure so that one run lists every problem:
  1. the configuration: every value typed and range-checked, each error naming the setting
     and its source (file, $ZEROLAYER_..., --flag) (config.load);
  2. the addresses: the UDP and metrics hosts resolve (nothing is bound: the daemon being
     checked may be running); with [[engines]], each engine's CPUs are the daemon's to use;
  3. the keys file: its mode, owner and lines (auth.KeyStore, as the daemon loads it);
  4. the model and its tokenizer: loaded, a chat prompt tokenized, one forward pass (the
     warm-up's dummy prefill and decode step); [engine] draft_model loaded, its vocabulary
     compared with the model's, one draft pass;
  5. with [network] ingress = "xdp" or "auto": the XDP program compiled and loaded through
     the kernel's verifier in a helper process, never attached.
Prints one line per check and exits 0, or 2 with every problem listed (the exit code the
daemon uses for a configuration it refuses; the unit's RestartPreventExitStatus=2).
"""
from __future__ import annotations

import argparse
import socket
import time
from collections.abc import Callable

from .. import config as config_mod

EXIT_OK, EXIT_BAD = 0, 2


def run(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    problems: list[str] = []

    def step(name: str, fn: Callable[[], str]) -> None:
        t0 = time.perf_counter()
        try:
            detail = fn()
        except config_mod.ConfigError as e:
            problems.extend(e.problems)
            for p in e.problems:
                out(f"FAIL {name}: {p}")
            return
        except Exception as e:  # noqa: BLE001 - a check reports, it never crashes
            problems.append(f"{name}: {type(e).__name__}: {e}")
            out(f"FAIL {name}: {type(e).__name__}: {e}")
            return
        out(f"ok   {name}: {detail} ({time.perf_counter() - t0:.2f} s)")

    cfg: list[config_mod.DaemonConfig] = []

    def check_config() -> str:
        cfg.append(config_mod.load(args))
        src = getattr(args, "config", None) or "defaults, environment and flags"
        return f"valid ({src})"

    step("config", check_config)
    if not cfg:
        out(f"{len(problems)} problem(s); nothing else checked without a valid configuration")
        return EXIT_BAD
    c = cfg[0]

    def check_addresses() -> str:
        for what, host, port in (("network", c.network.host, c.network.port),
                                 ("metrics", c.metrics.host, c.metrics.port)):
            try:
                socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
            except socket.gaierror as e:
                raise ValueError(f"[{what}] host {host!r} does not resolve: {e}") from None
        return f"udp {c.network.host}:{c.network.port}, metrics {c.metrics.host}:{c.metrics.port}"

    def check_keys() -> str:
        from ..auth import KeyStore
        keys = KeyStore(c.security.keys_file)
        return f"{c.security.keys_file}: {len(keys)} key(s)"

    def check_model() -> str:
        from zerolayer.gpu.generate import Generator
        gen = Generator.load(c.model.path or None, threads=c.model.threads or None,
                             max_seq_len=c.model.max_seq_len, kv_blocks=c.engine.kv_blocks or None,
                             warmup=True)
        from .. import fault_hooks
        fault_hooks.after_warmup()
        ids = gen.tokenizer.encode_chat([{"role": "user", "content": "Hello"}])
        m = gen.model.cfg
        draft = ""
        if c.engine.draft_model and c.engine.speculative:  # ConfigError: listed as such
            from ..startup import load_drafter
            load_drafter(c.engine.draft_model, gen.model, 1, True, lambda *a: None)
            draft = f"; draft model {c.engine.draft_model}: same vocabulary, forward pass ok"
        return (f"{m.n_layer} layers, vocab {m.vocab}, context {gen.model.max_seq_len}; "
                f"chat template ok ({len(ids)} tokens); forward pass ok{draft}")

    def check_xdp() -> str:
        from zerolayer.bpf.compile_helper import compile_isolated
        prog = compile_isolated(ports=[c.network.port or 7433], rate_pps=c.network.xdp_rate_pps,
                                burst=c.network.xdp_rate_burst)
        try:
            n = prog.compile_stats.instructions
        finally:
            prog.close()
        return f"loaded through the verifier ({n} instructions), not attached"

    def check_engines() -> str:
        from ..engines import cpu_problems
        bad = cpu_problems(c)
        if bad:
            raise config_mod.ConfigError(bad)
        return f"{len(c.engines)} engines, CPUs " + ", ".join(
            repr(e.cpus or "any") for e in c.engines)

    step("addresses", check_addresses)
    if c.engines:
        step("engines", check_engines)
    step("keys", check_keys)
    step("model", check_model)
    if c.network.ingress in ("xdp", "auto"):
        step("xdp", check_xdp)
    if problems:
        out(f"{len(problems)} problem(s)")
        return EXIT_BAD
    out("all checks passed")
    return EXIT_OK
