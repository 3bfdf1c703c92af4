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
import inspect
import io
import os
import tokenize
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass
class ModelSection:
    path: str = ""                 # GGUF file; "" = the bundled SmolLM2-135M-Instruct Q4_1
    max_seq_len: int = 2048        # context limit per request (prompt + max_tokens)
    threads: int = 0               # kernel threads; 0 = one per CPU of the engine thread (cpu.engine_cpus, else cpus)
    load_timeout_s: float = 900.0  # loading and warming up the model (a first start compiles kernels for about a minute) past this ends the daemon, exit 2, naming the cause; 0 = no limit
    cache_max_bytes: int = 4 << 30  # the repacked-model cache (<cache dir>/models) is pruned to this at start: other runtime versions first, then the least recently used


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
    xdp_untagged_pps: int = 500    # requests without the XDP tag the kernel lets through a second, per receiving CPU, all sources together; 0 = no limit
    xdp_untagged_burst: int = 2000  # untagged requests let through back to back above xdp_untagged_pps
    xdp_pin_dir: str = ""          # pin the program's maps here (a bpffs dir); "" = no pins
    xdp_require_tag: bool = False  # refuse requests without the XDP tag (kernel and daemon)
    rcvbuf_bytes: int = 8 << 20    # a 1 MiB invoke is ~840 datagrams
    busy_poll: bool = False        # spin on the socket instead of sleeping when idle
    batch: int = 64                # datagrams per recvmmsg/sendmmsg call


@dataclass
class EngineSection:
    max_running: int = 16          # sequences decoded together
    max_waiting: int = 256         # held by an engine beyond max_running; beyond: OVERLOADED
    step_tokens: int = 256         # tokens per forward pass (decodes + prompt chunks)
    kv_blocks: int = 0             # KV arena blocks of 64 positions; 0 = 16 full contexts
    queue_depth: int = 64          # admissions handed to the engine thread, not yet taken; beyond: OVERLOADED
    overlap: bool = True           # GPU: stage step N+1 while step N runs (no effect on the CPU)
    speculative: bool = True       # CPU: decode with drafts guessed from each request's own text (n-gram lookup), checked by the model in one pass: the same answers, faster where the answer copies its context; requests may opt out (NO_SPECULATION)
    speculative_max_batch: int = 4  # with speculative: a step drafts only while at most this many requests decode in it; in a bigger batch a checked guess's row costs compute the other rows use, a loss where guesses are rejected (8 streams drafting at any batch: a passage extracted 0.93-0.97x, free stories 0.85-1.01x, a list copied with edits 1.28-1.31x); 0 = any batch
    draft_model: str = ""          # with speculative: a smaller GGUF with the model's own vocabulary (refused at start otherwise) whose greedy continuation is the draft, instead of n-gram lookup; "" = n-gram lookup
    route_slack: int = 4           # several engines: a request goes to the engine that served its prefix unless that one has more than this many requests above the least loaded


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


# gpu/ops/cpu_features.ACT_MODES, named here so that reading a config loads no kernels
# (tests/test_config.py holds the two equal)
CPU_ACTIVATIONS = ("int16", "int8", "int8-qkv16")


@dataclass
class CpuSection:
    cpus: str = ""                 # e.g. "2" or "2-3"; "" = leave affinity alone
    io_cpu: str = ""               # the I/O thread's CPU, e.g. "2"; "" = any of cpus
    engine_cpus: str = ""          # the engine thread and its kernel threads, e.g. "3-5"; "" = any
    sched_fifo: int = 0            # SCHED_FIFO priority 1-99 for the I/O thread; 0 = normal scheduling
    io_runtime_us: int = 0         # SCHED_DEADLINE for the I/O thread: this many µs of CPU each ms ahead of every other thread, then none until the next ms (a flood gets no more); for an I/O thread that shares its CPUs with an engine; 0 = normal scheduling
    switch_interval_us: int = 5000  # the GIL switch interval (sys.setswitchinterval), µs; 5000 = CPython's own: the longest a woken I/O thread waits while the engine thread runs Python between kernels
    activations: str = ""          # the integer CPU kernels' activations: int16 (the F32 model's answers), int8-qkv16 or int8 (faster prefill, llama.cpp's precision: ~97% top-1); "" = the runtime's default, int16


