"""Build, load and drive the invoke_steer XDP program through BCC.

    prog = InvokeSteer.compile(ports=[7433])          # BCC here: ~0.7 s, ~125 MB that stay
    prog = compile_helper.compile_isolated(ports=[7433])  # BCC in a helper; fds come back
    prog.set_rate(rate_pps=1000, burst=64)            # 0 = off
    link = prog.attach("eth0", mode="native")         # a bpf_link: gone when its fd closes
    prog.register_xsk(queue=0, fd=xsk.fileno())       # the daemon's AF_XDP socket
    prog.stats()                                      # {"redirect": 12, "drop_bad_magic": 3, ...}
    prog.close()

What lives where: the C program and its headers are next to this file (invoke_steer.c;
invoke_consts.h holds the -D overridable settings and the stats reasons); the protocol's
numbers come from wire_consts.py, rendered into the source as zl_wire_consts.h. BCC's
rewriter only turns `map.lookup()` calls into map-fd loads in the *main* file, so the loader
pastes the local `#include "..."` headers into one source text (with #line markers, so
compiler errors still name the right header and line) before compiling. System headers
(`<linux/ip.h>`) come from /lib/modules/$(uname -r)/build, which scripts/install-bcc.sh
provides.

This module never imports zerolayer.daemon. The protocol's numbers come from
zerolayer.protocol.wire_consts, the protocol package every room builds on (the SDK, the
daemon's parser and this program all read the same file).

Only bcc (Debian's python3-bpfcc) and the kernel's bpf(2) are needed. BCC is used to compile
and load, nothing else: maps are driven through bpf(2) (bpf_maps.RawMap), and the syscalls
BCC's Python API lacks (BPF_PROG_TEST_RUN, BPF_LINK_CREATE, BPF_OBJ_PIN) are made through
ctypes, so a program adopted by fd (InvokeSteer.from_fds) works without BCC loaded.
"""
from __future__ import annotations

import ctypes
import os
import platform
import re
import resource
import socket
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from zerolayer.protocol import wire_consts
from zerolayer.protocol.errors import ErrorCode

from .bpf_maps import RawMap, bpf

if TYPE_CHECKING:
    import bcc

BPF_DIR = Path(__file__).resolve().parent
SOURCE = BPF_DIR / "invoke_steer.c"
FUNC_NAME = "invoke_steer"

# Per-CPU stats array indices: enum zl_stat in invoke_consts.h, same order (a test checks).
REASONS: tuple[str, ...] = (
    "pass_other",
    "redirect",
    "pass_no_xsk",
    "drop_truncated",
    "drop_ip_fragment",
    "drop_bad_magic",
    "drop_bad_version",
    "drop_bad_type",
    "drop_bad_length",
    "drop_bad_header_len",
    "drop_bad_flags",
    "drop_bad_fragment",
    "drop_bad_field",
    "drop_rate_limited",
    "drop_unknown_key",
    "drop_bad_tag",
    "drop_untagged",
    "drop_stale_timestamp",
    "drop_untagged_budget",
)

# The error class the daemon would answer for what each drop reason refuses (docs/PROTOCOL.md
# §10): the kernel drops only what user space refuses anyway, and for the same reason. The
# two rate limits are the exception, load shedding with no error to answer.
RATE_REASONS = ("drop_rate_limited", "drop_untagged_budget")
REASON_ERROR: dict[str, ErrorCode] = {
    **{r: ErrorCode.MALFORMED for r in REASONS
       if r.startswith("drop_") and r not in (*RATE_REASONS, "drop_unknown_key",
                                              "drop_bad_tag", "drop_untagged",
                                              "drop_stale_timestamp")},
    "drop_unknown_key": ErrorCode.UNKNOWN_KEY,
    "drop_bad_tag": ErrorCode.INVALID_SIGNATURE,
    "drop_untagged": ErrorCode.INVALID_SIGNATURE,
    "drop_stale_timestamp": ErrorCode.INVALID_TIMESTAMP,
}

# Protocol constants the program checks: one source, protocol/wire_consts.py (protocol/wire.py
# imports the same dict); source_text() renders them as the header zl_wire_consts.h.
WIRE = wire_consts.WIRE
GENERATED = {"zl_wire_consts.h": wire_consts.c_header}

