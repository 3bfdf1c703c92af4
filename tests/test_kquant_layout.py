"""The int8 kernels' storage of K-quant and symmetric-quant files at their own size
(gpu/ops/kquant_scales.py, gpu/ops/int8_matmul.py's prepare): the scales in the file's form
(Q4_K/Q5_K's packed 6-bit sub-block scales and mins, Q6_K's int8 scales, one d for
Q4_0/Q5_0/Q8_0), each part of a fused weight in its own format, the outputs against float64
over the file's exact dequantization, and a whole model mixing the types per layer."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from test_quant_formats import gguf_weight, random_raw, write_model
from zerolayer.gpu import quant
from zerolayer.gpu.ops import int8_matmul as im
from zerolayer.gpu.ops import kquant_scales as ks
from zerolayer.gpu.ops.cpu_features import ISA_AVX2
from zerolayer.gpu.ops.matmul import layer_matmul
from zerolayer.gpu.quant import LANES

ISAS = im.ISAS
pytestmark = pytest.mark.skipif(not ISAS, reason="no int8 kernel set on this CPU")

FORMS = {QT.Q4_K: (im.KIND_Q4, ks.SC_K4), QT.Q5_K: (im.KIND_Q5P, ks.SC_K4),
         QT.Q6_K: (im.KIND_Q6P, ks.SC_K6), QT.Q4_0: (im.KIND_Q4, ks.SC_D),
         QT.Q5_0: (im.KIND_Q5P, ks.SC_D), QT.Q8_0: (im.KIND_Q8, ks.SC_D),
         QT.Q4_1: (im.KIND_Q4, ks.SC_DM), QT.Q5_1: (im.KIND_Q5P, ks.SC_DM)}


def _file_bytes(qt: QT, rows: int, cols: int) -> int:
    n, size = gguf.GGML_QUANT_SIZES[qt]
    return rows * cols // n * size


@pytest.mark.parametrize("qt", sorted(FORMS, key=int), ids=lambda q: q.name)
@pytest.mark.parametrize("wide", [False, True], ids=["int8", "int16"])
def test_scales_kept_in_the_files_form(qt, wide):
    """Every type's scales come back from the packed form exactly (the float32 values the
    file's dequantization multiplies by), in the form of its file and at its file's size
    (rows a multiple of LANES: no padding)."""
    rng = np.random.default_rng(int(qt))
    rows, cols = 2 * LANES, 512
    k_type = qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K)
    raw = gguf_weight(qt, rows, cols, rng) if k_type else random_raw(qt, rows, cols, rng)
    wt = quant.stack([quant.repack(raw, rows, cols, qt)])
    pw = im.prepare(wt, ISAS[0], wide)
    (code, qs, d16, m16), = im.segments(pw)
    kind, form = FORMS[qt]
    if kind == im.KIND_Q8 and ISAS[0] == ISA_AVX2 and not wide:
        kind = im.KIND_Q8_SPLIT  # vpmaddubsw would saturate on bytes above 127 (kind_for)
    assert (code % 8, im.scales_of(code), im.is_wide(code)) == (kind, form, wide)
    G, nb = qs.shape[:2]
    d, m = ks.unpack_scales(form, d16, m16, G, nb)
    np.testing.assert_array_equal(d, wt.d[0])
    np.testing.assert_array_equal(m, wt.m[0])
    if form != ks.SC_DM:
        assert im.read_nbytes(pw) == _file_bytes(qt, rows, cols) + (2 if form == ks.SC_D else 0)


def _reference(qt, raw, rows, cols, x, bs):
    """float64 over the file's exact dequantization, with the activations quantized as the
    kernels do (per block of bs, int16): what the kernels compute up to float32 rounding."""
    w = gguf.quants.dequantize(raw, qt).astype(np.float64).reshape(rows, cols)
    T = x.shape[0]
    xq = np.empty(T * cols, np.int16)
    sx = np.empty((T, cols // bs), np.float32)
    xsm = np.empty_like(sx)
    im.quantize(x, bs, xq, sx, xsm)
    xd = xq.reshape(T, cols // bs, bs).astype(np.float64) * sx[..., None]
    return xd.reshape(T, cols) @ w.T


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0, QT.Q5_0], ids=lambda q: q.name)
@pytest.mark.parametrize("T", [1, 3, 4, im.UNPACK_T + 3])  # 1 / NT-token kernels, the unpacked prefill
@pytest.mark.parametrize("isa", ISAS, ids=str)
def test_kernels_equal_the_exact_dequantization(qt, T, isa):
    """Odd shapes (a padded last row group, three super-blocks a row): the int16 kernels'
    outputs against float64 over the file's dequantization and the same quantized
    activations."""
    rng = np.random.default_rng(int(qt) * 10 + T)
    rows, cols = 2 * LANES + 13, 768
    raw = gguf_weight(qt, rows, cols, rng)
    wt = quant.stack([quant.repack(raw, rows, cols, qt)])
    pw = im.prepare(wt, isa, True)
    assert im.scales_of(pw.fmt) == FORMS[qt][1]
    x = rng.standard_normal((T, cols)).astype(np.float32)
    y = np.empty((T, rows), np.float32)
    layer_matmul(pw, 0, x, y)
    ref = _reference(qt, raw, rows, cols, x, quant.block_weights(quant.repack(raw, rows, cols, qt)[0]))
    assert np.abs(y - ref).max() <= 2e-6 * np.abs(ref).max()


def test_fused_weight_keeps_each_part_in_its_format():
    """Q|K|V of a Q4_K_M layer whose attn_v is Q6_K: Q and K run as Q4_K (nibbles, packed
    scales), V as Q6_K, reading exactly the file's bytes, with the outputs of each part alone
    bit for bit."""
    rng = np.random.default_rng(5)
    D, dq, dkv = 512, 4 * LANES, LANES
    parts = [(QT.Q4_K, dq), (QT.Q4_K, dkv), (QT.Q6_K, dkv)]
    raws = [gguf_weight(qt, r, D, rng) for qt, r in parts]
    nat = [quant.repack(raw, r, D, qt) for raw, (qt, r) in zip(raws, parts)]
    fused = quant.stack([quant.concat_rows(nat)])
    assert fused.fmt == quant.FMT_Q8_16  # widened for the float and CUDA kernels
    isa = ISAS[0]
    pw = im.prepare(fused, isa, True)
    segs = im.segments(pw)
    assert [(c % 8, im.scales_of(c)) for c, *_ in segs] == [(im.KIND_Q4, ks.SC_K4), (im.KIND_Q6P, ks.SC_K6)]
    assert im.read_nbytes(pw) == sum(_file_bytes(qt, r, D) for qt, r in parts)
    for T in (1, 5, im.UNPACK_T + 1):
        x = rng.standard_normal((T, D)).astype(np.float32)
        y = np.empty((T, dq + 2 * dkv), np.float32)
        layer_matmul(pw, 0, x, y)
        qk = im.prepare(quant.stack([quant.concat_rows(nat[:2])]), isa, True)
        v = im.prepare(quant.stack([nat[2]]), isa, True)
        for w, r0, r1 in ((qk, 0, dq + dkv), (v, dq + dkv, dq + 2 * dkv)):
            want = np.empty((T, r1 - r0), np.float32)
            layer_matmul(w, 0, x, want)
            np.testing.assert_array_equal(y[:, r0:r1], want)


# llama.cpp's Q4_K_M kind of mix, per layer: Q6_K attn_v and ffn_down in layer 0 only
PER_LAYER_MIX = {"token_embd": QT.Q4_K, "attn_q": QT.Q4_K, "attn_k": QT.Q4_K, "attn_v": QT.Q4_K,
                 "blk.0.attn_v": QT.Q6_K, "attn_output": QT.Q4_K, "ffn_gate": QT.Q4_K,
                 "ffn_up": QT.Q4_K, "ffn_down": QT.Q4_K, "blk.0.ffn_down": QT.Q6_K}


def test_model_mixing_q4k_q6k_per_layer(tmp_path):
    """A model mixing Q4_K and Q6_K per layer and within Q|K|V: each part is read at its
    file's size (the matmul weights' bytes a token within 1% of the file's; the LM head
    here is F16, stored as float32 by the loader, so it is left out) and the logits agree
    with the float64 reference within the int8 kernels' bound."""
    from test_int8_matmul import INT8_REL_TOL
    from test_model import _compare
    from zerolayer.gpu.gguf_loader import open_gguf
    from zerolayer.gpu.model import LlamaModel
    path = str(tmp_path / "mix.gguf")
    write_model(path, PER_LAYER_MIX)
    errs = _compare(path, list(np.random.default_rng(4).integers(0, 200, 21)), steps=4, isa=ISAS[0])
    assert max(errs) < INT8_REL_TOL, errs
    with im.kernel_set(ISAS[0], "int16"):
        mdl = LlamaModel.load(path, use_cache=False, max_seq_len=64)
    names = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    file_bytes = sum(int(t.n_bytes) for t in open_gguf(path).tensors
                     if t.name.startswith("blk.") and t.name.split(".")[-2] in names)
    read = sum(im.read_nbytes(mdl.prepared[k]) for k in ("wqkv", "wo", "wgu", "wdown"))
    assert file_bytes <= read <= 1.01 * file_bytes, (read, file_bytes)
    forms = {(int(c) % 8, im.scales_of(int(c))) for c in mdl.prepared["wqkv"].lf[0, :, 0] if c >= 0}
    assert forms == {(im.KIND_Q4, ks.SC_K4), (im.KIND_Q6P, ks.SC_K6)}
