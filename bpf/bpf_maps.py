"""BPF maps through the bpf(2) syscall alone: lookup, update, delete, iterate, by map fd.

BCC's table objects need the BCC module (and LLVM) in the process; these need only a map fd,
which is what a pinned path or a helper process (bpf/compile_helper.py) hands over. Keys and
values are bytes, laid out as the C structs in invoke_maps.h; per-CPU maps take and return one
value slot (rounded up to 8 bytes) per possible CPU, as the kernel does.
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct
from collections.abc import Iterator
from dataclasses import dataclass

_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_OBJ_GET = 7
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_ANY = 0
# enum bpf_map_type values whose values are per CPU
PERCPU_TYPES = {5, 6, 10, 21}   # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH, PERCPU_CGROUP_STORAGE
MAP_TYPE_NAMES = {1: "hash", 2: "array", 6: "percpu_array", 9: "lru_hash", 17: "xskmap"}


def bpf(cmd: int, attr: ctypes.Array) -> int:
    """bpf(cmd, attr); raises OSError with the errno."""
    if _SYS_BPF is None:
        raise OSError(f"bpf(2) syscall number unknown on {platform.machine()}")
    r = _libc.syscall(_SYS_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bpf(cmd={cmd}): {os.strerror(e)}")
    return r


def obj_get(path: str) -> int:
    """An fd for a pinned BPF object (BPF_OBJ_GET); the caller closes it."""
    cpath = ctypes.create_string_buffer(os.fsencode(path))
    attr = ctypes.create_string_buffer(struct.pack("<QII", ctypes.addressof(cpath), 0, 0), 16)
    return bpf(BPF_OBJ_GET, attr)


def possible_cpus() -> int:
    """How many value slots a per-CPU map has (/sys/devices/system/cpu/possible, e.g. 0-63)."""
    with open("/sys/devices/system/cpu/possible") as f:
        n = 0
        for part in f.read().strip().split(","):
            a, _, b = part.partition("-")
            n = max(n, int(b or a) + 1)
    return n


@dataclass(frozen=True)
class MapInfo:
    map_type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    name: str


def map_info(fd: int) -> MapInfo:
    info = ctypes.create_string_buffer(80)  # struct bpf_map_info's first fields
    attr = ctypes.create_string_buffer(struct.pack("<IIQ", fd, len(info), ctypes.addressof(info)), 16)
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    t, mid, ks, vs, me, _flags = struct.unpack_from("<6I", info, 0)
    name = info.raw[24:40].split(b"\0", 1)[0].decode()
    return MapInfo(t, mid, ks, vs, me, name)


class RawMap:
    """One map, by fd (which this object does not own: close it where it was obtained)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.info = map_info(fd)
        self.key_size = self.info.key_size
        self.max_entries = self.info.max_entries
        self.percpu = self.info.map_type in PERCPU_TYPES
        self.ncpu = possible_cpus() if self.percpu else 1
        self.slot = (self.info.value_size + 7) // 8 * 8 if self.percpu else self.info.value_size
        self.value_size = self.slot * self.ncpu

    @property
    def map_fd(self) -> int:  # BCC's table attribute name, for the pinning code
        return self.fd

    def _attr(self, key: ctypes.Array | None, value: ctypes.Array | None,
              flags: int = 0) -> ctypes.Array[ctypes.c_char]:
        return ctypes.create_string_buffer(struct.pack(
            "<IIQQQ", self.fd, 0, 0 if key is None else ctypes.addressof(key),
            0 if value is None else ctypes.addressof(value), flags), 32)

    def _key(self, key: bytes) -> ctypes.Array:
        if len(key) != self.key_size:
            raise ValueError(f"{self.info.name}: key of {len(key)} bytes, want {self.key_size}")
        return ctypes.create_string_buffer(key, len(key))

    def lookup(self, key: bytes) -> bytes | None:
        k, v = self._key(key), ctypes.create_string_buffer(self.value_size)
        try:
            bpf(BPF_MAP_LOOKUP_ELEM, self._attr(k, v))
        except OSError as e:
            if e.errno == 2:  # ENOENT
                return None
            raise
        return v.raw

    def update(self, key: bytes, value: bytes) -> None:
        if len(value) != self.value_size:
            raise ValueError(f"{self.info.name}: value of {len(value)} bytes, want {self.value_size}")
        k, v = self._key(key), ctypes.create_string_buffer(value, len(value))
        bpf(BPF_MAP_UPDATE_ELEM, self._attr(k, v, BPF_ANY))

    def delete(self, key: bytes) -> bool:
        try:
            bpf(BPF_MAP_DELETE_ELEM, self._attr(self._key(key), None))
        except OSError as e:
            if e.errno == 2:
                return False
            raise
        return True

    def keys(self) -> Iterator[bytes]:
        """Every key (a snapshot walk with GET_NEXT_KEY; arrays yield all their indices)."""
        nxt = ctypes.create_string_buffer(self.key_size)
        cur: ctypes.Array | None = None
        while True:
            try:
                bpf(BPF_MAP_GET_NEXT_KEY, self._attr(cur, nxt))
            except OSError as e:
                if e.errno == 2:
                    return
                raise
            yield nxt.raw
            cur = ctypes.create_string_buffer(nxt.raw, self.key_size)

    def percpu_values(self, key: bytes) -> list[bytes]:
        raw = self.lookup(key) or bytes(self.value_size)
        return [raw[i * self.slot:i * self.slot + self.info.value_size] for i in range(self.ncpu)]
