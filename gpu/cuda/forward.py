"""The Llama forward pass on the GPU: gpu/model.py's ``forward`` as a sequence of kernel
launches over device-resident weights, and ``CudaModel``, a drop-in for ``LlamaModel.step``.

    x = embed(tokens)
    for each layer:
        qkv = rmsnorm(x) @ [Wq|Wk|Wv]^T (+ [bq|bk|bv]) ; rope(q), rope(k) ; write k, v to the KV arena
        x  += attention(q, K, V) @ Wo^T
        x  += swiglu(rmsnorm(x) @ [Wgate|Wup]^T) @ Wdown^T
    logits = rmsnorm(x[last token of each sequence]) @ Wout^T

Weights are uploaded once, in the CPU kernels' layout (row-interleaved Q4/Q8, or float32),
with per-layer views prepared up front so a step only launches. Activations live in buffers
sized for the largest step seen so far. The KV pools are device arrays with the host arena's
shape; block bookkeeping (which sequence owns which block) stays with the host KVArena, so
the engine's admission and release logic is unchanged.

RoPE scaling is in the cos/sin tables (the host model's), so it needs nothing here; Q/K/V
biases (qwen2) add one launch per layer.

``CudaForward.launch`` is the step as 4 + 13 per layer kernel launches (~395 for SmolLM2's 30
layers), with no allocation or copy, so that graph.py can capture a decode step as one CUDA
graph; CudaModel replays those for decode steps (ZEROLAYER_CUDA_GRAPHS=0 turns that off).
``step_tokens`` samples on the device (sampling.py) and copies back only token ids.

Prefill steps of many tokens (tensor_gemm.MIN_TOKENS or more, not decode steps) run the
per-op sequence with each layer matmul through cuBLAS on tensor cores instead (the weight
dequantized to float16 per layer: tensor_gemm.py); ZEROLAYER_CUDA_PREFILL_GEMM=0 turns that
off. ``last_path`` names the path the last step took.

``launch_tokens`` is that step without the wait: it queues the inputs' copy, the step, the
sampler and the ids' copy back, records an event and returns. The engine plans and stages
step N+1 meanwhile; a sequence whose token from step N is not on the host yet takes it from
step N's device ids (``StepInput.from_prev``: a small kernel writes it into step N+1's
token inputs, in stream order). At most two steps are in flight, so the pinned host buffers
come in pairs (Staging, the ids): step N+1 never overwrites a buffer step N still reads.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ..model_api import Draw, StepArrays, StepInput, step_arrays
from ..ops.logprobs import RowLogprobs
from ..ops.penalties import Penalty
from ..quant import FMT_F32, Weight
from . import attention as _att
from . import embedding as _emb
from . import logprobs as _lp
from . import matmul as _mm
from . import penalties as _pen
from . import rmsnorm as _rms
from . import rope as _rope
from . import sampling as _smp
from . import step_kernel as _sk
from . import swiglu as _sw
from . import tensor_gemm as _tg
from ._cuda_shim import SIM, DeviceArray, Event, StreamArg, cuda, grid_1d, kernel, new_event
from .staging import Staging, take_prev
from .step_geometry import scale_type
from .step_launch import BarrierCheck, FusedRefused, FusedStep
from .weight_layout import as_bytes, device_words

if TYPE_CHECKING:
    from ..gguf_loader import ModelConfig, ModelWeights
    from .graph import DecodeGraph

SIM_SMS = 4  # multiprocessors assumed under the simulator (sizes the attention splits)
GRAPH_CHECK_TOL = 1e-4  # a graph replay vs the launched step (the same kernels: ~0 expected)


@kernel(["void(float32[:, ::1], int32[::1], float32[:, ::1])"])
def _gather_rows(x, rows, out):
    """out[i] = x[rows[i]] (the logit rows of a step)."""
    D = x.shape[1]
    n = out.shape[0] * D
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        out[e // D, e % D] = x[rows[e // D], e % D]


@kernel(["void(float32[:, ::1], float32[::1])"])
def _add_bias(x, b):
    """x[t, i] += b[i] (the Q/K/V biases, after the QKV matmul)."""
    W = x.shape[1]
    n = x.shape[0] * W
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        x[e // W, e % W] += b[e % W]


def add_bias(x: DeviceArray, b: DeviceArray, stream: StreamArg) -> None:
    n = x.shape[0] * x.shape[1]
    if n:
        blocks, threads = grid_1d(n)
        _add_bias[blocks, threads, stream](x, b)


# one layer's (qs, d, m, w) on the device; None where its format uses no such array
LayerArrays = tuple[DeviceArray | None, DeviceArray | None, DeviceArray | None, DeviceArray | None]
# a weight's format and its whole [layer, ...] arrays (the fused step kernel's)
FullWeight = tuple[int, list[DeviceArray | None]]


def _upload_weight(wt: Weight, stream: StreamArg, full: dict[str, FullWeight] | None = None,
                   name: str = "", scales: type = np.float32) -> tuple[int, list[LayerArrays]]:
    """A quant.Weight -> (fmt, per-layer tuples of device arrays (qs, d, m, w)). The arrays
    a format doesn't use (zero-size) stay behind as None: the launch wrappers never touch them.
    The bytes go up once, in weight_layout's device layout: the fused step kernel reads them
    as words, each layer's per-op launches as bytes (a view). full[name] receives (fmt, the
    whole [layer, ...] arrays), for the fused step kernel, with its scales (d, m) as
    `scales` (a float16 copy of its own where step_geometry.scale_type chose float16)."""
    qs_host = device_words(wt.qs) if wt.qs.size else wt.qs
    arrs = [cuda.to_device(np.ascontiguousarray(a), stream=stream) if a.size else None
            for a in (qs_host, wt.d, wt.m, wt.w)]
    if full is not None:
        fused = list(arrs)
        if wt.fmt != FMT_F32 and scales != np.float32:
            fused[1:3] = [cuda.to_device(np.ascontiguousarray(a, scales), stream=stream)
                          for a in (wt.d, wt.m)]
        full[name] = (wt.fmt, fused)
    L = wt.d.shape[0]
    qs, d, m, w = arrs
    return wt.fmt, [(None if qs is None else as_bytes(qs[i]), None if d is None else d[i],
                     None if m is None else m[i], None if w is None else w[i]) for i in range(L)]


class CudaForward:
    """Device weights, KV pools and activation buffers for one model; ``run`` launches a step."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, n_blocks: int,
                 cos: npt.NDArray[np.float32], sin: npt.NDArray[np.float32], stream: StreamArg = 0):
        self.cfg = cfg
        self.stream = stream
        s = stream
        # The whole step as one kernel (step_kernel.py) unless ZEROLAYER_CUDA_FUSED=0 or the
        # model's shapes are outside it; then the per-op launches below.
        why = (_sk.supports(cfg, None) if os.environ.get("ZEROLAYER_CUDA_FUSED", "1") != "0"
               else "ZEROLAYER_CUDA_FUSED=0")
        full: dict[str, FullWeight] | None = {} if why is None else None
        parts = [weights.emb, weights.wqkv, weights.wo, weights.wgu, weights.wdown, weights.output]
        # (the check reads every scale: only where the fused kernel will use its answer)
        self.fused_scales = scale_type(parts) if full is not None else np.float32
        up = partial(_upload_weight, stream=s, full=full, scales=self.fused_scales)
        self.emb = up(weights.emb, name="emb")
        self.wqkv = up(weights.wqkv, name="wqkv")
        self.wo = up(weights.wo, name="wo")
        self.wgu = up(weights.wgu, name="wgu")
        self.wdown = up(weights.wdown, name="wdown")
        if weights.output is weights.emb:  # tied: one copy on the device
            self.output = self.emb
            if full is not None:
                full["output"] = full["emb"]
        else:
            self.output = up(weights.output, name="output")
        self.attn_norm_full = cuda.to_device(np.ascontiguousarray(weights.attn_norm), stream=s)
        self.ffn_norm_full = cuda.to_device(np.ascontiguousarray(weights.ffn_norm), stream=s)
        self.attn_norm = [self.attn_norm_full[i] for i in range(cfg.n_layer)]
        self.ffn_norm = [self.ffn_norm_full[i] for i in range(cfg.n_layer)]
        self.out_norm = cuda.to_device(np.ascontiguousarray(weights.out_norm), stream=s)
        self.qkv_bias = None  # per layer, where the model has Q/K/V biases
        self.qkv_bias_full = None
        qb = getattr(weights, "qkv_bias", None)
        if qb is not None and qb.shape[1]:
            d_qb = self.qkv_bias_full = cuda.to_device(np.ascontiguousarray(qb, np.float32), stream=s)
            self.qkv_bias = [d_qb[i] for i in range(cfg.n_layer)]
        self.cos = cuda.to_device(cos, stream=s)
        self.sin = cuda.to_device(sin, stream=s)
        BT = _att.BLOCK_TOKENS
        kv = (n_blocks, cfg.n_layer, cfg.n_kv)
        self.k_pool = cuda.device_array((*kv, cfg.head_dim, BT), np.float32, stream=s)
        self.v_pool = cuda.device_array((*kv, BT, cfg.head_dim), np.float32, stream=s)
        self.sms = SIM_SMS if SIM else cuda.get_current_device().MULTIPROCESSOR_COUNT
        self._cap = 0
        self._part: dict[tuple[int, int], tuple[DeviceArray, DeviceArray, DeviceArray]] = {}
        self._inputs = Staging(s, np.int32)
        self.fused = None
        if full is not None:
            try:
                self.fused = FusedStep(self, full, s, self.fused_scales)
            except FusedRefused as e:  # a clear refusal at start, then the per-op path
                why = f"fused step kernel refused: {e}"
                print(f"zerolayer: {why}", file=sys.stderr, flush=True)
        self.kernel_path = "fused step kernel" if why is None else f"per-op launches ({why})"
        self.best_keys = None  # the last launched step's argmax keys (fused only)
        # Prefill steps of many tokens: their layer matmuls through cuBLAS on tensor cores
        # (tensor_gemm.py), the rest per op. Not the LM head: a prefill wants few logit rows,
        # and its float16 copy would be the largest scratch (vocab x d_model).
        why_not = _tg.unavailable()
        self.prefill_gemm = None if why_not else _tg.TensorGemm(
            [self.wqkv, self.wo, self.wgu, self.wdown], s, _tg.min_tokens())
        self.prefill_path = self.prefill_gemm.path if self.prefill_gemm else f"off ({why_not})"
        self.last_path = self.kernel_path  # the path the last launched step took

    def ensure_buffers(self, T: int, n_out: int) -> None:
        """Activation buffers for steps of up to T tokens and n_out logit rows."""
        if T <= self._cap and n_out <= self._cap:
            return
        cap = max(16, 1 << (max(T, n_out) - 1).bit_length())
        c, s = self.cfg, self.stream
        f32 = np.float32
        D, qkv_w = c.d_model, (c.n_head + 2 * c.n_kv) * c.head_dim
        self._x = cuda.device_array((cap, D), f32, stream=s)
        self._xn = cuda.device_array((cap, D), f32, stream=s)
        self._tmp = cuda.device_array((cap, D), f32, stream=s)
        self._qkv = cuda.device_array((cap, qkv_w), f32, stream=s)
        self._att = cuda.device_array((cap, c.n_head * c.head_dim), f32, stream=s)
        self._gu = cuda.device_array((cap, 2 * c.n_ff), f32, stream=s)
        self._h = cuda.device_array((cap, c.n_ff), f32, stream=s)
        self._logits = cuda.device_array((cap, c.vocab), f32, stream=s)
        self._q = cuda.device_array((cap, c.n_head * c.head_dim), f32, stream=s)
        self._cap = cap

    def activations(self, T: int, n_out: int) -> tuple:
        """Views for a step of T tokens and n_out logit rows: (x, q, att, h, logits)."""
        return (self._x[:T], self._q[:T], self._att[:T], self._h[:T], self._logits[:n_out])

    def buffers(self) -> tuple:
        """Every activation buffer a step writes: what a captured graph must keep alive."""
        return (self._x, self._xn, self._tmp, self._qkv, self._att, self._gu, self._h,
                self._logits, self._q)

    def splits_for(self, T: int, tok_pos: npt.NDArray[np.int32] | None = None) -> int:
        """Flash-decoding splits: about two thread blocks per multiprocessor (one work item
        per block for the fused kernel), no more splits than the longest sequence of the step
        has KV blocks. tok_pos None: any context (a graph keeps its splits for every step)."""
        max_blocks = None if tok_pos is None else -(-(int(tok_pos.max()) + 1) // _att.BLOCK_TOKENS)
        if self.fused is not None:
            return self.fused.splits(T, max_blocks)
        want = -(-2 * self.sms // (T * self.cfg.n_kv))
        return max(1, want if max_blocks is None else min(max_blocks, want))

    def run(self, a: StepArrays, prev_ids=None):
        """One step, launched on self.stream; returns the device logits
        [len(logit_rows), vocab], not yet synchronised. prev_ids: the previous step's device
        ids, for inputs that take their token from it (a.prev_rows)."""
        self.ensure_buffers(len(a.tokens), len(a.logit_rows))
        splits = self.splits_for(len(a.tokens), a.tok_pos)
        d_tok, d_seq, d_pos, d_rows, d_tab, d_prev = self._inputs.put(
            a.tokens, a.tok_seq, a.tok_pos, a.logit_rows, a.tables, a.prev_rows)
        if a.uses_prev:
            take_prev(d_tok, d_prev, prev_ids, self.stream)
        return self.launch(d_tok, d_seq, d_pos, d_rows, d_tab, splits, self.stream,
                           gemm=self.takes_gemm(a))

    def takes_gemm(self, a: StepArrays) -> bool:
        """A step whose matmuls go through cuBLAS (tensor_gemm.py): many tokens, and not a
        decode step (those keep the fused kernel, and their CUDA graphs)."""
        g = self.prefill_gemm
        return g is not None and not a.is_decode and len(a.tokens) >= g.min_tokens

    def stage_times(self, a: StepArrays) -> list[float]:
        """Device microseconds of each stage of the fused kernel for one step of a, each stage
        its own launch between two CUDA events: where a step's time goes, beside
        step_plan's bytes (the same order: embed, 5 per layer, the LM head). The step runs
        for real (it writes its KV): use sequences made for measuring. Device only."""
        if self.fused is None or SIM:
            raise RuntimeError("stage times need the fused kernel on a device")
        self.ensure_buffers(len(a.tokens), len(a.logit_rows))
        splits = self.splits_for(len(a.tokens), a.tok_pos)
        d_tok, d_seq, d_pos, d_rows, d_tab, _ = self._inputs.put(
            a.tokens, a.tok_seq, a.tok_pos, a.logit_rows, a.tables, a.prev_rows)
        events: list = []
        self.fused.launch(self, d_tok, d_seq, d_pos, d_rows, d_tab, splits,
                          self.partials(len(a.tokens), splits, self.stream), self.stream,
                          events=events)
        events[-1].synchronize()
        return [cuda.event_elapsed_time(e0, e1) * 1e3 for e0, e1 in zip(events, events[1:])]

    def partials(self, T: int, splits: int,
                 s: StreamArg) -> tuple[DeviceArray, DeviceArray, DeviceArray]:
        """Flash-decoding scratch for (T, splits), allocated once and kept."""
        c = self.cfg
        part = self._part.get((T, splits))
        if part is None:
            part = self._part[(T, splits)] = (
                cuda.device_array((T, c.n_head, splits, c.head_dim), np.float32, stream=s),
                cuda.device_array((T, c.n_head, splits), np.float32, stream=s),
                cuda.device_array((T, c.n_head, splits), np.float32, stream=s))
        return part

    def launch(self, d_tok: DeviceArray, d_seq: DeviceArray, d_pos: DeviceArray,
               d_rows: DeviceArray, d_tab: DeviceArray, splits: int, s: StreamArg,
               gemm: bool = False) -> DeviceArray:
        """Only kernel launches, on stream s, from inputs already on the device: no allocation,
        no copy, no synchronisation, so the whole step can be captured as a CUDA graph
        (graph.py). gemm: the matmuls through cuBLAS (takes_gemm; never captured). Returns
        the device logits [len(d_rows), vocab]."""
        T = d_tok.shape[0]
        part = self.partials(T, splits, s)
        g = self.prefill_gemm
        if gemm and g is not None:
            self.best_keys = None
            self.last_path = g.path
            return self._per_op(d_tok, d_seq, d_pos, d_rows, d_tab, splits, part, s, g.matmul)
        self.last_path = self.kernel_path
        if self.fused is not None:
            logits, self.best_keys = self.fused.launch(self, d_tok, d_seq, d_pos, d_rows, d_tab,
                                                       splits, part, s)
            return logits
        self.best_keys = None
        return self._per_op(d_tok, d_seq, d_pos, d_rows, d_tab, splits, part, s, _per_op_matmul)

    def _per_op(self, d_tok, d_seq, d_pos, d_rows, d_tab, splits, part, s, mm):
        """The step as per-op launches; mm(weight, layer, x, y, s) does each layer matmul."""
        c = self.cfg
        T, n_out = d_tok.shape[0], d_rows.shape[0]
        x, xn, tmp = self._x[:T], self._xn[:T], self._tmp[:T]
        qkv, att, gu, h = self._qkv[:T], self._att[:T], self._gu[:T], self._h[:T]
        eps = np.float32(c.eps)
        nh, nkv, hd = c.n_head, c.n_kv, c.head_dim

        fmt, lw = self.emb
        _emb.embed(fmt, *lw[0], d_tok, x, stream=s)
        for layer in range(c.n_layer):
            _rms.rmsnorm(x, self.attn_norm[layer], eps, xn, stream=s)
            mm(self.wqkv, layer, xn, qkv, s)
            if self.qkv_bias is not None:
                add_bias(qkv, self.qkv_bias[layer], s)
            _rope.rope(qkv, 0, d_pos, self.cos, self.sin, nh + nkv, hd, stream=s)  # Q, K adjacent
            _att.kv_write(qkv, self.k_pool, self.v_pool, layer, d_seq, d_pos, d_tab, nh, nkv, hd, stream=s)
            _att.attention(qkv, self.k_pool, self.v_pool, layer, d_seq, d_pos, d_tab, nh, nkv, hd,
                           splits, att, part=part, stream=s)
            mm(self.wo, layer, att, tmp, s)
            _sw.add(x, tmp, stream=s)
            _rms.rmsnorm(x, self.ffn_norm[layer], eps, xn, stream=s)
            mm(self.wgu, layer, xn, gu, s)
            _sw.swiglu(gu, h, stream=s)
            mm(self.wdown, layer, h, tmp, s)
            _sw.add(x, tmp, stream=s)
        logits = self._logits[:n_out]
        if n_out == 0:  # prompt chunks that want no logits (and a launch of 0 blocks is an error)
            return logits
        xl, xln = self._tmp[:n_out], self._xn[:n_out]
        blocks, threads = grid_1d(n_out * c.d_model)
        _gather_rows[blocks, threads, s](x, d_rows, xl)
        _rms.rmsnorm(xl, self.out_norm, eps, xln, stream=s)
        _mm.matmul(self.output[0], *self.output[1][0], xln, logits, stream=s)
        return logits


def _per_op_matmul(weight, layer, x, y, s):
    fmt, lw = weight
    qs, d, m, w = lw[layer]
    _mm.matmul(fmt, qs, d, m, w, x, y, stream=s)


# the asking rows' logprobs, as a step leaves them in pinned memory: ids [m, WIDTH], values
# [m, WIDTH], the rows (logit row indices) and how many alternatives each asked for
StepLogprobs = tuple[npt.NDArray[np.int32], npt.NDArray[np.float32], list[int], list[int]]


class PendingStep:
    """A launched step's ids: ``wait`` blocks on the step's event (the host thread sleeps in
    the driver, holding no GIL), then copies the ids out of their pinned buffer, and the
    logprobs of the rows that asked (``lp``: their pinned buffers, the asking rows and their
    counts) out of theirs."""

    def __init__(self, event: Event, host_ids: npt.NDArray[np.int32] | None, n: int,
                 check: Callable[[], None] | None = None, lp: StepLogprobs | None = None):
        self.event, self.host_ids, self.n, self.check, self.lp = event, host_ids, n, check, lp
        self._ids: npt.NDArray[np.int32] | None = None
        self._lps: list[RowLogprobs | None] = [None] * n

    def wait(self) -> npt.NDArray[np.int32]:
        if self._ids is None:
            self.event.synchronize()
            if self.check is not None:
                self.check()
            self._ids = (self.host_ids[:self.n].copy() if self.n and self.host_ids is not None
                         else np.zeros(0, np.int32))
            if self.lp is not None:
                h_ids, h_lps, rows, tops = self.lp
                m = len(rows)
                for r, res in zip(rows, _lp.row_results(h_ids[:m], h_lps[:m], tops)):
                    self._lps[r] = res
        return self._ids

    def logprobs(self) -> list[RowLogprobs | None]:
        return self._lps


class CudaModel:
    """``LlamaModel.step`` on the GPU, for a model loaded on the host (gpu/model.py); satisfies
    model_api.Model, with ``overlaps`` True.

    Sequences come from the host model's KV arena (``new_sequence``), which keeps the block
    bookkeeping; their keys and values live in this object's device pools.
    """

    overlaps = True
    verifies_drafts = False  # drafts need the host to see each step's tokens (no overlap)

    def __init__(self, model):
        self.model = model
        self.cfg = model.cfg
        self.path = model.path
        self.max_seq_len = model.max_seq_len
        # Everything of a step goes on one stream of its own, in order: the inputs' copy, the
        # launches or the graph replay, the draws' copy, the sampler, the ids' copy back; the
        # host waits once, at the end. (Stream 0, the legacy default stream, would make every
        # copy from pinned memory wait for all work on the device, and can't be captured.)
        self.stream = cuda.stream()
        self.fwd = CudaForward(model.cfg, model.w, model.arena.n_blocks, model.cos, model.sin,
                               self.stream)
        # The arena keeps its block bookkeeping; its pools become the device ones, so code that
        # copies blocks (the prefix cache: pool[dst] = pool[src]) copies on the device. The host
        # pools were never touched (np.zeros is backed lazily) and are dropped here.
        self.arena = model.arena
        self.arena.k_pool, self.arena.v_pool = self.fwd.k_pool, self.fwd.v_pool
        if SIM:
            self.device = "CUDA simulator"
        else:
            name = cuda.get_current_device().name  # bytes or str, by numba-cuda version
            self.device = name.decode() if isinstance(name, bytes) else str(name)
        self._graphs: dict = {}
        self._draws = Staging(self.stream, np.float32)
        self._pen_ints = Staging(self.stream, np.int32)  # penalties.pack's arrays, per step
        self._pen_floats = Staging(self.stream, np.float32)
        self._lp_ints = Staging(self.stream, np.int32)     # asking rows and their counts
        self._mask_rows = Staging(self.stream, np.int32)   # constrained rows, their masks
        self._mask_words = Staging(self.stream, np.uint32)
        self._lp_cap = 0            # logprob outputs: device [cap, WIDTH] ids and values,
        self._lp_dev: tuple = ()    # and a pair of pinned copies of each, by _ids_turn
        self._lp_host: tuple = ()
        self._ids = None            # the last launched step's device ids (read by from_prev)
        self._ids_host: tuple = ()  # a pair of pinned buffers, alternating per step
        self._ids_turn = 0
        # Decode steps (one token per sequence) replayed as CUDA graphs, one per batch size
        # (graph.py). On unless ZEROLAYER_CUDA_GRAPHS=0; each graph is checked against the
        # launched step when it is made, and a failure turns graphs off for this model.
        self.use_graphs = os.environ.get("ZEROLAYER_CUDA_GRAPHS", "1") != "0" and not SIM
        self.graphs = ("on" if self.use_graphs else
                       "off (simulator)" if SIM else "off (ZEROLAYER_CUDA_GRAPHS=0)")

    def tokenizer(self):
        return self.model.tokenizer()

    def new_sequence(self):
        return self.model.new_sequence()

    def _graph_for(self, T: int, a: StepArrays) -> DecodeGraph | None:
        """The graph for decode steps of T sequences, made on first use from this step's own
        inputs: captured, replayed once and compared with the launched step (running a step
        twice is harmless: it writes the same keys and values to the same KV slots). None,
        with graphs off from then on, if the driver refuses or the replay disagrees."""
        g = self._graphs.get(T)
        if g is not None:
            return g
        from .graph import DecodeGraph
        splits = self.fwd.splits_for(T)  # fixed for the graph: empty splits are fine
        try:
            g = DecodeGraph(self.fwd, T, self.arena.max_blocks_per_seq, splits)
            ref = g.capture(a)
            got = g.replay(a).copy_to_host(stream=self.stream)
            err = float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-30))
            if not err <= GRAPH_CHECK_TOL:
                raise RuntimeError(f"replay differs from the launched step (rel err {err:.2g})")
        except Exception as e:  # a model that works beats a fast one: launch per op instead
            self.use_graphs = False
            self.graphs = f"off ({type(e).__name__}: {e})"
            print(f"zerolayer: CUDA graphs off: {e}", file=sys.stderr, flush=True)
            return None
        self._graphs[T] = g
        return g

    def _run(self, a: StepArrays):
        """Launch one step on self.stream (a graph replay for a decode step when graphs are
        on); returns (the device logits, the fused kernel's argmax keys or None, the step's
        barrier check or None), not yet synchronised."""
        g = None
        if self.use_graphs and a.is_decode and not a.uses_prev:
            g = self._graph_for(len(a.tokens), a)
        elif self.use_graphs and a.is_decode:
            # a captured graph with this step's tokens patched in from the previous step
            g = self._graphs.get(len(a.tokens))
        if g is not None:
            logits = g.replay(a, prev_ids=self._ids if a.uses_prev else None)
            keys = g.best_keys
        else:
            logits = self.fwd.run(a, prev_ids=self._ids)
            keys = self.fwd.best_keys
        check = None
        if self.fwd.fused is not None:  # (a graph replay holds the fused kernel too)
            check = self.fwd.fused.queue_flag(self.stream)
        return logits, keys, check

    def _check_barrier(self, check: BarrierCheck | None) -> None:
        """After a step's stream work is done, judge that step by the kernel that ran it
        (check: None for a per-op step, which has no grid barrier). A fused step whose grid
        barrier gave up, or that ran behind one that did (the flag is sticky), computed
        garbage: raise, so that none of its tokens is used.

        Why an error and not a re-run per op: by now the step's sequence lengths, draws,
        penalty and grammar states have advanced, and the step queued behind it took its
        tokens from this one's device ids; undoing all of that is more machinery than a
        fault of residency deserves. The engine fails the step's requests with INTERNAL
        (retryable: the SDK retries by itself while no text was handed over, and the retry
        runs per op) and releases their sequences without storing a prefix: a failed
        kernel's writes go only to its own tokens' KV slots (their addresses are inputs,
        never computed), and those blocks are freed. The first failure seen turns the
        fused kernel off for good; its graphs go with it, after the stream drains (a step
        queued behind may still be replaying one)."""
        if check is None or not check.failed():
            return
        if self.fwd.fused is check.fused:
            self.fwd.fused = None
            self.fwd.kernel_path = "per-op launches (the fused kernel's grid barrier failed)"
            self.stream.synchronize()
            for g in self._graphs.values():
                g.close()
            self._graphs.clear()
            print(f"zerolayer: {self.fwd.kernel_path}", file=sys.stderr, flush=True)
        raise RuntimeError("fused step kernel: grid barrier failed; this step's tokens are "
                           "discarded, later steps run per op")

    def step(self, inputs: list[StepInput]) -> npt.NDArray[np.float32]:
        """LlamaModel.step on the device: host logits [N, vocab]."""
        a = step_arrays(inputs, self.cfg.vocab)
        logits, _, check = self._run(a)
        out = logits.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        self._check_barrier(check)
        for i in inputs:
            i.seq.length += len(i.tokens)
        return out

    def step_tokens(self, inputs: list[StepInput], draws: list[Draw],
                    penalties: list[Penalty | None] | None = None) -> npt.NDArray[np.int32]:
        """LlamaModel.step_tokens on the device: the step, penalties (penalties.py), then one
        token per logit row drawn by gpu/cuda/sampling.py, so only int32 ids come back."""
        return self.launch_tokens(inputs, draws, penalties).wait()

    def launch_tokens(self, inputs: list[StepInput], draws: list[Draw],
                      penalties: list | None = None,
                      logprobs: list[int] | None = None,
                      masks: list | None = None) -> PendingStep:
        """Queue the step, the sampler and the ids' copy back on self.stream; returns at once.
        Sequence lengths advance now (the host's bookkeeping): the next step is planned
        against them while this one runs. Rows that ask for logprobs (model_api) get them
        from gpu/cuda/logprobs.py after the sampler, over those rows only; their results
        come back with the ids. Constrained rows' token masks (model_api) are staged with the
        draws, for those rows only, and the sampler applies them (gpu/cuda/token_mask.py)."""
        a = step_arrays(inputs, self.cfg.vocab)
        n = len(a.logit_rows)
        asking = [(r, min(k, self.cfg.vocab)) for r, k in enumerate(logprobs or ()) if k >= 0]
        if asking:  # staged before the step, like the draws
            lp_rows, lp_tops = self._lp_ints.put([r for r, _ in asking], [k for _, k in asking])
        if n:  # (none when the step was only prompt chunks that want no logits)
            (params,) = self._draws.put(_smp.pack_params(draws))  # queued before the step
            masked = [(r, m) for r, m in enumerate(masks or ()) if m is not None]
            mask = None
            if masked:
                (m_rows,) = self._mask_rows.put(np.array([r for r, _ in masked], np.int32))
                (m_words,) = self._mask_words.put(np.stack([m for _, m in masked]))
                mask = (m_rows, m_words)
            packed = _pen.pack(penalties)
            if packed is not None:
                pen = (self._pen_ints.put(*packed[0]), self._pen_floats.put(*packed[1]))
            if self._ids is None or self._ids.shape[0] < n:
                cap = max(64, 1 << (n - 1).bit_length())
                self._ids_retired = self._ids  # the step just queued may still read it
                self._ids_next = cuda.device_array(cap, np.int32)
                self._ids_host = (cuda.pinned_array(cap, np.int32), cuda.pinned_array(cap, np.int32))
            else:
                self._ids_next = self._ids
        logits, keys, check = self._run(a)  # reads self._ids (the previous step's) where asked
        host = None
        if n:
            ids = self._ids_next
            if packed is not None:
                _pen.apply_rows(logits, *pen, stream=self.stream)
                keys = None  # penalised rows: their argmax is the sampler's to find
            _smp.sample_rows(logits, params, ids[:n], pre=keys, stream=self.stream, mask=mask)
            self._ids_turn ^= 1
            host = self._ids_host[self._ids_turn]
            ids[:n].copy_to_host(host[:n], stream=self.stream)
            self._ids = ids
        lp = None
        if asking and n:
            m = len(asking)
            self._ensure_lp(m)
            d_ids, d_lps = self._lp_dev
            _lp.logprob_rows(logits, lp_rows, lp_tops, ids, d_ids[:m], d_lps[:m],
                             stream=self.stream)
            h_ids, h_lps = self._lp_host[self._ids_turn]
            d_ids[:m].copy_to_host(h_ids[:m], stream=self.stream)
            d_lps[:m].copy_to_host(h_lps[:m], stream=self.stream)
            lp = (h_ids, h_lps, [r for r, _ in asking], [k for _, k in asking])
        ev = new_event()
        ev.record(self.stream)
        for i in inputs:
            i.seq.length += len(i.tokens)
        return PendingStep(ev, host, n, partial(self._check_barrier, check), lp)

    def _ensure_lp(self, m: int) -> None:
        """Room for m asking rows' logprob outputs (grown by powers of two, never shrunk;
        the old device pair is kept one more step: a queued launch may still write it)."""
        if m <= self._lp_cap:
            return
        cap = max(16, 1 << (m - 1).bit_length())
        self._lp_retired = self._lp_dev
        w = _lp.WIDTH
        self._lp_dev = (cuda.device_array((cap, w), np.int32),
                        cuda.device_array((cap, w), np.float32))
        self._lp_host = tuple((cuda.pinned_array((cap, w), np.int32),
                               cuda.pinned_array((cap, w), np.float32)) for _ in range(2))
        self._lp_cap = cap
