"""zerolayerd configuration: one dataclass per concern, assembled into DaemonConfig.

Sources, lowest to highest precedence (each overrides the one before):
  1. the defaults below
  2. the TOML file (--config PATH, or $ZEROLAYER_CONFIG): [model] [network] [engine] ...
  3. environment variables ZEROLAYER_<SECTION>_<FIELD>, e.g. ZEROLAYER_NETWORK_PORT=7000
  4. command-line flags --<section>-<field>, e.g. --network-port 7000
docs/OPERATIONS.md lists every setting; `zerolayerd --help` prints them with their defaults.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class ModelSection:
    path: str = ""                 # GGUF file; "" = the bundled SmolLM2-135M-Instruct Q4_1
    max_seq_len: int = 2048        # context limit per request (prompt + max_tokens)
    threads: int = 0               # kernel threads; 0 = one per CPU of the engine thread (cpu.engine_cpus, else cpus)


@dataclass
class NetworkSection:
    host: str = "127.0.0.1"
    port: int = 7433
    ingress: str = "udp"           # udp | xdp | auto (xdp when it can be set up, else udp)
    interface: str = ""            # device the XDP program attaches to (xdp/auto)
    xdp_attach: str = "auto"       # XDP attach mode: native | generic | auto
    xsk_mode: str = "auto"         # AF_XDP bind: copy | zerocopy | auto
    xsk_ring_size: int = 2048      # entries per AF_XDP ring (a power of two)
    xdp_rate_pps: int = 0          # per-source datagrams/s enforced in the kernel; 0 = off
    xdp_rate_burst: int = 0        # per-source burst allowed above xdp_rate_pps
    xdp_pin_dir: str = ""          # pin the program's maps here (a bpffs dir); "" = no pins
    rcvbuf_bytes: int = 8 << 20    # a 1 MiB invoke is ~840 datagrams
    busy_poll: bool = False        # spin on the socket instead of sleeping when idle
    batch: int = 64                # datagrams per recvmmsg/sendmmsg call


@dataclass
class EngineSection:
    max_running: int = 16          # sequences decoded together
    max_waiting: int = 256         # admitted but not yet running; beyond: OVERLOADED
    step_tokens: int = 256         # tokens per forward pass (decodes + prompt chunks)
    kv_blocks: int = 0             # KV arena blocks of 64 positions; 0 = 16 full contexts
    queue_depth: int = 64          # admissions handed to the engine thread, not yet taken; beyond: OVERLOADED
    overlap: bool = True           # GPU: stage step N+1 while step N runs (no effect on the CPU)


@dataclass
class SecuritySection:
    keys_file: str = "/etc/zerolayer/keys"
    max_skew_s: float = 300.0
    nonce_capacity: int = 500_000
    nonce_per_key: int = 0         # live nonces one key may hold; 0 = half of nonce_capacity


@dataclass
class CacheSection:
    ttl_s: float = 300.0           # idempotency window for request ids
    max_entries: int = 65_536
    max_bytes: int = 256 << 20
    lease_s: float = 10.0          # a running request whose client is silent this long is cancelled


@dataclass
class MetricsSection:
    host: str = "127.0.0.1"
    port: int = 9433               # 0 = no metrics endpoint


@dataclass
class CpuSection:
    cpus: str = ""                 # e.g. "2" or "2-3"; "" = leave affinity alone
    io_cpu: str = ""               # the I/O thread's CPU, e.g. "2"; "" = any of cpus
    engine_cpus: str = ""          # the engine thread and its kernel threads, e.g. "3-5"; "" = any
    sched_fifo: int = 0            # SCHED_FIFO priority 1-99 for the I/O thread; 0 = normal scheduling


@dataclass
class LifecycleSection:
    drain_timeout_s: float = 30.0  # SIGTERM: finish in-flight requests for at most this long
    drain_linger_s: float = 2.0    # after the last in-flight request ends: keep answering RESEND and keepalives from the result cache this long before exiting
    warmup: bool = True


@dataclass
class ControlSection:
    socket: str = "auto"           # the control socket (ipc, mode 0600); "auto" = $RUNTIME_DIRECTORY/control.sock under systemd, else off; "" = off


@dataclass
class DaemonConfig:
    model: ModelSection = field(default_factory=ModelSection)
    network: NetworkSection = field(default_factory=NetworkSection)
    engine: EngineSection = field(default_factory=EngineSection)
    security: SecuritySection = field(default_factory=SecuritySection)
    cache: CacheSection = field(default_factory=CacheSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    cpu: CpuSection = field(default_factory=CpuSection)
    lifecycle: LifecycleSection = field(default_factory=LifecycleSection)
    control: ControlSection = field(default_factory=ControlSection)


def _convert(value: Any, typ: type) -> Any:
    if typ is bool and isinstance(value, str):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {value!r}")
    return typ(value)


def _types(section_cls) -> dict[str, type]:
    hints = {"int": int, "float": float, "str": str, "bool": bool}
    return {f.name: hints[f.type] for f in fields(section_cls)}


def add_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config", help="TOML file (default: $ZEROLAYER_CONFIG)")
    for sec in fields(DaemonConfig):
        for f in fields(sec.default_factory):
            typ = _types(sec.default_factory)[f.name]
            ap.add_argument(f"--{sec.name}-{f.name.replace('_', '-')}", dest=f"{sec.name}__{f.name}",
                            type=(lambda v, t=typ: _convert(v, t)), default=None,
                            help=f"default: {f.default!r}")


def load(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> DaemonConfig:
    environ = os.environ if environ is None else environ
    cfg = DaemonConfig()
    path = getattr(args, "config", None) or environ.get("ZEROLAYER_CONFIG")
    data: dict[str, dict] = {}
    if path:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        unknown = set(data) - {s.name for s in fields(DaemonConfig)}
        if unknown:
            raise ValueError(f"{path}: unknown section(s) {sorted(unknown)}")
    for sec in fields(DaemonConfig):
        obj = getattr(cfg, sec.name)
        types = _types(type(obj))
        table = data.get(sec.name, {})
        bad = set(table) - set(types)
        if bad:
            raise ValueError(f"{path}: unknown setting(s) [{sec.name}] {sorted(bad)}")
        for name, typ in types.items():
            value = table.get(name, getattr(obj, name))
            env = environ.get(f"ZEROLAYER_{sec.name}_{name}".upper())
            if env is not None:
                value = env
            flag = getattr(args, f"{sec.name}__{name}", None) if args is not None else None
            if flag is not None:
                value = flag
            setattr(obj, name, _convert(value, typ))
    return cfg


def parse_cpus(spec: str) -> set[int]:
    """'2', '2-3', '0,2-3' -> a CPU set."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def as_dict(cfg: DaemonConfig) -> dict:
    return dataclasses.asdict(cfg)
