"""The host side of step_kernel.py: its weights as 32-bit words, its scratch, and the launch.

``FusedStep.launch`` queues one forward step as one kernel launch (the device plan: one node
per step, whatever the layer count) and needs nothing but device arrays that keep their
addresses, so a CUDA graph captures it as it does the per-op path (graph.py). Under the
simulator the same kernel runs stage by stage (grid_sync.py), and the launch is counted once,
as the device makes it.

After each launch, ``queue_flag`` queues the barrier's error flag's copy into a pinned word of
that step's own and returns a ``BarrierCheck`` bound to this kernel: a step is judged by the
kernel that ran it and the flag as it stood when that step ended, never by whatever the
model uses when the host gets round to asking. The device flag is sticky (nothing clears
it), so a step already queued behind a failed one reads it set as well: its barriers fell
through at once, and its tokens are as wrong as the failed step's.
"""
from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

from ..quant import FMT_F32, LANES, QK, Array
from . import _cuda_shim as shim
from . import grid_sync, residency
from . import step_kernel as sk
from ._cuda_shim import SIM, StreamArg, cuda
from .step_geometry import KERNEL

SIM_BLOCKS = 2  # blocks under the simulator: enough to exercise the grid-stride loops
# Matmul items split-K aims at (step_geometry.k_splits_for): matmul_items_per_sm per block,
# under the simulator too, whose two blocks rarely need a split; ``split_target`` may be
# raised to SPLIT_ALL (before the first step) to split K as far as it goes, as the
# simulator's equality tests do so that the split reduction runs.
SPLIT_ALL = 1 << 20
# How a step's stages are cut into launches (ZEROLAYER_CUDA_STEP_LAUNCH): "step", one launch
# and a grid barrier between stages (the default); "layer", a launch per layer (barriers
# within it: 2 + n_layer nodes); "stage", a launch per stage and no barrier at all. The same
# kernel and the same results: what differs is barriers against launch gaps, which only a
# GPU can weigh (the GPU check times each).
SPLITS = ("step", "layer", "stage")
# Pinned flag words, used in turn: the engine has at most two steps in flight, so a word is
# reused only after the step that wrote it was waited for (as the ids' pinned pair).
FLAG_SLOTS = 2