@dataclass
class LifecycleSection:
    drain_timeout_s: float = 30.0  # SIGTERM: finish in-flight requests for at most this long
    drain_linger_s: float = 2.0    # after the last in-flight request ends: keep answering RESEND and keepalives from the result cache this long before exiting
    warmup: bool = True


@dataclass
class ControlSection:
    socket: str = "auto"           # the control socket (ipc, mode 0600); "auto" = $RUNTIME_DIRECTORY/control.sock under systemd, else off; "" = off
    tcp: str = ""                  # also serve remote operators on this ZeroMQ endpoint, e.g. "tcp://10.0.0.5:7434", CURVE-encrypted and only for the keys in curve_dir/clients; "" = off
    curve_dir: str = ""            # server.key_secret and clients/*.key for [control] tcp (zerolayer ctl-keys makes them)
    events: str = ""               # publish request lifecycle events (ZeroMQ PUB, ipc path, mode 0600) for audit and tracing; "" = off
    events_hwm: int = 10000        # events queued for a slow subscriber; beyond: dropped and counted


# -- [shm]: the same-host shared-memory carrier (daemon/carriers/shm_ingress.py) --------------
@dataclass
class ShmSection:
    socket: str = ""               # Unix socket of the same-host shared-memory carrier (docs/PROTOCOL.md); "auto" = $RUNTIME_DIRECTORY/shm.sock under systemd, else off; "" = off
    mode: str = "0660"             # the socket file's permissions (octal): who may connect at all
    group: str = ""                # the socket file's group (members connect with mode 0660); "" = the daemon's
    allowed_uids: str = ""         # also check the peer's uid (SO_PEERCRED), e.g. "0,1001"; both lists "" = anyone the file mode lets in
    allowed_gids: str = ""         # primary gids allowed by SO_PEERCRED, e.g. "1002" (a peer passes if its uid or its gid is listed)
    ring_bytes: int = 1 << 20      # bytes of each ring (requests, responses) per client; a power of two
    max_clients: int = 64          # connections at once; beyond: refused
    poll_us: int = 200             # while the engine is idle, the I/O thread looks at the request rings this long (memory reads, no syscall) before it sleeps: a client's next datagram needs no wake-up; 0 = sleep at once
# -- end [shm] ---------------------------------------------------------------------------------


# -- [[engines]]: several engines in one daemon (docs/OPERATIONS.md "Several engines") -------
@dataclass
class EngineSpec:
    cpus: str = ""                 # the engine thread and its kernel threads, e.g. "0-3"; "" = any
    threads: int = 0               # kernel threads; 0 = [model] threads, else one per CPU of cpus
    device: int = -1               # CUDA device ordinal; -1 = the backend's default device
    kv_blocks: int = 0             # this engine's KV arena; 0 = [engine] kv_blocks


ENGINE_RULES: dict[str, tuple[Any, str]] = {}  # filled below, after the helpers
MAX_ENGINES = 64
# -- end [[engines]] ----------------------------------------------------------------------------


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
    shm: ShmSection = field(default_factory=ShmSection)
    # [[engines]]: a list of tables, not a section; empty = one engine from [cpu]/[engine]/[model]
    engines: list[EngineSpec] = field(default_factory=list)


def sections() -> list:
    """The DaemonConfig fields that are sections (one table of typed settings each): all but
    the engines list."""
    return [f for f in fields(DaemonConfig) if f.name != "engines"]