# Compile-time settings (invoke_consts.h defaults); compile(defines=...) overrides them.
DEFAULTS: dict[str, int] = {
    "ZL_MAX_PORTS": 16,
    "ZL_MAX_QUEUES": 64,
    "ZL_RATE_SOURCES": 65536,
    "ZL_RATE_LIMIT": 1,
    "ZL_VALIDATE_FRAGMENT": 1,
    "ZL_MAX_KEYS": 4096,
    "ZL_AUTH": 1,
}

# zl_auth_cfg.flags (invoke_consts.h).
AUTH_KEYS = 1           # zl_keys holds every key id in use: requests under another are dropped
AUTH_REQUIRE_TAG = 2    # requests without the XDP tag are dropped

# XDP actions (uapi/linux/bpf.h enum xdp_action).
XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = range(5)
ACTION_NAMES = {XDP_ABORTED: "aborted", XDP_DROP: "drop", XDP_PASS: "pass", XDP_TX: "tx",
                XDP_REDIRECT: "redirect"}

# bpf(2) commands and constants used here (uapi/linux/bpf.h, uapi/linux/if_link.h).
_BPF_OBJ_PIN = 6
_BPF_PROG_TEST_RUN = 10
_BPF_LINK_CREATE = 28
_BPF_XDP_ATTACH_TYPE = 37               # enum bpf_attach_type BPF_XDP
XDP_FLAGS_SKB_MODE = 1 << 1             # "generic": after the skb is built, any driver
XDP_FLAGS_DRV_MODE = 1 << 2             # "native": in the driver, before the skb
_MODES = {"auto": 0, "generic": XDP_FLAGS_SKB_MODE, "skb": XDP_FLAGS_SKB_MODE,
          "native": XDP_FLAGS_DRV_MODE, "drv": XDP_FLAGS_DRV_MODE}
_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
_BPF_FS_MAGIC = 0xCAFE4A11

_DEFINE_NAME = re.compile(r"ZL_[A-Z0-9_]+\Z")
_LOCAL_INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')

_libc = ctypes.CDLL(None, use_errno=True)
MAP_NAMES = ("zl_ports", "zl_xsks", "zl_stats", "zl_rate_cfg", "zl_rate_state",
             "zl_untagged_state", "zl_keys", "zl_auth_cfg")
SECRET_MAPS = ("zl_keys",)     # key material: pinned mode 0600
_TAG_KEY = struct.Struct("=QQQQII")    # struct zl_tag_key
_AUTH_CFG = struct.Struct("=QQII")     # struct zl_auth_cfg
_RATE_PER_SOURCE, _RATE_UNTAGGED = 0, 1   # zl_rate_cfg entries (invoke_consts.h)


class BpfUnavailable(RuntimeError):
    """BCC or kernel support is missing: the caller falls back to the UDP path."""


def _bpf(cmd: int, attr: ctypes.Array) -> int:
    if _SYS_BPF is None:
        raise BpfUnavailable(f"bpf(2) syscall number unknown on {platform.machine()}")
    return bpf(cmd, attr)


def source_text(main: Path = SOURCE) -> str:
    """The program as one translation unit: local "..." includes pasted in once each (they
    all have include guards anyway), <...> includes left for the compiler."""
    seen: set[Path] = set()
    generated: set[str] = set()

    def inline(path: Path) -> str:
        path = path.resolve()
        if path in seen:
            return ""
        seen.add(path)
        out = [f'#line 1 "{path.name}"\n']
        for lineno, line in enumerate(path.read_text().splitlines(keepends=True), 1):
            m = _LOCAL_INCLUDE.match(line)
            if m and m.group(1) in GENERATED:
                if m.group(1) not in generated:
                    generated.add(m.group(1))
                    out.append(f'#line 1 "{m.group(1)}"\n' + GENERATED[m.group(1)]())
                out.append(f'#line {lineno + 1} "{path.name}"\n')
            elif m:
                out.append(inline(path.parent / m.group(1)))
                out.append(f'#line {lineno + 1} "{path.name}"\n')
            else:
                out.append(line)
        return "".join(out)

    return inline(main)


