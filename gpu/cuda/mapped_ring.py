"""The AF_XDP UMEM seen from the device: host memory registered as mapped (zero-copy) memory,
so kernels read request token ids straight out of received frames and write response data
straight into TX frames, with no cudaMemcpy in between.

    ring = MappedHostBuffer(umem_bytes)          # cuMemHostRegister(DEVICEMAP) on a GPU
    gather_token_ids(ring.device, offsets, out)  # token i = little-endian u32 at offsets[i]
    write_token_ids(ids, ring.device, offsets)   # and back: u32 LE into TX frames

The UMEM is an anonymous mmap (daemon/xsk_ring.Umem): page-aligned, which is what
cuMemHostRegister needs, and pinned already by the kernel's XDP_UMEM_REG. This module sees
only a uint8 array over it (gpu/ never imports daemon/). Under the simulator there is no
registration to do (a "device" array is host memory); the tests build the UMEM with
``cuda.mapped_array`` instead, which is the same flow with memory the driver allocated.

Token ids are read byte by byte: a frame's payload sits at whatever offset its Ethernet/IP/UDP
headers leave (42 bytes for IPv4), so a u32 load would be misaligned.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ._cuda_shim import SIM, DeviceArray, StreamArg, cuda, grid_1d, kernel


class MappedHostBuffer:
    """A host uint8 buffer and its device view. Keep this object alive while kernels use it."""

    def __init__(self, host: npt.NDArray[np.uint8]):
        if host.dtype != np.uint8 or host.ndim != 1:
            raise ValueError("a 1-D uint8 view of the buffer is expected")
        self.host = host
        if SIM or cuda.is_cuda_array(host):  # simulator, or already mapped_array
            self.device = host
            self._pinned = None
            return
        from numba.cuda.cudadrv import devicearray, driver
        ctx = cuda.current_context()
        self._pinned = ctx.mempin(host, driver.host_pointer(host), driver.host_memory_size(host),
                                  mapped=True)
        self.device = devicearray.from_array_like(host, gpu_data=self._pinned)


@kernel(["void(uint8[::1], int64[::1], int32[::1])"])
def _gather_u32(buf, offsets, out):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        o = offsets[i]
        out[i] = (np.int32(buf[o]) | (np.int32(buf[o + 1]) << 8) | (np.int32(buf[o + 2]) << 16)
                  | (np.int32(buf[o + 3]) << 24))


@kernel(["void(int32[::1], uint8[::1], int64[::1])"])
def _scatter_u32(ids, buf, offsets):
    for i in range(cuda.grid(1), ids.shape[0], cuda.gridsize(1)):
        o = offsets[i]
        v = ids[i]
        buf[o] = np.uint8(v & 0xFF)
        buf[o + 1] = np.uint8((v >> 8) & 0xFF)
        buf[o + 2] = np.uint8((v >> 16) & 0xFF)
        buf[o + 3] = np.uint8((v >> 24) & 0xFF)


def gather_token_ids(buf: DeviceArray, offsets: DeviceArray, out: DeviceArray,
                     stream: StreamArg = 0) -> None:
    """out[i] = the little-endian u32 at byte offsets[i] of buf (a mapped UMEM view)."""
    if len(out) == 0:  # a launch of 0 blocks is an error
        return
    blocks, threads = grid_1d(len(out))
    _gather_u32[blocks, threads, stream](buf, offsets, out)


def write_token_ids(ids: DeviceArray, buf: DeviceArray, offsets: DeviceArray,
                    stream: StreamArg = 0) -> None:
    """The reverse: ids[i] as a little-endian u32 at byte offsets[i] of buf."""
    if len(ids) == 0:
        return
    blocks, threads = grid_1d(len(ids))
    _scatter_u32[blocks, threads, stream](ids, buf, offsets)