class ConfigError(ValueError):
    """Every problem found, each naming its setting and where the value came from."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _convert(value: Any, typ: type) -> Any:
    """A value from TOML must already have the setting's type (`port = true` is not 1); one
    from the environment or a flag is text and is parsed strictly."""
    if isinstance(value, str) and typ is not str:
        text = value.strip()
        if typ is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {value!r} (true/false, yes/no, on/off, 1/0)")
        try:
            return typ(text)
        except ValueError:
            raise ValueError(f"not {'an integer' if typ is int else 'a number'}: "
                             f"{value!r}") from None
    if typ is float and type(value) is int:
        return float(value)
    if type(value) is not typ:
        raise ValueError(f"expected {typ.__name__}, got {type(value).__name__} {value!r}")
    return value


def _one_of(*choices: str) -> tuple[Callable[[str], bool], str]:
    return (lambda v: v in choices), f"one of {', '.join(map(repr, choices))}"


def _between(lo: float, hi: float | None = None) -> tuple[Callable[[float], bool], str]:
    if hi is None:
        return (lambda v: v >= lo), f">= {_num(lo)}"
    return (lambda v: lo <= v <= hi), f"in {_num(lo)}..{_num(hi)}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _cpus(v: str) -> bool:
    try:
        parse_cpus(v)
        return True
    except ValueError:
        return False


def _octal_mode(v: str) -> bool:   # [shm] mode
    try:
        return 0 <= int(v, 8) <= 0o777
    except ValueError:
        return False


def _id_list(v: str) -> bool:      # [shm] allowed_uids / allowed_gids
    return all(p.strip().isdigit() for p in v.split(",") if p.strip())


# What each setting may be, beyond its type. A value outside is refused before the model is
# loaded, naming the setting (a negative max_running used to reach READY and hang).
RULES: dict[str, tuple[Any, str]] = {
    "model.max_seq_len": _between(16, 1 << 20),
    "model.threads": _between(0, 1024),
    "model.load_timeout_s": _between(0),
    "model.cache_max_bytes": _between(0),
    "network.port": _between(0, 65535),
    "network.ingress": _one_of("udp", "xdp", "auto"),
    "network.xdp_attach": _one_of("native", "generic", "auto"),
    "network.xsk_mode": _one_of("copy", "zerocopy", "auto"),
    "network.xsk_ring_size": ((lambda v: 64 <= v <= 32768 and v & (v - 1) == 0),
                              "a power of two in 64..32768"),
    "network.xdp_rate_pps": _between(0),
    "network.xdp_rate_burst": _between(0),
    "network.xdp_untagged_pps": _between(0),
    "network.xdp_untagged_burst": _between(0),
    "network.rcvbuf_bytes": _between(65536, 1 << 31),
    "network.batch": _between(1, 1024),
    "engine.max_running": _between(1, 4096),
    "engine.max_waiting": _between(1),
    "engine.step_tokens": _between(1, 1 << 16),
    "engine.kv_blocks": _between(0),
    "engine.queue_depth": _between(1, 1 << 16),
    "engine.route_slack": _between(0, 1 << 20),
    "engine.speculative_max_batch": _between(0, 4096),
    "security.keys_file": ((lambda v: bool(v)), "a path"),
    "security.max_skew_s": _between(1, 86400),
    "security.nonce_capacity": _between(1),
    "security.nonce_per_key": _between(0),
    "cache.ttl_s": _between(0),
    "cache.max_entries": _between(1),
    "cache.max_bytes": _between(1 << 16),
    "cache.lease_s": _between(0.1),
    "metrics.port": _between(0, 65535),
    "cpu.cpus": (_cpus, "a CPU list like \"2\" or \"0,2-3\""),
    "cpu.io_cpu": (_cpus, "a CPU list like \"2\""),
    "cpu.engine_cpus": (_cpus, "a CPU list like \"3-5\""),
    "cpu.sched_fifo": _between(0, 99),
    "cpu.io_runtime_us": _between(0, 900),
    "cpu.switch_interval_us": _between(50, 100_000),
    "cpu.activations": _one_of("", *CPU_ACTIVATIONS),
    "control.events_hwm": _between(1),
    "lifecycle.drain_timeout_s": _between(0),
    "lifecycle.drain_linger_s": _between(0),
    # [shm]
    "shm.mode": (_octal_mode, "an octal file mode like \"0660\""),
    "shm.allowed_uids": (_id_list, "a list of numeric ids like \"0,1001\""),
    "shm.allowed_gids": (_id_list, "a list of numeric ids like \"0,1001\""),
    "shm.ring_bytes": ((lambda v: 1 << 12 <= v <= 1 << 26 and v & (v - 1) == 0),
                       "a power of two in 4096..67108864"),
    "shm.max_clients": _between(1, 4096),
    "shm.poll_us": _between(0, 10_000),
}


ENGINE_RULES.update({
    "cpus": (_cpus, "a CPU list like \"0-3\""),
    "threads": _between(0, 1024),
    "device": _between(-1, 1024),
    "kv_blocks": _between(0),
})


def _types(section_cls: type[DataclassInstance]) -> dict[str, type]:
    hints = {"int": int, "float": float, "str": str, "bool": bool}
    # the annotations are strings (from __future__ import annotations)
    return {f.name: hints[str(f.type)] for f in fields(section_cls)}


def add_flags(ap: argparse.ArgumentParser, comments: dict[str, str] | None = None) -> None:
    """--config and one flag per setting, as text: the loader parses and checks it (so an
    error names its source). `comments`: "section.name" -> its meaning, for --help."""
    ap.add_argument("--config", help="TOML file (default: $ZEROLAYER_CONFIG)")
    ap.add_argument("--engines", dest="engines", default=None, metavar="TOML",
                    help="several engines, as a TOML inline array of tables (overrides "
                         "[[engines]] and $ZEROLAYER_ENGINES), e.g. "
                         "'[{cpus=\"0\", threads=1}, {cpus=\"1\", threads=1}]'")
    for sec in sections():
        g = ap.add_argument_group(f"[{sec.name}]")
        for f in fields(sec.default_factory):
            key = f"{sec.name}.{f.name}"
            rule = RULES.get(key)
            what = (comments or {}).get(key, "")
            extra = f"; {rule[1]}" if rule else ""
            g.add_argument(f"--{sec.name}-{f.name.replace('_', '-')}",
                           dest=f"{sec.name}__{f.name}", default=None,
                           metavar=_types(sec.default_factory)[f.name].__name__.upper(),
                           # argparse %-formats help text: a literal % in a comment is escaped
                           help=f"{what} (default: {f.default!r}{extra})".lstrip().replace("%", "%%"))


def load(args: argparse.Namespace | None = None,
         environ: Mapping[str, str] | None = None) -> DaemonConfig:
    """The configuration from every source, checked: raises ConfigError listing every
    problem (a bad value, an unknown section or setting), each with its source."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    cfg = DaemonConfig()
    path = getattr(args, "config", None) or env.get("ZEROLAYER_CONFIG")
    data: dict[str, dict] = {}
    problems: list[str] = []
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError([f"{path}: {e}"]) from None
        unknown = set(data) - {s.name for s in fields(DaemonConfig)}
        if unknown:
            problems.append(f"{path}: unknown section(s) {sorted(unknown)}")
    for sec in sections():
        obj = getattr(cfg, sec.name)
        types = _types(type(obj))
        table = data.get(sec.name, {})
        if not isinstance(table, dict):
            problems.append(f"{path}: [{sec.name}] must be a table")
            table = {}
        bad = set(table) - set(types)
        if bad:
            problems.append(f"{path}: unknown setting(s) [{sec.name}] {sorted(bad)}")
        for name, typ in types.items():
            value, source = getattr(obj, name), "default"
            if name in table:
                value, source = table[name], f"{path} [{sec.name}] {name}"
            env_name = f"ZEROLAYER_{sec.name}_{name}".upper()
            if env_name in env:
                value, source = env[env_name], f"${env_name}"
            flag = getattr(args, f"{sec.name}__{name}", None) if args is not None else None
            if flag is not None:
                value, source = flag, f"--{sec.name}-{name.replace('_', '-')}"
            try:
                value = _convert(value, typ)
            except ValueError as e:
                problems.append(f"{sec.name}.{name} ({source}): {e}")
                continue
            rule = RULES.get(f"{sec.name}.{name}")
            if rule is not None and not rule[0](value):
                problems.append(f"{sec.name}.{name} ({source}): {value!r} is not {rule[1]}")
                continue
            setattr(obj, name, value)
    cfg.engines = _load_engines(data.get("engines"), path, env,
                                getattr(args, "engines", None) if args is not None else None,
                                problems)
    if cfg.engines and cfg.cpu.engine_cpus:
        problems.append("cpu.engine_cpus and [[engines]] are both set: give each engine its "
                        "own cpus instead")
    if cfg.cpu.io_runtime_us and cfg.cpu.sched_fifo:
        problems.append("cpu.io_runtime_us and cpu.sched_fifo are both set: one scheduling "
                        "policy for the I/O thread")
    if cfg.cpu.io_runtime_us and cfg.network.busy_poll:
        problems.append("cpu.io_runtime_us with network.busy_poll: a spinning I/O thread "
                        "spends its runtime every period and waits out the rest")
    if problems:
        raise ConfigError(problems)
    return cfg