def header_defines(header: Path | str) -> dict[str, int]:
    """`#define NAME <integer>` lines of a header file (or of its text), for tests."""
    text = header.read_text() if isinstance(header, Path) else header
    out = {}
    for m in re.finditer(r"^#define\s+(ZL_[A-Z0-9_]+)\s+(\S+)", text, re.M):
        value = m.group(2).rstrip("uUlL")
        try:
            out[m.group(1)] = int(value, 0)
        except ValueError:
            if value in out:            # #define A B, B defined above
                out[m.group(1)] = out[value]
    return out


@dataclass(frozen=True)
class CompileStats:
    seconds: float          # wall time of BCC's compile + verifier load
    maxrss_delta_bytes: int  # growth of this process's peak RSS during it (0 if not a new peak)
    instructions: int       # size of the loaded program


@dataclass
class RunResult:
    """One BPF_PROG_TEST_RUN: the action, and the frame as the program left it."""
    action: int
    data: bytes
    duration_ns: int

    @property
    def action_name(self) -> str:
        return ACTION_NAMES.get(self.action, str(self.action))


@dataclass
class XdpLink:
    """An XDP attachment held by a bpf_link fd: closing it (or the process dying) detaches."""
    fd: int
    ifname: str
    ifindex: int
    mode: str
    closed: bool = field(default=False)

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
            self.closed = True

    def __enter__(self) -> XdpLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InvokeSteer:
    """The compiled and loaded program, with its maps. Use InvokeSteer.compile() (BCC in this
    process) or bpf.compile_helper.compile_isolated() (BCC in a helper process; this process
    then only holds file descriptors)."""

    def __init__(self, prog_fd: int, maps: Mapping[str, RawMap], stats: CompileStats,
                 defines: Mapping[str, int], *, bcc_object: bcc.BPF | None = None,
                 owned_fds: Iterable[int] = ()):
        self._fd = prog_fd
        self._maps = dict(maps)
        self._bpf = bcc_object          # BCC mode: it owns the fds
        self._owned = list(owned_fds)   # fd mode: ours to close
        self.compile_stats = stats
        self.defines = dict(defines)
        self._links: list[XdpLink] = []
        # peak memory of the BCC helper process that compiled it (compile_isolated); 0 when
        # compiled in this process
        self.helper_rss_bytes = 0

    @classmethod
    def from_fds(cls, prog_fd: int, map_fds: Mapping[str, int], stats: CompileStats,
                 defines: Mapping[str, int]) -> InvokeSteer:
        """Adopt a loaded program and its maps by fd (they are closed by close())."""
        maps = {name: RawMap(fd) for name, fd in map_fds.items()}
        if set(maps) != set(MAP_NAMES):
            raise BpfUnavailable(f"maps {sorted(maps)} do not match {sorted(MAP_NAMES)}")
        return cls(prog_fd, maps, stats, defines, owned_fds=[prog_fd, *map_fds.values()])

    @classmethod
    def from_pins(cls, directory: str | os.PathLike) -> InvokeSteer:
        """The maps a running daemon pinned (network.xdp_pin_dir), for ops tools: counters,
        ports and the rate limit, read and changed live. There is no program fd (test_run and
        attach are not available), and the compile-time sizes are the defaults."""
        from .bpf_maps import obj_get
        fds: dict[str, int] = {}
        try:
            for name in MAP_NAMES:
                fds[name] = obj_get(os.path.join(directory, name))
        except OSError as e:
            for fd in fds.values():
                os.close(fd)
            raise BpfUnavailable(f"cannot open the pinned maps in {directory}: {e}") from e
        prog = cls(-1, {n: RawMap(fd) for n, fd in fds.items()}, CompileStats(0.0, 0, 0), DEFAULTS,
                   owned_fds=list(fds.values()))
        prog.defines["ZL_MAX_PORTS"] = prog.table("zl_ports").max_entries
        return prog

    # --- building ---------------------------------------------------------------------------

    @classmethod
    def compile(cls, *, ports: Iterable[int] = (), rate_pps: int = 0, burst: int = 0,
                defines: Mapping[str, int] | None = None, debug: int = 0) -> InvokeSteer:
        """Compile with BCC and load into the kernel (not attached anywhere yet)."""
        try:
            import bcc
        except ImportError as e:  # pragma: no cover - depends on the host
            raise BpfUnavailable(
                "BCC is not importable (install python3-bpfcc: scripts/install-bcc.sh)") from e
        merged = dict(DEFAULTS)
        for name, value in (defines or {}).items():
            if not _DEFINE_NAME.match(name):
                raise ValueError(f"bad define name {name!r}")
            merged[name] = int(value)
        cflags = [f"-D{k}={v}" for k, v in sorted(merged.items())]
        text = source_text()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        try:
            b = bcc.BPF(text=text.encode(), cflags=cflags, debug=debug)
            fn = b.load_func(FUNC_NAME.encode(), bcc.BPF.XDP)
        except Exception as e:
            raise BpfUnavailable(f"compiling/loading {SOURCE.name} failed: {e}") from e
        seconds = time.perf_counter() - t0
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ninsn = len(b.dump_func(FUNC_NAME.encode())) // 8  # 8-byte BPF instructions
        maps = {name: RawMap(b.get_table(name.encode()).map_fd) for name in MAP_NAMES}
        prog = cls(fn.fd, maps, CompileStats(seconds, (rss1 - rss0) * 1024, ninsn), merged,
                   bcc_object=b)
        try:
            prog.set_ports(ports)
            prog.set_rate(rate_pps, burst)
        except BaseException:
            prog.close()
            raise
        return prog

    @property
    def fd(self) -> int:
        return self._fd

    def table(self, name: str) -> RawMap:
        return self._maps[name]

    # --- configuration ------------------------------------------------------------------------
    # Keys and values are the C types of invoke_maps.h in native byte order ("=").

    def set_ports(self, ports: Iterable[int]) -> None:
        """Replace the invoke port set (host byte order)."""
        want = {int(p) for p in ports}
        for p in want:
            if not 0 < p < 65536:
                raise ValueError(f"port {p} out of range")
        if len(want) > self.defines["ZL_MAX_PORTS"]:
            raise ValueError(f"at most {self.defines['ZL_MAX_PORTS']} invoke ports")
        t = self.table("zl_ports")
        for k in list(t.keys()):
            if struct.unpack("=H", k)[0] not in want:
                t.delete(k)
        for p in want:
            t.update(struct.pack("=H", p), b"\x01")

    def ports(self) -> set[int]:
        return {struct.unpack("=H", k)[0] for k in self.table("zl_ports").keys()}

    def set_rate(self, rate_pps: int, burst: int = 0) -> None:
        """Per-source limit: `rate_pps` datagrams/s sustained, `burst` back to back
        (0 counts as 1). rate_pps = 0 turns the limiter off. Existing per-source state is
        kept; call reset_rate_state() to start every source with a full bucket."""
        self._set_rate_cfg(_RATE_PER_SOURCE, rate_pps, burst)

    def rate(self) -> tuple[int, int]:
        return self._rate_cfg(_RATE_PER_SOURCE)

    def set_untagged_rate(self, rate_pps: int, burst: int = 0) -> None:
        """The budget of requests without the XDP tag, per receiving CPU, whatever their
        source (rate_limit.h): `rate_pps` a second sustained, `burst` back to back; 0 = off."""
        self._set_rate_cfg(_RATE_UNTAGGED, rate_pps, burst)

    def untagged_rate(self) -> tuple[int, int]:
        return self._rate_cfg(_RATE_UNTAGGED)

    def _set_rate_cfg(self, index: int, rate_pps: int, burst: int) -> None:
        if not (0 <= rate_pps < 1 << 32 and 0 <= burst < 1 << 32):
            raise ValueError("rate_pps and burst are u32")
        self.table("zl_rate_cfg").update(struct.pack("=I", index),
                                         struct.pack("=II", rate_pps, burst))

    def _rate_cfg(self, index: int) -> tuple[int, int]:
        value = self.table("zl_rate_cfg").lookup(struct.pack("=I", index))
        if value is None:   # an array map always holds its indices
            raise KeyError(f"zl_rate_cfg[{index}]")
        pps, burst = struct.unpack("=II", value)
        return pps, burst

    def reset_rate_state(self) -> None:
        """Every bucket full again: the sources' and the untagged requests'."""
        t = self.table("zl_rate_state")
        for k in list(t.keys()):
            t.delete(k)
        u = self.table("zl_untagged_state")
        u.update(struct.pack("=I", 0), bytes(u.value_size))

    # --- authentication (invoke_auth.h) ---------------------------------------------------------

    def set_tag_key(self, key_id: int, key: bytes, prev: bytes | None = None, *,
                    retired: bool = False) -> None:
        """Add or replace key id `key_id`'s 16-byte XDP tag key; with `prev`, tags under the
        previous key verify too (while the daemon switches secrets); `retired`: only CANCEL
        and RESEND under it pass (a removed key's requests still running). One map update: a
        packet sees the old entry or the new one, never half of it."""
        if not 1 <= key_id <= 0xFFFFFFFF:
            raise ValueError("key id must be in 1..2^32-1")
        if len(key) != 16 or (prev is not None and len(prev) != 16):
            raise ValueError("XDP tag keys are 16 bytes")
        k0, k1 = struct.unpack("<QQ", key)
        p0, p1 = struct.unpack("<QQ", prev) if prev is not None else (0, 0)
        self.table("zl_keys").update(struct.pack("=I", key_id),
                                     _TAG_KEY.pack(k0, k1, p0, p1, prev is not None, retired))

    def delete_tag_key(self, key_id: int) -> None:
        self.table("zl_keys").delete(struct.pack("=I", key_id))

    def tag_keys(self) -> dict[int, tuple[bytes, bytes | None]]:
        """key id -> (key, previous key or None), as the kernel holds them (retired ones
        too: retired_key_ids() says which)."""
        t = self.table("zl_keys")
        out: dict[int, tuple[bytes, bytes | None]] = {}
        for k in t.keys():
            v = t.lookup(k)
            if v is None:       # deleted meanwhile
                continue
            k0, k1, p0, p1, has_prev, _retired = _TAG_KEY.unpack(v)
            out[struct.unpack("=I", k)[0]] = (struct.pack("<QQ", k0, k1),
                                               struct.pack("<QQ", p0, p1) if has_prev else None)
        return out

    def retired_key_ids(self) -> set[int]:
        t = self.table("zl_keys")
        out = set()
        for k in t.keys():
            v = t.lookup(k)
            if v is not None and _TAG_KEY.unpack(v)[5]:
                out.add(struct.unpack("=I", k)[0])
        return out

    def set_auth(self, flags: int, skew_us: int = 0, clock_offset_ns: int | None = None) -> None:
        """Turn the kernel's checks on (flags: AUTH_KEYS | AUTH_REQUIRE_TAG; skew_us: the
        timestamp window, 0 = off) and publish the wall-clock offset (default: now's)."""
        if clock_offset_ns is None:
            clock_offset_ns = wall_clock_offset_ns()
        self.table("zl_auth_cfg").update(
            struct.pack("=I", 0),
            _AUTH_CFG.pack(clock_offset_ns & (1 << 64) - 1, skew_us, flags, 0))

    def auth(self) -> tuple[int, int, int]:
        """(flags, skew_us, clock_offset_ns) as the kernel holds them."""
        value = self.table("zl_auth_cfg").lookup(struct.pack("=I", 0))
        if value is None:   # an array map always holds its index 0
            raise KeyError("zl_auth_cfg[0]")
        offset, skew, flags, _ = _AUTH_CFG.unpack(value)
        return flags, skew, offset - (1 << 64) if offset >> 63 else offset

    def register_xsk(self, queue: int, fd: int) -> None:
        """Steer RX queue `queue` to the AF_XDP socket `fd`."""
        self.table("zl_xsks").update(struct.pack("=I", queue), struct.pack("=I", fd))

    def unregister_xsk(self, queue: int) -> None:
        self.table("zl_xsks").delete(struct.pack("=I", queue))

    # --- counters -----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Packets per reason, summed over CPUs."""
        t = self.table("zl_stats")
        return {name: sum(struct.unpack("=Q", v)[0] for v in t.percpu_values(struct.pack("=I", i)))
                for i, name in enumerate(REASONS)}

    def reset_stats(self) -> None:
        t = self.table("zl_stats")
        for i in range(len(REASONS)):  # zeroes every CPU's slot of every reason
            t.update(struct.pack("=I", i), bytes(t.value_size))

    # --- running and attaching ----------------------------------------------------------------

    def test_run(self, frame: bytes, *, ifindex: int = 0, rx_queue: int = 0,
                 repeat: int = 1) -> RunResult:
        """Run the program on one frame with BPF_PROG_TEST_RUN (no NIC, nothing attached).
        `ifindex`/`rx_queue` fill xdp_md's ingress_ifindex/rx_queue_index (a non-zero queue
        needs an ifindex with that many RX queues)."""
        data_in = ctypes.create_string_buffer(bytes(frame), len(frame))
        out_size = len(frame) + 512
        data_out = ctypes.create_string_buffer(out_size)
        ctx = ctypes.create_string_buffer(
            struct.pack("<6I", 0, len(frame), 0, ifindex, rx_queue, 0), 24)
        attr = ctypes.create_string_buffer(80)
        struct.pack_into("<IIIIQQIIIIQQIII", attr, 0,
                         self.fd, 0, len(frame), out_size,
                         ctypes.addressof(data_in), ctypes.addressof(data_out),
                         repeat, 0, 24, 0, ctypes.addressof(ctx), 0, 0, 0, 0)
        _bpf(_BPF_PROG_TEST_RUN, attr)
        _, retval, _, size_out = struct.unpack_from("<IIII", attr, 0)
        duration = struct.unpack_from("<I", attr, 36)[0]
        return RunResult(retval, data_out.raw[:size_out], duration)

    def attach(self, ifname: str, mode: str = "auto") -> XdpLink:
        """Attach to `ifname` through a bpf_link (kernel >= 5.9): the program stays only as
        long as the returned link's fd is open, so a dead daemon leaves no program behind
        and traffic returns to the kernel stack. mode: auto | native | generic."""
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {sorted(_MODES)}")
        ifindex = socket.if_nametoindex(ifname)
        attr = ctypes.create_string_buffer(struct.pack("<IIII", self.fd, ifindex,
                                                       _BPF_XDP_ATTACH_TYPE, _MODES[mode]), 64)
        fd = _bpf(_BPF_LINK_CREATE, attr)
        os.set_inheritable(fd, False)
        link = XdpLink(fd, ifname, ifindex, mode)
        self._links.append(link)
        return link

    def pin_maps(self, directory: str | os.PathLike = "/sys/fs/bpf/zerolayer") -> dict[str, Path]:
        """Pin every map under `directory` (which must be on a bpffs) so ops scripts and a
        restarted daemon can open them (e.g. `bpftool map dump pinned DIR/zl_stats`).
        Existing pins of the same name are replaced."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        if not is_bpffs(d):
            raise BpfUnavailable(f"{d} is not on a bpf filesystem (mount -t bpf bpf /sys/fs/bpf)")
        out = {}
        for name in MAP_NAMES:
            path = d / name
            if path.exists():
                path.unlink()
            cpath = ctypes.create_string_buffer(os.fsencode(path))
            attr = ctypes.create_string_buffer(struct.pack(
                "<QII", ctypes.addressof(cpath), self.table(name).map_fd, 0), 16)
            _bpf(_BPF_OBJ_PIN, attr)
            if name in SECRET_MAPS:   # bpffs pins default to 0600 less the umask: say so
                os.chmod(path, 0o600)
            out[name] = path
        return out

    def close(self) -> None:
        """Detach every link made here and unload the program and its maps."""
        for link in self._links:
            link.close()
        self._links.clear()
        self._maps.clear()
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
        for fd in self._owned:
            os.close(fd)
        self._owned = []

    def __enter__(self) -> InvokeSteer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wall_clock_offset_ns() -> int:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC (bpf_ktime_get_ns's clock), read back to back:
    what the program adds to bpf_ktime_get_ns() to know the wall-clock time. It moves when
    the wall clock is stepped or slewed, so the daemon publishes it again every second."""
    mono0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    wall = time.clock_gettime_ns(time.CLOCK_REALTIME)
    mono1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return wall - (mono0 + mono1) // 2


def is_bpffs(path: str | os.PathLike) -> bool:
    class _Statfs(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 120)]
    buf = _Statfs()
    if _libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        return False
    return (buf.f_type & 0xFFFFFFFF) == _BPF_FS_MAGIC


__all__ = [
    "ACTION_NAMES", "AUTH_KEYS", "AUTH_REQUIRE_TAG", "BpfUnavailable", "CompileStats",
    "DEFAULTS", "InvokeSteer", "REASONS", "REASON_ERROR", "RunResult", "WIRE",
    "wall_clock_offset_ns", "XDP_ABORTED", "XDP_DROP", "XDP_PASS", "XDP_REDIRECT", "XDP_TX",
    "XdpLink", "header_defines", "is_bpffs", "source_text",
]
