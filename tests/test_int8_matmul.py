"""The int8 CPU matmul (gpu/ops/int8_matmul.py): every kernel set this CPU runs, against
exact integer sums (numpy int64) and float64 references, the kernel-set dispatch, and the
model's logits with the int8 weights against the float kernels."""
from __future__ import annotations

import numpy as np
import pytest

from zerolayer.gpu import quant
from zerolayer.gpu.ops import cpu_features
from zerolayer.gpu.ops import int8_matmul as im
from zerolayer.gpu.ops.matmul import layer_matmul, matmul
from zerolayer.gpu.quant import FMT_Q4, FMT_Q8, FMT_Q8_16, LANES

ISAS = im.ISAS
NAMES = {cpu_features.ISA_VNNI512: "vnni512", cpu_features.ISA_VNNI256: "vnni256",
         cpu_features.ISA_AVX2: "avx2"}


def _weight(fmt, R, K, rng, qmax):
    (fmt, nat), q, d, m = _natural(fmt, R, K, rng, qmax)
    return quant.stack([(fmt, nat)]), q, d, m


def _natural(fmt, R, K, rng, qmax):
    """Random weights of an internal format: ((fmt, natural arrays), q, d, m)."""
    bw = quant.block_weights(fmt)
    nb = K // bw
    q = rng.integers(0, qmax + 1, (R, K)).astype(np.uint8)
    if fmt == FMT_Q4:
        qb = q.reshape(R, nb, 32)
        qs = (qb[..., :16] | (qb[..., 16:] << 4)).reshape(R, K // 2)
    else:
        qs = q
    # scales representable in float16, as in the files (the int8 path keeps them as f16)
    d = rng.uniform(0.001, 0.02, (R, nb)).astype(np.float16).astype(np.float32)
    m = (-d * rng.uniform(0, qmax, (R, nb))).astype(np.float16).astype(np.float32)
    nat = {"qs": qs, "d": d, "m": m}
    return (fmt, nat), q.astype(np.int64), d.astype(np.float64), m.astype(np.float64)


CASES = [(FMT_Q4, 15), (FMT_Q8, 255), (FMT_Q8, 31), (FMT_Q8_16, 63)]


@pytest.mark.skipif(not ISAS, reason="no int8 kernel set on this CPU")
@pytest.mark.parametrize("isa", ISAS, ids=lambda i: NAMES[i])
@pytest.mark.parametrize("fmt,qmax", CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("T", [1, 3, 4, 9])
@pytest.mark.parametrize("wide", [False, True], ids=["int8", "int16"])
def test_kernel_exact(isa, fmt, qmax, T, wide):
    rng = np.random.default_rng(fmt * 100 + qmax + T)
    R, K = 100, 128  # 100 rows: a padded second group
    w, q, d, m = _weight(fmt, R, K, rng, qmax)
    pw = im.prepare(w, isa, wide)
    assert im.is_int8(pw.fmt) and im.is_wide(pw.fmt) == wide
    (code, qs, d16, m16), = im.segments(pw)  # random scales: float16 d and m per block
    assert code == pw.fmt and im.scales_of(code) == im.SC_DM
    assert np.array_equal(im.unpack(qs, code), w.qs[0])
    # bits a weight in memory: 5- and 6-bit values are packed (nibbles + high-bit planes)
    bits = 4 if fmt == FMT_Q4 else 5 if qmax < 32 else 6 if (fmt == FMT_Q8_16 and qmax < 64) else 8
    assert qs.nbytes * 8 == w.qs.shape[1] * LANES * K * bits
    if isa == cpu_features.ISA_AVX2 and qmax > 127 and not wide:
        assert pw.fmt == im.fmt_code(isa, im.KIND_Q8_SPLIT)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[0, :quant.block_weights(fmt)] = 0  # an all-zero block
    bw = quant.block_weights(fmt)
    nb = K // bw
    qmax_x = 32767 if wide else 127
    xq = np.empty(T * K, np.int16 if wide else np.int8)
    sx = np.empty((T, nb), np.float32)
    xsm = np.empty((T, nb), np.float32)
    im.quantize(x, bw, xq, sx, xsm)
    xqi = xq.reshape(T, K).astype(np.int64)
    # the quantizer: x ~ s xq within half a step, |xq| <= qmax, xsm = s sum(xq)
    s64 = np.repeat(sx.astype(np.float64), bw, axis=1)
    assert np.all(np.abs(x - s64 * xqi) <= s64 * 0.5 + 1e-6)
    assert np.abs(xqi).max() == qmax_x
    assert np.allclose(xsm, sx * xqi.reshape(T, nb, bw).sum(-1), rtol=1e-6)
    # exact integer block sums
    G = w.d.shape[1]
    got = np.zeros((T, G * LANES, nb), np.int32)
    # (int16 sums pass float32's 2^24 there: the integer check takes activations / 64)
    xs = (xq // 64).astype(xq.dtype) if wide else xq
    im.int_block_sums(code, qs, nb, xs.view(np.int8), T, K, got)
    want = np.einsum("rbk,tbk->trb", q.reshape(R, nb, bw), xs.reshape(T, nb, bw).astype(np.int64))
    assert np.array_equal(got[:, :R].astype(np.int64), want)
    assert not got[:, R:].any()  # padding rows
    want = np.einsum("rbk,tbk->trb", q.reshape(R, nb, bw), xqi.reshape(T, nb, bw))
    # the matmul against float64 over the same quantized activations (exact up to f32 rounding)
    y = np.empty((T, R), np.float32)
    G, nb = qs.shape[:2]  # the float kernels' entry point takes per-block scales as [G, nb, LANES]
    matmul(code, qs, d16.reshape(G, nb, LANES), m16.reshape(G, nb, LANES), pw.w[0], x, y)
    ref = np.einsum("trb,rb,tb->tr", want, d, sx) + np.einsum("rb,tb->tr", m, xsm.astype(np.float64))
    scale = np.abs(ref).max()
    assert np.abs(y - ref).max() <= 1e-5 * scale
    # and against the exact float64 product: activation quantization error only
    wd = (q.reshape(R, nb, bw) * d[..., None] + m[..., None]).reshape(R, K)
    exact = x.astype(np.float64) @ wd.T
    assert np.abs(y - exact).max() <= (1e-4 if wide else 0.02) * np.abs(exact).max()


@pytest.mark.skipif(not ISAS, reason="no int8 kernel set on this CPU")
@pytest.mark.parametrize("isa", ISAS, ids=lambda i: NAMES[i])
@pytest.mark.parametrize("fmt,qmax", [(FMT_Q4, 15), (FMT_Q8, 31), (FMT_Q8_16, 63)],
                         ids=["q4", "q5p", "q6p"])
@pytest.mark.parametrize("R", [9 * LANES - 7, 40 * LANES - 7])  # few groups (token chunks), many
def test_prefill_unpacks_to_the_same_bits(isa, fmt, qmax, R):
    """From UNPACK_T tokens a nibble-kind weight's groups are unpacked to bytes and run by
    the Q8 kernel: the unpacked bytes are the weights, and every token's outputs are those of
    the packed kernels (one token per call): bit for bit with VNNI; within float32 rounding
    with AVX2, whose 1- and 4-token kernels already differ in the last bit (LLVM contracts
    their scaling into FMAs differently)."""
    rng = np.random.default_rng(R + qmax)
    K = 256
    w, q, d, m = _weight(fmt, R, K, rng, qmax)
    pw = im.prepare(w, isa, True)
    (code, qs, d16, m16), = im.segments(pw)
    kind = code % 8
    assert im.planar(code) and kind != im.KIND_Q8
    bs = quant.block_weights(fmt)
    nb = K // bs
    G = qs.shape[0]
    wq = qs.reshape(-1)
    for g in (0, G - 1):
        wb = np.empty(nb * bs * LANES, np.uint8)
        im.unpack_group(kind, wq, g, nb, qs.shape[2], bs, wb)
        got = im.untranspose_blocks(wb.reshape(1, nb, bs, LANES))[0]  # [nb, bs, LANES]
        want = np.zeros((LANES, K), np.int64)
        rows = q[g * LANES:(g + 1) * LANES]
        want[:rows.shape[0]] = rows
        assert np.array_equal(got.transpose(2, 0, 1).reshape(LANES, K), want)
    T = im.UNPACK_T * 4 + 5
    assert im.work_plan(code, T, G)[1]  # this call unpacks; decode-sized calls do not
    assert not im.work_plan(code, im.UNPACK_T - 1, G)[1]
    assert not im.work_plan(im.fmt_code(isa, im.KIND_Q8, True), T, G)[1]
    x = rng.standard_normal((T, K)).astype(np.float32)
    y = np.empty((T, R), np.float32)
    im.int8_matmul(code, qs, d16, m16, x, y)
    for t in range(T):
        y1 = np.empty((1, R), np.float32)
        im.int8_matmul(code, qs, d16, m16, x[t:t + 1], y1)
        if isa == cpu_features.ISA_AVX2:
            assert np.abs(y[t] - y1[0]).max() <= 1e-6 * np.abs(y1[0]).max(), t
        else:
            assert np.array_equal(y[t], y1[0]), t


def test_dispatch():
    sel = cpu_features.select
    vnni = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512vnni"})
    assert sel("", vnni)[0] in ("float", "vnni")  # the default: whatever DEFAULT says
    assert sel("auto", vnni) == ("vnni", cpu_features.ISA_VNNI512)
    assert sel("avx2", vnni) == ("avx2", cpu_features.ISA_AVX2)
    assert sel("float", vnni) == ("float", 0)
    assert sel("auto", frozenset({"avx2", "avxvnni"})) == ("vnni", cpu_features.ISA_VNNI256)
    assert sel("auto", frozenset({"avx2"})) == ("avx2", cpu_features.ISA_AVX2)
    assert sel("auto", frozenset({"sse4.2"})) == ("float", 0)
    with pytest.warns(UserWarning):
        assert sel("vnni", frozenset({"avx2"})) == ("avx2", cpu_features.ISA_AVX2)
    with pytest.warns(UserWarning):
        assert sel("bogus", frozenset()) == ("float", 0)
    # prepare: isa 0 and float32 weights pass through; a set the CPU lacks is refused
    w, *_ = _weight(FMT_Q4, 64, 64, np.random.default_rng(0), 15)
    assert im.prepare(w, 0) is w
    missing = [i for i in (1, 2, 3) if i not in ISAS]
    if missing:
        with pytest.raises(ValueError):
            im.prepare(w, missing[0])


HASWELL = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fsgsbase,+fxsr,+lzcnt,"
           "+mmx,+movbe,+pclmul,+popcnt,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave")


def test_kernel_choice_follows_numbas_target():
    """NUMBA_CPU_NAME/NUMBA_CPU_FEATURES (what Numba then compiles for) decide the kernel
    sets too, so an AVX2 target on an AVX-512 host gets the AVX2 kernels, never VNNI code it
    could not compile (bench/README.md: measuring a machine flag set without VNNI)."""
    import os
    import subprocess
    import sys
    code = ("from zerolayer.gpu.ops import cpu_features as c, attention_block as a;"
            "print(c.supported_isas(), c.ISA, c.MODE, a.V)")
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=HASWELL)
    env.pop("ZEROLAYER_CPU_KERNELS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == [f"({cpu_features.ISA_AVX2},)", str(cpu_features.ISA_AVX2), "avx2", "8"], out


@pytest.mark.skipif(not ISAS, reason="no int8 kernel set on this CPU")
def test_model_logits_int8_vs_float(generator):
    """The whole forward pass with each int8 kernel set against the float kernels: the
    logits differ by activation quantization only, and the greedy token is the same."""
    from zerolayer.gpu.model import LlamaModel, StepInput
    base = generator.model
    ids = np.array(generator.tokenizer.encode("The capital of France is"), np.int32)
    runs = {}
    for isa in (0,) + ISAS:
        with im.kernel_set(isa):
            mdl = LlamaModel(base.cfg, base.w, max_seq_len=256, kv_blocks=8, path=base.path)
        seq = mdl.new_sequence()
        runs[isa] = mdl.step([StepInput(seq, ids)])[0]
        seq.release()
    ref = runs[0]
    for isa in ISAS:
        diff = np.abs(runs[isa] - ref).max()
        assert diff < 1.0, (NAMES[isa], diff)
        assert runs[isa].argmax() == ref.argmax()


@pytest.mark.skipif(not ISAS, reason="no int8 kernel set on this CPU")
@pytest.mark.parametrize("prompt_len", [3, 40])  # 40: past the float kernels' tile crossover
def test_tiny_model_int8_vs_float64_reference(tiny_path, prompt_len):
    """17 steps of the tiny model with the best int8 set against the float64 reference."""
    from test_model import _compare
    prompt = list(np.random.default_rng(prompt_len).integers(0, 200, prompt_len))
    errs = _compare(tiny_path, prompt, isa=ISAS[0])
    print("int8 relative logit error per step:", ["%.1e" % e for e in errs])
    assert max(errs) < INT8_REL_TOL, errs


INT8_REL_TOL = 0.1  # max |ours - ref| / max |ref| per step (random tiny model: measured up to 4.5e-2)


# (natural format, largest value): Q4_K, Q6_K, Q5_0/Q5_K and Q8_0 layers in one stack, as
# llama.cpp's Q4_K_M files mix them; the stack widens to 16-weight byte blocks
MIXED = [(FMT_Q4, 15), (FMT_Q8_16, 63), (FMT_Q8, 31), (FMT_Q8, 255)]


@pytest.mark.skipif(not ISAS, reason="no int8 kernel set on this CPU")
@pytest.mark.parametrize("isa", ISAS, ids=lambda i: NAMES[i])
def test_mixed_stack_layers_keep_their_own_format(isa):
    """A stack widened to its widest layer is prepared layer by layer: each layer runs in
    the format it would have alone (its bytes, its kernel) and gives those outputs bit for
    bit, at decode and at prefill sizes; a forward pass reads only the layers' own bytes."""
    rng = np.random.default_rng(7)
    R, K = 100, 256
    natural = [_natural(f, R, K, rng, qmax)[0] for f, qmax in MIXED]
    wide = quant.stack(natural)
    assert wide.fmt == FMT_Q8_16
    pw = im.prepare(wide, isa, True)
    each = [im.prepare(quant.stack([n]), isa, True) for n in natural]
    assert [e.fmt % 8 for e in each] == [im.KIND_Q4, im.KIND_Q6P, im.KIND_Q5P, im.KIND_Q8]
    assert [int(c) for c in pw.lf[:, 0, 0]] == [e.fmt for e in each]
    assert im.read_nbytes(pw) == sum(im.read_nbytes(e) for e in each)
    table = pw._replace(lf=pw.layers())
    for T in (1, 5, im.UNPACK_T + 3):
        x = rng.standard_normal((T, K)).astype(np.float32)
        for i, e in enumerate(each):
            got = np.empty((T, R), np.float32)
            layer_matmul(table, i, x, got)
            want = np.empty((T, R), np.float32)
            im.int8_matmul(*im.segment(e), x, want)
            assert np.array_equal(got, want), (i, T)
    # a uniform stack: one segment a layer, the whole of its rows
    same = im.prepare(quant.stack([natural[0], natural[0]]), isa, True)
    assert same.lf.shape[1] == 1 and np.array_equal(same.lf[:, 0, 0], [each[0].fmt] * 2)


@pytest.mark.skipif(not ISAS, reason="no int8 kernel set on this CPU")
def test_tiny_model_with_per_layer_types(tmp_path):
    """A model whose layers differ in type (llama.cpp's mixes: here Q4_0 and Q8_0 attn_v,
    Q5_0 and Q8_0 ffn_down) runs each layer in its own format: mixed stacks, logits within
    the int8 bound of the float64 reference, and the same logits through the cached layout
    (mapped, then copied into the forward's own memory: int8_matmul.resident)."""
    from gguf import GGMLQuantizationType as QT

    from test_model import _compare
    from tiny_gguf import write_tiny_llama
    from zerolayer.gpu.model import LlamaModel, StepInput
    p = str(tmp_path / "mixed.gguf")
    write_tiny_llama(p, override={"attn_v": QT.Q4_0, "blk.1.attn_v": QT.Q8_0,
                                  "blk.0.ffn_down": QT.Q5_0})
    errs = _compare(p, [5, 17, 99, 3], isa=ISAS[0])
    assert max(errs) < INT8_REL_TOL, errs
    out = []
    with im.kernel_set(ISAS[0]):
        for _ in range(3):  # fresh (saves the layout), then mapped from the cache
            mdl = LlamaModel.load(p, max_seq_len=64)
            assert len({int(c) for c in mdl.prepared["wdown"].lf[:, 0, 0]}) == 2
            # the forward runs on copies in anonymous memory, not on the cache's mapping
            assert not any(isinstance(a, np.memmap) and a.size
                           for i in (1, 2, 3, 4, 8) for a in mdl._wargs[i][1:5])
            kinds = [int(c) % 8 for c in mdl.prepared["wdown"].lf[:, 0, 0]]
            assert kinds[0] == im.KIND_Q5P and kinds[1] in (im.KIND_Q8, im.KIND_Q8_SPLIT)
            out.append(mdl.step([StepInput(mdl.new_sequence(), np.arange(9, dtype=np.int32))]))
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(out[0], out[2])


@pytest.mark.skipif(not ISAS, reason="no int8 kernel set on this CPU")
def test_int8_with_qkv_at_int16(generator):
    """ZEROLAYER_CPU_ACTIVATIONS=int8-qkv16: int16 activations for the fused Q|K|V projection,
    int8 for every other matmul; its own cached layout; logits within the int8 bound of
    the float kernels'. Unknown names are refused (kernel_set) or warned about (env)."""
    import warnings

    from zerolayer.gpu.model import LlamaModel, StepInput
    assert [im.wide_for(k, "int8-qkv16") for k in im.MATMUL_WEIGHTS] == [True] + [False] * 4
    assert all(im.wide_for(k, "int16") for k in im.MATMUL_WEIGHTS)
    assert not any(im.wide_for(k, "int8") for k in im.MATMUL_WEIGHTS)
    base = generator.model
    ids = np.array(generator.tokenizer.encode("The capital of France is"), np.int32)
    keys, logits = set(), {}
    for act in (0,) + cpu_features.ACT_MODES:
        with im.kernel_set(0 if act == 0 else ISAS[0], None if act == 0 else act):
            keys.add(cpu_features.layout_key())
            mdl = LlamaModel(base.cfg, base.w, max_seq_len=256, kv_blocks=8, path=base.path)
        seq = mdl.new_sequence()
        logits[act] = mdl.step([StepInput(seq, ids)])[0]
        seq.release()
        if act == "int8-qkv16":
            wide = {k: im.is_wide(w.fmt) for k, w in mdl.prepared.items()}
            assert wide == {"wqkv": True, "wo": False, "wgu": False, "wdown": False, "output": False}
    assert len(keys) == 1 + len(cpu_features.ACT_MODES)  # the float kernels: None
    assert np.abs(logits["int8-qkv16"] - logits[0]).max() < 1.0
    assert logits["int8-qkv16"].argmax() == logits[0].argmax()
    with pytest.raises(ValueError):
        im.kernel_set(ISAS[0], "int4")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert cpu_features.select_activations("int4") == cpu_features.ACT_DEFAULT
    assert w and "int8-qkv16" in str(w[0].message)