def _words(fmt, qs, d, m, w, L: int, stream, scales: type):
    """A weight's device arrays as the kernel takes them, each flat (a view: no copy), and
    its dims row [row groups, K blocks, bytes per block, rows, K]: qs as weight_layout.device_words gave it;
    unused arrays as one-element placeholders (d and m of the kernel's
    scale type). Flat arrays and plain dims keep the kernel from carrying six weights'
    shapes through its stage switch (registers)."""
    if fmt == FMT_F32:
        z1 = cuda.to_device(np.zeros(1, np.uint32), stream=stream)
        s1 = cuda.to_device(np.zeros(1, scales), stream=stream)
        R, K = int(w.shape[1]), int(w.shape[2])
        return (z1, s1, s1, w.reshape(-1), fmt), [0, -(-K // 32), 0, R, K]
    G, nb, bs = int(qs.shape[1]), int(qs.shape[2]), int(qs.shape[4])   # device_words' shape
    f1 = cuda.to_device(np.zeros(1, np.float32), stream=stream)
    return ((qs.reshape(-1), d.reshape(-1), m.reshape(-1), f1, fmt),
            [G, nb, bs, G * LANES, nb * QK])


class FusedRefused(RuntimeError):
    """The fused kernel's grid could not be guaranteed co-resident here (residency.py)."""


class FusedStep:
    """Device state of the fused step kernel for one CudaForward. On a device, it is
    refused (FusedRefused) unless its grid fits the device, it launches cooperatively, and
    it is the device's only fused kernel (residency.py)."""

    def __init__(self, fwd, full: dict, stream, scales: type = np.float32):
        c = fwd.cfg
        self.cfg, self.stream = c, stream
        L = c.n_layer
        self.weights, dims = [], []
        for name in ("wqkv", "wo", "wgu", "wdown", "emb", "output"):
            fmt, arrs = full[name]
            arrays, dim = _words(fmt, *arrs, L if name not in ("emb", "output") else 1, stream,
                                 scales)
            self.weights.append(arrays)
            dims.append(dim)
        self.wdim = cuda.to_device(np.array(dims, np.int32), stream=stream)
        # every layer's attention and FFN norm weights, then the output norm's: one array
        self.norms = cuda.to_device(np.concatenate(
            [fwd.attn_norm_full.copy_to_host(), fwd.ffn_norm_full.copy_to_host(),
             fwd.out_norm.copy_to_host()[None]]).astype(np.float32), stream=stream)
        qb = fwd.qkv_bias_full
        self.has_bias = qb is not None
        self.qkv_bias = qb if qb is not None else cuda.to_device(np.zeros((L, 1), np.float32), stream=stream)
        self.blocks = SIM_BLOCKS if SIM else fwd.sms
        self.split_target = KERNEL.matmul_items_per_sm * self.blocks
        self.split = os.environ.get("ZEROLAYER_CUDA_STEP_LAUNCH", "step")
        if self.split not in SPLITS:
            raise ValueError(f"ZEROLAYER_CUDA_STEP_LAUNCH={self.split!r}: one of {SPLITS}")
        self.claim = None
        if not SIM:  # (the simulator runs stages one launch each: no barrier to guard)
            dev = cuda.get_current_device()
            # The kernels are compiled lazily, at their first launch: compiled here, for the
            # signature the launches will match, so that the residency checks see them and
            # the launches find them marked cooperative.
            sig = sk.signature(scales)
            got = residency.reserve([sk.STEP[tt].raw.compile(sig) for tt in sk.TOKEN_TILES],
                                    self.blocks, sk.THREADS, str(getattr(dev, "uuid", dev.id)))
            if isinstance(got, str):
                raise FusedRefused(got)
            self.claim = got
        self.bar = grid_sync.new_state()
        self.flag_host = (cuda.pinned_array((FLAG_SLOTS, 1), np.int32) if not SIM
                          else np.zeros((FLAG_SLOTS, 1), np.int32))
        self._flag_turn = 0
        self._cap, self._cap_target = 0, 0

    def scratch(self, T: int):
        """For T tokens: per-(token, KV head) merge counters, per-row argmax keys, and the
        split-K partial sums and their per-(token tile, row group) counters."""
        if T > self._cap or self._cap_target != self.split_target:
            c, s = self.cfg, self.stream
            cap = max(16, 1 << (T - 1).bit_length())
            self.cnt = cuda.to_device(np.zeros(cap * c.n_kv, np.int32), stream=s)
            self.best = cuda.device_array(cap, np.int64, stream=s)
            rows = max((c.n_head + 2 * c.n_kv) * c.head_dim, c.d_model, c.n_ff, c.vocab)
            tiles = max(1, -(-cap // sk.TOKEN_TILES[-1]))
            # K is split only while a stage has fewer (tile, row group) items than the target;
            # two sets, for two stages that may run at once (step_kernel: D and E)
            groups = 2 * min(-(-rows // sk.ROWS) * tiles, self.split_target)
            self.pmm = cuda.device_array((groups * sk.K_SPLITS, 2 * sk.ROWS + 1, sk.TOKEN_TILES[-1]),
                                         np.float32, stream=s)
            self.mcnt = cuda.to_device(np.zeros(groups, np.int32), stream=s)
            # ready counters per (layer, token tile): the kernel clears them each step
            self.rdy = cuda.device_array(c.n_layer * tiles * (c.n_kv + c.n_ff // sk.ROWS + 1),
                                         np.int32, stream=s)
            self._cap, self._cap_target = cap, self.split_target
        return self.cnt, self.best

    def splits(self, T: int, max_blocks: int | None = None) -> int:
        """Attention splits: about KERNEL.attention_items_per_sm work items per block; no
        more than the KV blocks of the longest sequence when that is known (a graph fixes
        splits for every context)."""
        want = max(1, -(-KERNEL.attention_items_per_sm * self.blocks // (T * self.cfg.n_kv)))
        return want if max_blocks is None else max(1, min(want, max_blocks))

    def launch(self, fwd, d_tok, d_seq, d_pos, d_rows, d_tab, splits: int, part, s, events=None):
        """Queue the step on stream s; returns (logits [n_out, vocab], argmax keys [n_out]).
        events: a list to receive a timing event recorded after each launch (one first),
        with a launch per stage (the "stage" cut), for CudaForward.stage_times."""
        c = self.cfg
        T, n_out = d_tok.shape[0], d_rows.shape[0]
        TT = 1 if T == 1 else sk.TOKEN_TILES[-1]
        cnt, best = self.scratch(T)
        part_o, part_m, part_l = part
        x, q, att, h, logits = fwd.activations(T, n_out)
        w = [a for wt in self.weights for a in wt]
        args = (*w, self.wdim, self.norms, self.qkv_bias,
                self.has_bias, fwd.cos, fwd.sin, fwd.k_pool, fwd.v_pool,
                d_tok, d_seq, d_pos, d_rows, d_tab,
                x, q, att, h, logits, part_o, part_m, part_l,
                cnt, best[:max(n_out, 1)], self.pmm, self.mcnt, self.rdy, self.bar,
                c.n_head, c.n_kv, c.head_dim, c.n_ff, np.float32(c.eps),
                np.float32(1.0 / np.sqrt(c.head_dim)), splits, self.split_target)
        k = sk.STEP[TT]
        n_st = sk.stage_count(c.n_layer)
        if n_out == 0:
            n_st -= 1  # no LM head stage
        ranges = self.launches(n_st) if events is None else [(i, i + 1) for i in range(n_st)]
        if events is not None:
            events.append(cuda.event(timing=True))
            events[-1].record(s)
        for lo, hi in ranges:
            if SIM:  # one stage per launch: the launch boundary is the barrier
                shim.LAUNCHES[k.name] += 1
                for st in range(lo, hi):
                    k.raw[self.blocks, sk.THREADS, s](*args, st, st + 1)
            else:
                k[self.blocks, sk.THREADS, s](*args, lo, hi)
            if events is not None:
                events.append(cuda.event(timing=True))
                events[-1].record(s)
        return logits, best[:n_out]

    def launches(self, n_st: int) -> list[tuple[int, int]]:
        """The [first, last) stage ranges of a step's launches, by self.split."""
        if self.split == "step":
            return [(0, n_st)]
        if self.split == "stage":
            return [(i, i + 1) for i in range(n_st)]
        per = sk.STAGES_PER_LAYER  # embed with layer 0; the LM head alone
        cuts = [0] + [1 + per * (i + 1) for i in range(self.cfg.n_layer)] + [n_st]
        return [(a, b) for a, b in zip(cuts, cuts[1:]) if a < b]

    def queue_flag(self, s: StreamArg) -> BarrierCheck:
        """Queue the barrier's error flag's copy into the next pinned word, after the step
        just queued on stream s; the returned check reads that word once s is past it."""
        self._flag_turn = (self._flag_turn + 1) % FLAG_SLOTS
        word = self.flag_host[self._flag_turn]
        word[0] = 0
        self.bar[2:3].copy_to_host(word, stream=s)
        return BarrierCheck(self, word)

    def inject_barrier_failure(self, s: StreamArg) -> None:
        """Set the error flag, in stream order on s, as a block that gave up waiting at a
        barrier would: the fault the host must catch, made on purpose (the simulator's
        blocks never wait at a barrier, and a device's only when the grid isn't resident)."""
        self.bar[2:3].copy_to_device(np.ones(1, np.int32), stream=s)


class BarrierCheck:
    """One launched step's verdict: the fused kernel that ran it and the pinned word its
    barrier flag was copied into (read after the step's stream work is done)."""

    def __init__(self, fused: FusedStep, word: Array):
        self.fused, self.word = fused, word

    def failed(self) -> bool:
        return bool(self.word[0])


def decode_argmax(keys: npt.ArrayLike) -> npt.NDArray[np.int32]:
    """The row indices in argmax keys (step_kernel.argmax_key), on the host."""
    return (4294967295 - (np.asarray(keys, np.int64) & 0xFFFFFFFF)).astype(np.int32)
