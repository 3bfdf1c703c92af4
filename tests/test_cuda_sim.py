"""Every CUDA kernel (gpu/cuda/) under Numba's CUDA simulator, against its CPU twin.

The simulator has to be switched on before ``numba.cuda`` is first imported, and it runs a
kernel as plain Python threads; so the cases run in one child process (this file run as a
script with ZEROLAYER_GPU_BACKEND=sim) and this pytest process only compares the numbers it
reports. Nothing here imports numba.cuda into the test process.

Tiny shapes, but each chosen to reach the kernels' edges: rows not a multiple of the 64-row
groups, K blocks not a multiple of the K split, token counts across the 8-token tiles,
sequences across KV blocks, empty flash-decoding splits, GQA groups > 1.

Tolerance: max |gpu - cpu| / max |cpu| (both float32 kernels, different summation orders).
TOL = 1e-5 for reductions (matmul, rmsnorm, attention), 1e-6 for elementwise ops, and exact
equality for pure copies (kv_write). The CPU twins themselves are checked against float64
references in tests/test_ops.py.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import pytest

import gpu_children

CASES = [
    "shim_reductions", "rmsnorm", "rope", "swiglu", "add",
    "embed_q4_1", "embed_q4_0", "embed_q8_0", "embed_f32",
    *[f"matmul_{qt}_T{T}" for qt in ("q4_1", "q4_0", "q8_0", "f16") for T in (1, 3, 11)],
    "kv_write", "attention_splits1", "attention_splits3", "attention_gqa1",
    "forward_tiny_model", "backend_prefix_tokens", "mapped_ring_token_ids",
    "sample_greedy", "sample_filtered", "penalties", "logprobs",
    "sample_masked",  # last: the cases before it draw from the shared rng as they always did
]
# The daemon's engine on the simulated CUDA model: whole steps of a whole (tiny) model, which
# the simulator runs slowly (minutes), so in a child of its own with its own time limit.
ENGINE_CASES = ["engine_overlap", "engines_two_on_one_device", "engine_logprobs",
                "engine_structured"]
TOL = {"kv_write": 0.0, "forward_tiny_model": 1e-4, "backend_prefix_tokens": 0.0,
       "mapped_ring_token_ids": 0.0, "sample_greedy": 0.0, "engine_overlap": 0.0,
       "engines_two_on_one_device": 0.0, "engine_logprobs": 1e-3, "sample_masked": 1e-5,
       "engine_structured": 0.0}
ELEMENTWISE = ("rope", "swiglu", "add", "embed_")
CHILD_TIMEOUT_S = 900  # generous: the simulator is slow, more so on a busy machine
ENGINE_CHILD_TIMEOUT_S = 1200


def tol(case: str) -> float:
    if case in TOL:
        return TOL[case]
    return 1e-6 if case.startswith(ELEMENTWISE) else 1e-5


def _env(cases: list[str]) -> dict[str, str]:
    return gpu_children.sim_env(ZEROLAYER_SIM_CASES=",".join(cases))


def early_children(items: list[pytest.Item]) -> list[tuple[str, dict[str, str]]]:
    """(key, env) of each child the selected tests need (tests/gpu_children.py)."""
    names = {i.name for i in items}
    out = [("cases", _env(CASES))] if any("sim_results" in i.fixturenames for i in items) else []
    return out + [(c, _env([c])) for c in ENGINE_CASES
                  if f"test_engine_on_the_simulated_device[{c}]" in names]


@pytest.fixture(scope="module")
def sim_results() -> dict:
    return gpu_children.result(__file__, "cases", _env(CASES), CHILD_TIMEOUT_S)


def test_child_ran_under_the_simulator(sim_results):
    assert sim_results["_sim"] is True
    assert sorted(k for k in sim_results if not k.startswith("_")) == sorted(CASES)


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_cpu_twin(sim_results, case):
    r = sim_results[case]
    assert "error" not in r, r.get("error")
    assert r["err"] <= tol(case), f"{case}: rel err {r['err']:.3g} > {tol(case):g} ({r})"


@pytest.mark.parametrize("case", ENGINE_CASES)
def test_engine_on_the_simulated_device(case):
    r = gpu_children.result(__file__, case, _env([case]), ENGINE_CHILD_TIMEOUT_S)[case]
    assert "error" not in r, r.get("error")
    assert r["err"] <= tol(case), f"{case}: {r['err']:.3g} > {tol(case):g} ({r})"


# ---------------------------------------------------------------- the child (simulator) side

def _child() -> None:
    sys.setswitchinterval(1e-4)  # the simulator's threads hand over much faster
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as QT

    from zerolayer.gpu import quant
    from zerolayer.gpu.cuda import _cuda_shim as shim
    from zerolayer.gpu.cuda import attention as cu_att
    from zerolayer.gpu.cuda import embedding as cu_emb
    from zerolayer.gpu.cuda import matmul as cu_mm
    from zerolayer.gpu.cuda import rmsnorm as cu_rms
    from zerolayer.gpu.cuda import rope as cu_rope
    from zerolayer.gpu.cuda import swiglu as cu_sw
    from zerolayer.gpu.cuda.weight_layout import device_layer
    from zerolayer.gpu.ops import attention as cpu_att
    from zerolayer.gpu.ops.embedding import embed
    from zerolayer.gpu.ops.matmul import matmul
    from zerolayer.gpu.ops.rmsnorm import rmsnorm
    from zerolayer.gpu.ops.rope import rope, rope_tables
    from zerolayer.gpu.ops.swiglu import swiglu

    rng = np.random.default_rng(int(os.environ.get("ZEROLAYER_SIM_SEED", "0")))
    f32 = np.float32
    QTS = {"q4_1": QT.Q4_1, "q4_0": QT.Q4_0, "q8_0": QT.Q8_0, "f16": QT.F16, "f32": QT.F32}

    def rel(gpu, cpu) -> float:
        gpu, cpu = np.asarray(gpu, np.float64), np.asarray(cpu, np.float64)
        assert gpu.shape == cpu.shape and np.isfinite(gpu).all()
        return float(np.abs(gpu - cpu).max() / max(np.abs(cpu).max(), 1e-30))

    def weight(qt, rows, cols):
        w = rng.standard_normal((rows, cols)).astype(f32)
        raw = gguf.quants.quantize(w, qt) if qt not in (QT.F32, QT.F16) else w.astype(
            np.float16 if qt == QT.F16 else f32)
        return quant.stack([quant.repack(raw, rows, cols, qt)]).layer(0)

    def case_rmsnorm():
        x = rng.standard_normal((3, 96)).astype(f32) * 3
        w = rng.standard_normal(96).astype(f32)
        y0, y1 = np.empty_like(x), np.full_like(x, np.nan)
        rmsnorm(x, w, f32(1e-5), y0)
        cu_rms.rmsnorm(x, w, f32(1e-5), y1, threads=64)
        return rel(y1, y0)

    def case_rope():
        n_heads, hd = 3, 16
        cos, sin = rope_tables(128, hd, 10000.0)
        pos = rng.integers(0, 128, 4).astype(np.int32)
        x = rng.standard_normal((4, 8 + n_heads * hd + 5)).astype(f32)
        x0, x1 = x.copy(), x.copy()
        rope(x0, 8, pos, cos, sin, n_heads, hd)
        cu_rope.rope(x1, 8, pos, cos, sin, n_heads, hd, threads=64)
        return rel(x1, x0)

    def case_swiglu():
        gu = rng.standard_normal((3, 80)).astype(f32) * 4
        h0, h1 = np.empty((3, 40), f32), np.full((3, 40), np.nan, f32)
        swiglu(gu, h0)
        cu_sw.swiglu(gu, h1, threads=64)
        return rel(h1, h0)

    def case_add():
        x = rng.standard_normal((3, 50)).astype(f32)
        y = rng.standard_normal((3, 50)).astype(f32)
        x1 = x.copy()
        cu_sw.add(x1, y, threads=64)
        return rel(x1, x + y)

    def case_embed(qt):
        wt = weight(QTS[qt], 130, 64)  # 130 rows: 3 row groups, the last one padded
        tokens = np.array([0, 129, 64, 63, 7], np.int32)
        x0, x1 = np.empty((5, 64), f32), np.full((5, 64), np.nan, f32)
        embed(*wt, tokens, x0)
        cu_emb.embed(*device_layer(*wt), tokens, x1, threads=64)
        return rel(x1, x0)

    def case_matmul(qt, T):
        # 100 rows: a padded row group; 192 cols: 6 K blocks over a K split of 4
        wt = weight(QTS[qt], 100, 192)
        x = rng.standard_normal((T, 192)).astype(f32)
        y0, y1 = np.empty((T, 100), f32), np.full((T, 100), np.nan, f32)
        matmul(*wt, x, y0)
        cu_mm.matmul(*device_layer(*wt), x, y1)
        return rel(y1, y0)

    # attention: two sequences in one step, as the engine lays them out: the last 3 prompt
    # positions of a 70-token sequence (2 KV blocks) and one decode token of a 6-token one
    def attn_setup(n_head, n_kv, hd):
        BT = cpu_att.BLOCK_TOKENS
        lens = (70, 6)
        n_blocks, max_blk = 6, 2
        tables = np.array([[4, 1], [2, 0]], np.int32)  # non-contiguous, out-of-order blocks
        tok_seq = np.array([0, 0, 0, 1], np.int32)
        tok_pos = np.array([67, 68, 69, 5], np.int32)
        k_pool = rng.standard_normal((n_blocks, 2, n_kv, hd, BT)).astype(f32)  # history
        v_pool = rng.standard_normal((n_blocks, 2, n_kv, BT, hd)).astype(f32)
        qkv = rng.standard_normal((4, (n_head + 2 * n_kv) * hd)).astype(f32)
        assert max(lens) <= max_blk * BT
        return qkv, k_pool, v_pool, tok_seq, tok_pos, tables

    def case_kv_write():
        n_head, n_kv, hd = 4, 2, 16
        qkv, k_pool, v_pool, tok_seq, tok_pos, tables = attn_setup(n_head, n_kv, hd)
        k0, v0, k1, v1 = k_pool.copy(), v_pool.copy(), k_pool.copy(), v_pool.copy()
        cpu_att.kv_write(qkv, k0, v0, 1, tok_seq, tok_pos, tables, n_head, n_kv, hd)
        cu_att.kv_write(qkv, k1, v1, 1, tok_seq, tok_pos, tables, n_head, n_kv, hd, threads=64)
        assert not np.array_equal(k0, k_pool)  # the write did something
        return max(rel(k1, k0), rel(v1, v0))

    def case_attention(splits, n_head=4, n_kv=2, hd=16):
        qkv, k_pool, v_pool, tok_seq, tok_pos, tables = attn_setup(n_head, n_kv, hd)
        cpu_att.kv_write(qkv, k_pool, v_pool, 1, tok_seq, tok_pos, tables, n_head, n_kv, hd)
        T = qkv.shape[0]
        out0, out1 = np.empty((T, n_head * hd), f32), np.full((T, n_head * hd), np.nan, f32)
        cpu_att.attention(qkv, k_pool, v_pool, 1, tok_seq, tok_pos, tables, n_head, n_kv, hd,
                          splits, out0)
        part = (np.full((T, n_head, splits, hd), np.nan, f32),
                np.full((T, n_head, splits), np.nan, f32), np.full((T, n_head, splits), np.nan, f32))
        cu_att.attention(qkv, k_pool, v_pool, 1, tok_seq, tok_pos, tables, n_head, n_kv, hd,
                         splits, out1, part=part)
        return rel(out1, out0)

    def case_shim_reductions():
        n = 96  # 3 warps
        x = rng.standard_normal(n).astype(f32)
        ws, wm, bs = (np.full(n, np.nan, f32) for _ in range(3))
        shim.selftest[1, n](x, ws, wm, bs)
        w = x.reshape(3, 32)
        return max(rel(ws, np.repeat(w.sum(1), 32)), rel(wm, np.repeat(w.max(1), 32)),
                   rel(bs, np.full(n, x.sum())))

    def case_forward_tiny_model():
        """The whole forward pass (gpu/cuda/forward.py) against the CPU model's logits, on the
        tiny GGUF: a step of two prompts, then a step of two decode tokens. (Its Q|K|V is
        kept in one format, so the simulator runs the Q4 matmul there instead of 16 blocks
        of the widened F32 one: the F32 path has its own cases above.)"""
        import tempfile

        from gguf import GGMLQuantizationType as QT

        from tiny_gguf import write_tiny_llama
        from zerolayer.gpu.cuda.forward import CudaModel
        from zerolayer.gpu.model import LlamaModel, StepInput

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tiny.gguf")
            write_tiny_llama(path, override={"attn_v": QT.Q4_1})
            kw = dict(use_cache=False, max_seq_len=128, kv_blocks=4)
            cpu, gpu = LlamaModel.load(path, **kw), CudaModel(LlamaModel.load(path, **kw))
        seqs = {m: [m.new_sequence(), m.new_sequence()] for m in (cpu, gpu)}
        errs = []
        for toks in ([rng.integers(0, 200, 5), rng.integers(0, 200, 3)],
                     [rng.integers(0, 200, 1), rng.integers(0, 200, 1)]):
            out = [m.step([StepInput(s, t) for s, t in zip(seqs[m], toks)]) for m in (cpu, gpu)]
            errs.append(rel(out[1], out[0]))
        return max(errs)

    def case_backend_prefix_tokens():
        """What the daemon runs with ZEROLAYER_GPU_BACKEND=sim: gpu.backend chose the
        simulator, generate.on_backend wrapped the model in a CudaModel, and greedy decoding
        after a prefix-cache reuse (KV blocks copied within the *device* pools) gives the same
        tokens as the CPU model, greedy from host logits (step) and then sampled with the same
        draws (step_tokens: the device sampler vs the CPU one). Returns the fraction of tokens
        that differ."""
        import tempfile

        from gguf import GGMLQuantizationType as QT

        from tiny_gguf import write_tiny_llama
        from zerolayer.gpu import backend
        from zerolayer.gpu.generate import on_backend
        from zerolayer.gpu.model import LlamaModel, StepInput
        from zerolayer.gpu.prefix_cache import PrefixCache

        assert backend.NAME == "sim" and backend.ON_DEVICE, (backend.NAME, backend.REASON)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tiny.gguf")
            write_tiny_llama(path, override={"attn_v": QT.Q4_1})  # see forward_tiny_model
            kw = dict(use_cache=False, max_seq_len=64, kv_blocks=2)
            cpu, dev = LlamaModel.load(path, **kw), on_backend(LlamaModel.load(path, **kw))
        assert type(dev).__name__ == "CudaModel" and dev.arena.k_pool is dev.fwd.k_pool
        prompt = rng.integers(0, 200, 9).astype(np.int32)

        draws = [(0.0, 0, 1.0, 0.0), (0.9, 20, 0.95, 0.31), (1.2, 0, 0.8, 0.77), (0.7, 50, 1.0, 0.52)]

        def tokens(m):
            pc = PrefixCache(m.arena, min_tokens=4)
            first = m.new_sequence()  # a chunk that wants no logits, then the rest
            assert len(m.step_tokens([StepInput(first, prompt[:4], logits=False)], [])) == 0
            m.step([StepInput(first, prompt[4:])])
            pc.store(first, prompt)
            seq = m.new_sequence()
            seq.reserve(len(prompt) + len(draws) + 1)
            got = pc.reuse(prompt, seq)
            assert got == len(prompt) - 1, got
            out = [int(np.argmax(m.step([StepInput(seq, prompt[got:])])[0]))]  # step(): host logits
            for d in draws:  # step_tokens(): sampled where the logits are (on the device for dev)
                out.append(int(m.step_tokens([StepInput(seq, np.array(out[-1:], np.int32))], [d])[0]))
            return out

        a, b = tokens(cpu), tokens(dev)
        return float(np.mean(np.array(a) != np.array(b)))

    def case_engine_overlap():
        """The daemon's engine on the CUDA model, overlapped (step N+1 queued before step N's
        tokens are read back, its inputs taken from step N's device ids) against the plain
        path: 3 requests joining at different steps, chunked prefill, greedy and seeded
        sampling, ends at different steps (EOS off: each runs to its max_tokens), a cancel
        after the second token.
        Fails on any differing token; returns the largest difference in the KV of the
        positions each finished request left in the prefix cache (0 expected: the same
        kernels on the same inputs)."""
        import tempfile

        from tiny_gguf import write_tiny_llama
        from zerolayer.daemon.engine import Engine
        from zerolayer.daemon.request import Admitted, CancelReason, TextEvent
        from zerolayer.gpu.generate import on_backend
        from zerolayer.gpu.model import LlamaModel
        from zerolayer.protocol.sampling_params import SamplingParams

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tiny.gguf")
            write_tiny_llama(path, tokenizer=True)
            kw = dict(use_cache=False, max_seq_len=64, kv_blocks=16)
            models = [on_backend(LlamaModel.load(path, **kw)) for _ in range(2)]
        tok = models[0].tokenizer()
        tok._eos_ids = frozenset({-1})  # never stop early: every request runs to its max_tokens
        prompts = [rng.integers(3, 200, n).astype(np.int32) for n in (6, 11, 3, 5)]
        params = [SamplingParams(max_tokens=3), SamplingParams(max_tokens=6, temperature=0.8, seed=5),
                  SamplingParams(max_tokens=4, temperature=1.1, top_k=20, seed=9),
                  # penalties: overlapped, it waits a step for each token it must count
                  SamplingParams(max_tokens=4, repetition_penalty=1.4, frequency_penalty=0.7)]

        def run(model, overlap):
            got: dict = {}

            def emit(ev):
                if isinstance(ev, TextEvent):
                    got.setdefault(ev.req.key, []).append(ev.text)

            eng = Engine(model, tok, emit=emit, max_running=4, step_tokens=8, overlap=overlap,
                         prefix_entries=8)
            assert eng.overlap is overlap
            adm = [Admitted(k, sp) for k, sp in enumerate(params)]
            reqs = {k: eng.submit(adm[k], prompts[k]) for k in (0, 1, 3)}
            # (6 + 11 prompt tokens over a budget of 8: chunked prefill)
            for i in range(100):
                if i == 1:
                    reqs[2] = eng.submit(adm[2], prompts[2])
                if len(reqs[1].tokens) >= 2 and adm[1].cancel.reason is None:
                    # by the request's state, not the step count: overlapped, the tokens of
                    # step i are read at step i + 1
                    adm[1].cancel.reason = CancelReason.CLIENT
                if not eng.has_work and i > 1:
                    break
                eng.step()
            entries = {tuple(t.tolist()): s for t, s in eng.prefix._entries}
            return [reqs[k].tokens for k in range(len(prompts))], entries, model

        plain_tokens, plain_kv, m0 = run(models[0], False)
        over_tokens, over_kv, m1 = run(models[1], True)
        assert plain_tokens == over_tokens, (plain_tokens, over_tokens)
        bad = sum(a != b for a, b in zip(plain_tokens, over_tokens))
        # cancelled at the same step boundary in both: the same tokens so far
        assert set(plain_kv) == set(over_kv), (list(plain_kv), list(over_kv))
        kv_err = 0.0
        for toks, sa in plain_kv.items():
            sb = over_kv[toks]
            for pool in ("k_pool", "v_pool"):
                pa = getattr(m0.arena, pool).copy_to_host()
                pb = getattr(m1.arena, pool).copy_to_host()
                for pos in range(len(toks)):
                    ba, bb, o = sa.table[pos // 64], sb.table[pos // 64], pos % 64
                    xa = pa[ba, ..., o] if pool == "k_pool" else pa[ba, :, :, o, :]
                    xb = pb[bb, ..., o] if pool == "k_pool" else pb[bb, :, :, o, :]
                    kv_err = max(kv_err, float(np.abs(xa - xb).max()))
        return bad + kv_err

    def case_engines_two_on_one_device():
        """[[engines]] on the CUDA backend: two engines on one simulated device,
        each a CudaModel over its own copy of one host model (daemon/engines.py: the weights
        shared, a KV arena each; the device selected first, as the daemon's engine threads
        do), their steps interleaved so that any device state they shared would corrupt the
        other's tokens. Each must give the tokens one engine alone gives; returns the number
        of engines that differ. (Interleaved on one thread, not concurrent: the simulator
        swaps module globals while a kernel runs, so two threads running kernels at once
        disturb each other there, which a GPU, each engine on its own stream, does not.)"""
        import tempfile

        from tiny_gguf import write_tiny_llama
        from zerolayer.daemon.engine import Engine
        from zerolayer.daemon.engines import sibling_model
        from zerolayer.daemon.request import Admitted
        from zerolayer.gpu.generate import on_backend
        from zerolayer.gpu.model import LlamaModel
        from zerolayer.protocol.sampling_params import SamplingParams

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tiny.gguf")
            write_tiny_llama(path, tokenizer=True)
            base = LlamaModel.load(path, use_cache=False, max_seq_len=64, kv_blocks=8)
        tok = base.tokenizer()
        tok._eos_ids = frozenset({-1})  # every request runs to its max_tokens
        prompts = [rng.integers(3, 200, n).astype(np.int32) for n in (5, 9)]
        params = [SamplingParams(max_tokens=3),
                  SamplingParams(max_tokens=3, temperature=0.9, seed=7)]

        def engine(model):
            eng = Engine(model, tok, emit=lambda ev: None, max_running=2, step_tokens=16)
            reqs = [eng.submit(Admitted(k, sp), p)
                    for k, (p, sp) in enumerate(zip(prompts, params))]
            return eng, reqs

        shim.cuda.select_device(0)
        eng, reqs = engine(on_backend(sibling_model(base, 8)))
        while eng.has_work:
            eng.step()
        alone = [r.tokens for r in reqs]
        models = [on_backend(sibling_model(base, 8)) for _ in range(2)]
        assert models[0].arena is not models[1].arena
        assert models[0].arena.k_pool is not models[1].arena.k_pool
        assert models[0].model.w is models[1].model.w is base.w  # one host copy of the weights
        pair = [engine(m) for m in models]
        while any(e.has_work for e, _ in pair):
            for e, _ in pair:
                if e.has_work:
                    e.step()
        return sum([r.tokens for r in rs] != alone for _, rs in pair)

    def case_mapped_ring_token_ids():
        """The flow of the mapped ring (gpu/cuda/mapped_ring.py), with cuda.mapped_array as
        the UMEM: an INVOKE carrying token ids arrives in a frame (Ethernet/IPv4/UDP, so the
        payload is not 4-byte aligned); a kernel reads the ids out of the frame; another
        writes ids into a TX frame, which the host reads in place. Returns the fraction of
        wrong ids."""
        from fixtures.packets import udp4
        from zerolayer.gpu.cuda import mapped_ring as mr
        from zerolayer.protocol import wire

        umem = shim.cuda.mapped_array(4 * 4096, dtype=np.uint8)
        umem[:] = 0
        ring = mr.MappedHostBuffer(umem)
        ids = rng.integers(0, 49152, 37).astype(np.int64)
        body = wire.encode_invoke_body(wire.SamplingParams(max_tokens=4), wire.PayloadKind.TOKEN_IDS,
                                       wire.encode_token_ids(ids))
        (dg,) = wire.encode_invoke(1, b"k" * 32, bytes(16), 1, bytes(32), body)
        frame = udp4(dg, 7433)
        base = 2 * 4096
        umem[base:base + len(frame)] = np.frombuffer(frame, np.uint8)
        first = base + 42 + wire.HEADER_LEN[wire.MsgType.INVOKE] + wire.PARAMS_LEN
        offsets = (first + 4 * np.arange(len(ids))).astype(np.int64)
        got = np.zeros(len(ids), np.int32)
        mr.gather_token_ids(ring.device, offsets, got)
        bad = int((got != ids).sum())
        tx = (3 * 4096 + 43 + 4 * np.arange(len(ids))).astype(np.int64)  # odd offset on purpose
        mr.write_token_ids(got, ring.device, tx)
        back = np.frombuffer(bytes(umem[3 * 4096 + 43:3 * 4096 + 43 + 4 * len(ids)]), "<u4")
        bad += int((back != ids).sum())
        return bad / (2 * len(ids))

    def case_sample_greedy():
        """temperature 0 and top_k 1 are argmax, the first index on ties (as numpy)."""
        from zerolayer.gpu.cuda import sampling as cu_smp
        logits = rng.standard_normal((3, 1000)).astype(np.float32)
        logits[1, 17] = logits[1, 900] = 50.0
        out = np.zeros(3, np.int32)
        cu_smp.argmax_rows(logits, out)
        bad = int((out != logits.argmax(axis=1)).sum())
        params = cu_smp.pack_params([(0.8, 1, 0.9, 0.5)] * 3)
        cu_smp.sample_rows(logits, params, out)
        return (bad + int((out != logits.argmax(axis=1)).sum())) / 6

    def case_sample_filtered():
        """Temperature / top-k / top-p rows, with tied logits at the cuts: the kept
        distribution against the float64 reference (max abs error), and the drawn token
        against the CPU twin's for the same u (any mismatch counts 1)."""
        from zerolayer.gpu.cuda import sampling as cu_smp
        from zerolayer.gpu.ops.sampling import sample, sample_probs_ref
        V = 300
        cfgs = [(0.7, 0, 1.0), (1.0, 40, 1.0), (0.8, 0, 0.9), (1.3, 50, 0.5), (0.5, 0, 0.05),
                (1.0, 12, 1.0), (1.0, 299, 0.95), (2.0, 1000, 0.7)]
        logits = (rng.standard_normal((len(cfgs), V)) * 3).astype(np.float32)
        logits[5, 100:130] = logits[5, 7]  # 31 equal logits straddling the top-12 cut
        logits[6, :] = np.round(logits[6, :])  # many ties everywhere
        draws, refs = [], []
        for r, (t, k, p) in enumerate(cfgs):
            ref = sample_probs_ref(logits[r], t, k, p)
            cdf = np.cumsum(ref)
            while True:  # a draw not within float32 rounding of a boundary
                u = float(np.float32(rng.random()))
                if np.abs(cdf - u).min() > 1e-4:
                    break
            draws.append((t, k, p, u))
            refs.append(ref)
        out = np.zeros(len(cfgs), np.int32)
        probs = np.zeros((len(cfgs), V), np.float32)
        cu_smp.sample_rows(logits, cu_smp.pack_params(draws), out, probs)
        err = float(np.abs(probs - np.array(refs)).max())
        wrong = sum(int(out[r]) != sample(logits[r], *d) for r, d in enumerate(draws))
        return err + wrong

    def case_sample_masked():
        """Token masks (constrained decoding) given to the sampler for some rows only, not in
        order, greedy and filtered, a mask of one token, one of all but one: the drawn token
        against the CPU twin's (mask, then sample; any mismatch counts 1, as does a drawn
        token the mask forbids), the kept distribution against the float64 reference of the
        masked row, and the rows without a mask left exactly as they were."""
        from zerolayer.gpu.cuda import sampling as cu_smp
        from zerolayer.gpu.ops.sampling import sample, sample_probs_ref
        from zerolayer.gpu.ops.token_mask import allowed, masked
        V = 300
        W = (V + 31) // 32
        cfgs = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 40, 0.9), (1.0, 0, 1.0), (0.0, 0, 1.0),
                (1.3, 0, 0.5)]
        logits = (rng.standard_normal((len(cfgs), V)) * 3).astype(np.float32)
        rows = np.array([4, 1, 2, 5], np.int32)             # rows 0 and 3 are free
        words = rng.integers(0, 1 << 32, (4, W), dtype=np.uint64).astype(np.uint32)
        words[1] = 0
        words[1, 7] = 1 << 3                                # token 227 alone
        words[2] = 0xFFFFFFFF
        words[2, 0] = 0xFFFFFFFE                            # all but token 0
        cpu = logits.copy()
        for r, w in zip(rows, words):
            cpu[r] = masked(cpu[r], w)
        draws, refs = [], []
        for r, (t, k, p) in enumerate(cfgs):
            ref = (sample_probs_ref(cpu[r], t, k, p) if t > 0 else
                   np.eye(V)[int(np.argmax(cpu[r]))])
            cdf = np.cumsum(ref)
            while True:
                u = float(np.float32(rng.random()))
                if np.abs(cdf - u).min() > 1e-4:
                    break
            draws.append((t, k, p, u))
            refs.append(ref)
        out = np.zeros(len(cfgs), np.int32)
        probs = np.zeros((len(cfgs), V), np.float32)
        dev = logits.copy()
        cu_smp.sample_rows(dev, cu_smp.pack_params(draws), out, probs, mask=(rows, words))
        wrong = sum(int(out[r]) != sample(cpu[r], *d) for r, d in enumerate(draws))
        wrong += sum(not allowed(w, V)[out[r]] for r, w in zip(rows, words))
        wrong += int(out[1] != 227) + int(not (dev[[0, 3]] == logits[[0, 3]]).all())
        return float(np.abs(probs - np.array(refs)).max()) + wrong

    def case_engine_structured():
        """The engine on the simulated device (overlapped steps) with constrained requests
        (a JSON schema greedy, json_object sampled) beside a free one, in one batch: the
        same tokens as the engine on the CPU model, and every constrained token allowed by
        its grammar (the engine fails a request whose token its matcher refuses)."""
        import tempfile

        from tiny_gguf import write_tiny_llama
        from zerolayer.daemon.engine import Engine
        from zerolayer.daemon.request import Admitted, FailedEvent
        from zerolayer.gpu.generate import on_backend
        from zerolayer.gpu.model import LlamaModel
        from zerolayer.protocol.constraint import Constraint, ConstraintKind
        from zerolayer.protocol.sampling_params import SamplingParams

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tiny.gguf")
            write_tiny_llama(path, tokenizer=True)
            kw = dict(use_cache=False, max_seq_len=64, kv_blocks=16)
            cpu = LlamaModel.load(path, **kw)
            dev = on_backend(LlamaModel.load(path, **kw))
        tok = cpu.tokenizer()
        schema = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(
            {"type": "object", "properties": {"a": {"enum": ["x", "yy"]}, "b": {"type": "integer"}},
             "required": ["a", "b"], "additionalProperties": False}))
        prompts = [rng.integers(3, 200, n).astype(np.int32) for n in (5, 7, 4)]
        params = [SamplingParams(max_tokens=9, constraint=schema),
                  SamplingParams(max_tokens=4),
                  SamplingParams(max_tokens=7, temperature=0.9, seed=3,
                                 constraint=Constraint(ConstraintKind.JSON_OBJECT))]

        def run(model, overlap):
            failed: list = []

            def emit(ev):
                if isinstance(ev, FailedEvent):
                    failed.append(ev.message)
            eng = Engine(model, tok, emit=emit, max_running=4, step_tokens=16, overlap=overlap)
            reqs = [eng.submit(Admitted(k, sp), p)
                    for k, (p, sp) in enumerate(zip(prompts, params))]
            while eng.has_work:
                eng.step()
            assert not failed, failed
            return [r.tokens for r in reqs]

        cpu_tokens = run(cpu, False)
        dev_tokens = run(dev, True)
        assert cpu_tokens == dev_tokens, (cpu_tokens, dev_tokens)
        assert tok.decode(cpu_tokens[0]).startswith('{"a": "'), tok.decode(cpu_tokens[0])
        return 0.0

    def case_logprobs():
        """The logprob kernel over the rows that ask (not all of them, not in order), with
        ties at and around the top-N cut: the sampled token's logprob and the top N (ids in
        the float64 reference's order, values) against a float64 log-softmax. Returns the
        largest logprob difference, plus 1 per row whose ids differ."""
        from zerolayer.gpu.cuda import logprobs as cu_lp
        V = 300
        logits = (rng.standard_normal((5, V)) * 3).astype(np.float32)
        logits[1, 40:70] = logits[1].max()        # 30 ties for first place
        logits[3, :] = np.round(logits[3, :])     # ties everywhere
        sampled = rng.integers(0, V, 5).astype(np.int32)
        rows = np.array([3, 0, 1], np.int32)
        tops = np.array([20, 0, 7], np.int32)
        out_ids = np.zeros((3, cu_lp.WIDTH), np.int32)
        out_lps = np.zeros((3, cu_lp.WIDTH), np.float32)
        cu_lp.logprob_rows(logits, rows, tops, sampled, out_ids, out_lps)
        err, wrong = 0.0, 0
        for b, (r, n) in enumerate(zip(rows, tops)):
            z = logits[r].astype(np.float64)
            ref = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
            order = np.lexsort((np.arange(V), -ref))[:n]
            wrong += int(out_ids[b, 0] != sampled[r]) + int(
                out_ids[b, 1:1 + n].tolist() != order.tolist())
            err = max(err, abs(out_lps[b, 0] - ref[sampled[r]]),
                      float(np.abs(out_lps[b, 1:1 + n] - ref[order]).max(initial=0.0)))
        return err + wrong

    def case_engine_logprobs():
        """The engine on the simulated device (overlapped steps) with requests that ask for
        logprobs and one that does not, in one batch: the same tokens and entries as the
        engine on the CPU model. Returns the largest logprob difference (any other
        difference fails): the two models' float32 logits differ by about 1e-5 of their
        size (forward_tiny_model), which is the tolerance here, not the kernel's (the
        "logprobs" case checks that against float64)."""
        import tempfile

        from tiny_gguf import write_tiny_llama
        from zerolayer.daemon.engine import Engine
        from zerolayer.daemon.request import Admitted, TextEvent
        from zerolayer.gpu.generate import on_backend
        from zerolayer.gpu.model import LlamaModel
        from zerolayer.protocol import logprobs as lp
        from zerolayer.protocol.sampling_params import SamplingParams

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tiny.gguf")
            write_tiny_llama(path, tokenizer=True)
            kw = dict(use_cache=False, max_seq_len=64, kv_blocks=16)
            cpu = LlamaModel.load(path, **kw)
            dev = on_backend(LlamaModel.load(path, **kw))
        tok = cpu.tokenizer()
        tok._eos_ids = frozenset({-1})
        prompts = [rng.integers(3, 200, n).astype(np.int32) for n in (5, 7, 4)]
        params = [SamplingParams(max_tokens=4, logprobs=True, top_logprobs=5),
                  SamplingParams(max_tokens=3),
                  SamplingParams(max_tokens=4, temperature=0.9, seed=3, logprobs=True,
                                 top_logprobs=20, presence_penalty=0.5)]

        def run(model, overlap):
            got: dict = {}

            def emit(ev):
                if isinstance(ev, TextEvent):
                    p = got.setdefault(ev.req.key, lp.Positions())
                    for pos in ev.logprobs:
                        p.feed(lp.decode_entries(b"".join(pos)))
            eng = Engine(model, tok, emit=emit, max_running=4, step_tokens=16, overlap=overlap)
            reqs = [eng.submit(Admitted(k, sp), p)
                    for k, (p, sp) in enumerate(zip(prompts, params))]
            while eng.has_work:
                eng.step()
            return [r.tokens for r in reqs], {k: p.done for k, p in got.items()}

        cpu_tokens, cpu_lps = run(cpu, False)
        dev_tokens, dev_lps = run(dev, True)
        assert cpu_tokens == dev_tokens, (cpu_tokens, dev_tokens)
        assert not cpu_lps.get(1) and not dev_lps.get(1)   # it did not ask: no entries
        assert set(dev_lps) == set(cpu_lps)
        err = 0.0
        for k in (0, 2):
            assert len(dev_lps[k]) == len(cpu_tokens[k])
            for a, b in zip(cpu_lps[k], dev_lps[k]):
                assert a.token_id == b.token_id and a.token_bytes == b.token_bytes
                assert [x.token_id for x in a.top_logprobs] == [x.token_id for x in b.top_logprobs]
                err = max(err, abs(a.logprob - b.logprob),
                          *(abs(x.logprob - y.logprob)
                            for x, y in zip(a.top_logprobs, b.top_logprobs)))
        return err

    def case_penalties():
        """The penalty kernel against the CPU twin (gpu/ops/penalties.py): rows with and
        without penalties, ids in both lists, an empty output, zero logits."""
        from zerolayer.gpu.cuda import penalties as cu_pen
        from zerolayer.gpu.ops.penalties import PenaltyState, apply
        V = 500
        logits = (rng.standard_normal((6, V)) * 3).astype(np.float32)
        logits[:, :5] = 0.0
        specs = []
        for r, f in enumerate([(1.3, 0.0, 0.0), None, (1.0, 0.5, 0.25), (0.8, -1.0, 2.0),
                               (1.5, 0.2, 0.0), (1.2, 0.0, 1.0)]):
            if f is None:
                specs.append(None)
                continue
            st = PenaltyState(*f, rng.integers(0, V, 200))
            for t in rng.integers(0, V, 0 if r == 5 else 150):
                st.push(int(t))
            specs.append(st.spec())
        cpu = logits.copy()
        for row, p in zip(cpu, specs):
            if p is not None:
                apply(row, p)
        ints, floats = cu_pen.pack(specs)
        dev = logits.copy()
        cu_pen.apply_rows(dev, ints, floats)
        return float(np.abs(dev - cpu).max() / np.abs(cpu).max())

    runs = {"shim_reductions": case_shim_reductions, "rmsnorm": case_rmsnorm, "rope": case_rope,
            "swiglu": case_swiglu, "add": case_add,
            "kv_write": case_kv_write,
            "attention_splits1": lambda: case_attention(1),
            "attention_splits3": lambda: case_attention(3),  # seq 1 has 1 block: 2 empty splits
            "attention_gqa1": lambda: case_attention(2, n_head=2, n_kv=2, hd=32),
            "forward_tiny_model": case_forward_tiny_model,
            "backend_prefix_tokens": case_backend_prefix_tokens,
            "mapped_ring_token_ids": case_mapped_ring_token_ids,
            "sample_greedy": case_sample_greedy, "sample_filtered": case_sample_filtered,
            "penalties": case_penalties, "logprobs": case_logprobs,
            "sample_masked": case_sample_masked,
            "engine_logprobs": case_engine_logprobs, "engine_structured": case_engine_structured,
            "engine_overlap": case_engine_overlap,
            "engines_two_on_one_device": case_engines_two_on_one_device}
    for qt in ("q4_1", "q4_0", "q8_0", "f32"):
        runs[f"embed_{qt}"] = (lambda q: lambda: case_embed(q))(qt)
    for qt in ("q4_1", "q4_0", "q8_0", "f16"):
        for T in (1, 3, 11):
            runs[f"matmul_{qt}_T{T}"] = (lambda q, t: lambda: case_matmul(q, t))(qt, T)
    assert sorted(runs) == sorted(CASES + ENGINE_CASES)

    out = {"_sim": shim.SIM}
    only = os.environ.get("ZEROLAYER_SIM_CASES")  # "case1,case2"; by hand: unset = CASES
    for name in (only.split(",") if only else CASES):
        t = time.monotonic()
        try:
            out[name] = {"err": runs[name](), "s": round(time.monotonic() - t, 2)}
        except Exception:
            out[name] = {"error": traceback.format_exc()}
        print(f"{name}: {out[name]}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    _child()
