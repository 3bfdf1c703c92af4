"""zerolayer.gpu.cuda: a Numba CUDA twin of every op in gpu/ops/, one file per op.

Same data layouts as the CPU kernels (row-interleaved quantized weights from gpu/quant.py,
the paged KV arena from gpu/kv_cache.py), same call signatures, float32 only. Launch
wrappers take device arrays (Numba device arrays, or CuPy arrays through
``__cuda_array_interface__``); under the simulator, plain numpy arrays.

    _cuda_shim.py   ``cuda`` for every kernel, simulator gaps (warp shuffles), kernel registry
    rmsnorm.py      one block per row, block_sum reduction
    rope.py         adjacent pairs, in place
    swiglu.py       silu(gate) * up; the residual add
    embedding.py    row lookup, dequantized (Q4, Q8, F32)
    matmul.py       y = x W^T over Q4 / Q8 / F32 weights; TT=1 (decode) and TT=8 token tiles
    attention.py    kv_write; causal GQA attention over the paged arena, flash-decoding splits
    step_kernel.py  the whole step as one persistent kernel (stages, work items, grid barriers)
    grid_sync.py    the grid-wide barrier between its stages
    step_launch.py  its host side: weights as words, scratch, one launch per step
    step_geometry.py  how it cuts its work (items, loads, barriers): its constants (no CUDA)
    step_plan.py    the bytes each of its stages moves and a model's time for it (no CUDA)
    step_shapes.py  model shapes without weights, for the plan's printout (no CUDA)
    residency.py    whether its grid can be resident at once: refused at start if not
    dequant.py      quantized weights and float32 activations to float16 (tensor-core inputs)
    tensor_gemm.py  large prefill steps' matmuls through cuBLAS on tensor cores (no kernel)
    forward.py      the forward pass over device weights (the fused kernel, or per-op
                    launches); CudaModel.step
    sampling.py     greedy / temperature / top-k / top-p per row: only token ids leave the GPU
    penalties.py    repetition / presence / frequency penalties on the rows before sampling
    logprobs.py     the sampled token's logprob and the top N, for the rows that ask only
    token_mask.py   constrained decoding: disallowed tokens to -inf, constrained rows only
    mapped_ring.py  the AF_XDP UMEM as mapped memory: token ids in/out of frames
    cupy_memory.py  Numba's device allocations from CuPy's memory pool (EMM plugin)

Importing this package imports ``numba.cuda``; ``ZEROLAYER_GPU_BACKEND=sim`` must be set
before that to get the simulator (see _cuda_shim). Tests: tests/test_cuda_sim.py (every
kernel against its CPU twin under the simulator), tests/test_cuda_ptx.py (sm_90 PTX, no
float64).
"""
from __future__ import annotations

from . import (  # noqa: F401
               _cuda_shim,
               attention,
               dequant,
               embedding,
               forward,
               grid_sync,
               logprobs,
               mapped_ring,
               matmul,
               penalties,  # (each registers its kernels)
               rmsnorm,
               rope,
               sampling,
               step_kernel,
               swiglu,
               tensor_gemm,
               token_mask,
)
from ._cuda_shim import KERNELS, SIM, device_available  # noqa: F401