def _load_engines(table, path, environ, flag, problems: list[str]) -> list[EngineSpec]:
    """[[engines]] from the file, or $ZEROLAYER_ENGINES / --engines (a TOML inline array of
    tables, replacing the file's list whole). Every problem names the engine and source."""
    source = f"{path} [[engines]]"
    if flag is not None or "ZEROLAYER_ENGINES" in environ:
        text, source = (flag, "--engines") if flag is not None else (
            environ["ZEROLAYER_ENGINES"], "$ZEROLAYER_ENGINES")
        try:
            table = tomllib.loads(f"engines = {text}")["engines"]
        except tomllib.TOMLDecodeError as e:
            problems.append(f"engines ({source}): not a TOML array of tables: {e}")
            return []
    if table is None:
        return []
    if not isinstance(table, list) or not all(isinstance(t, dict) for t in table):
        problems.append(f"engines ({source}): must be a list of tables ([[engines]])")
        return []
    if len(table) > MAX_ENGINES:
        problems.append(f"engines ({source}): {len(table)} engines, at most {MAX_ENGINES}")
        return []
    out: list[EngineSpec] = []
    types = _types(EngineSpec)
    for i, t in enumerate(table):
        spec = EngineSpec()
        bad = set(t) - set(types)
        if bad:
            problems.append(f"engines[{i}] ({source}): unknown setting(s) {sorted(bad)}")
        for name, typ in types.items():
            if name not in t:
                continue
            try:
                value = _convert(t[name], typ)
            except ValueError as e:
                problems.append(f"engines[{i}].{name} ({source}): {e}")
                continue
            ok, what = ENGINE_RULES[name]
            if not ok(value):
                problems.append(f"engines[{i}].{name} ({source}): {value!r} is not {what}")
                continue
            setattr(spec, name, value)
        out.append(spec)
    seen: dict[int, int] = {}
    for i, spec in enumerate(out):  # two engines' OpenMP teams on one CPU: each halves the other
        for cpu in (parse_cpus(spec.cpus) if spec.cpus else ()):
            if cpu in seen:
                problems.append(f"engines[{i}].cpus ({source}): CPU {cpu} is "
                                f"engines[{seen[cpu]}]'s too; engines' CPUs must not overlap")
                break
            seen[cpu] = i
    return out


def parse_cpus(spec: str) -> set[int]:
    """'2', '2-3', '0,2-3' -> a CPU set."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def setting_comments() -> dict[str, str]:
    """"section.name" -> the `# comment` on its line above: the meaning of each setting,
    for --help and for the settings table in docs/OPERATIONS.md (scripts/settings_table.py)."""
    out: dict[str, str] = {}
    for sec in sections():
        src = inspect.getsource(sec.default_factory)
        line_name: dict[int, str] = {}
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.NAME and tok.start[1] == 4 and tok.start[0] not in line_name:
                line_name[tok.start[0]] = tok.string
            if tok.type == tokenize.COMMENT and tok.start[0] in line_name:
                out[f"{sec.name}.{line_name[tok.start[0]]}"] = tok.string.lstrip("# ").strip()
    return out


def as_dict(cfg: DaemonConfig) -> dict:
    return dataclasses.asdict(cfg)
