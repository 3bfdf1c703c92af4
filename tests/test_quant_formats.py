"""The GGUF formats people download: Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, BF16.

* Repacking is exact: our dequantization equals ``gguf.quants.dequantize`` bit for bit in
  float32, on random blocks (every byte random, f16 scale fields forced finite).
* The CPU kernels (matmul, embedding) over each format against the float64 reference.
* The CUDA twins under Numba's CUDA simulator (a child process, as tests/test_cuda_sim.py),
  against the same float64 reference. Their sm_90 PTX compile is tests/test_cuda_ptx.py.
* A tiny Llama GGUF with K-quant / 5-bit / BF16 tensors loads and its logits match the
  float64 numpy forward pass over gguf's dequantization (tests/test_model.py's _compare).
* Anything else is still refused, naming the type.

gguf can dequantize K-quants but not quantize them, so K-quant weights here are random
blocks with realistic f16 scales (``random_blocks``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from zerolayer.gpu import quant
from zerolayer.gpu.errors import UnsupportedModelError

NEW_TYPES = (QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.BF16)
K_TYPES = (QT.Q4_K, QT.Q5_K, QT.Q6_K)
TOL = 1e-5  # max |ours - ref| / max |ref|, as tests/test_ops.py
SIM_TIMEOUT_S = 600

# byte offsets of the f16 scale fields in one block of each type
_F16_FIELDS = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q8_0: (0,), QT.Q5_0: (0,), QT.Q5_1: (0, 2),
               QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}
# typical |d| of a K-quant super-block per unit of weight std (from the value distributions
# of random scales and quants); dmin centres Q4_K/Q5_K weights around 0
_K_D_PER_STD = {QT.Q4_K: 1 / 262, QT.Q5_K: 1 / 500, QT.Q6_K: 1 / 1370}
_K_DMIN_PER_D = {QT.Q4_K: 7.5, QT.Q5_K: 15.5}


def _finite_f16(u: np.ndarray) -> np.ndarray:
    """Random uint16 -> the bits of finite f16 values (an all-ones exponent loses its top bit)."""
    return np.where((u & 0x7C00) == 0x7C00, u & ~np.uint16(0x4000), u).astype(np.uint16)


def random_raw(qt: QT, rows: int, cols: int, rng) -> np.ndarray:
    """Every byte random, f16 scales finite: the whole bit layout is exercised."""
    n, size = gguf.GGML_QUANT_SIZES[qt]
    if qt == QT.BF16:  # finite bf16: the exponent is not all ones
        u = rng.integers(0, 1 << 16, (rows, cols), dtype=np.uint16)
        return np.where((u & 0x7F80) == 0x7F80, u & ~np.uint16(0x4000), u).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, (rows, cols // n, size), dtype=np.uint8)
    for o in _F16_FIELDS[qt]:
        f = np.ascontiguousarray(raw[..., o:o + 2]).view(np.uint16)
        raw[..., o:o + 2] = _finite_f16(f).view(np.uint8)
    return raw.reshape(rows, -1)


def random_blocks(qt: QT, rows: int, cols: int, rng, std: float = 1.0) -> np.ndarray:
    """Random K-quant blocks (random quants and 6/8-bit sub-block scales) whose super-block
    scales give weights of about ``std``: usable as a model's weights."""
    assert qt in K_TYPES
    raw = rng.integers(0, 256, (rows, cols // quant.QK_K, gguf.GGML_QUANT_SIZES[qt][1]), dtype=np.uint8)
    d = std * _K_D_PER_STD[qt] * rng.uniform(0.5, 1.5, raw.shape[:2])
    if qt == QT.Q6_K:
        raw[..., 208:210] = d.astype(np.float16)[..., None].view(np.uint8)
    else:
        raw[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
        raw[..., 2:4] = (d * _K_DMIN_PER_D[qt]).astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def gguf_weight(qt: QT, rows: int, cols: int, rng, std: float = 1.0) -> np.ndarray:
    """A weight as GGUFReader hands it over, in a realistic value range."""
    if qt in K_TYPES:
        return random_blocks(qt, rows, cols, rng, std)
    w = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
    return gguf.quants.quantize(w, qt) if qt not in (QT.F32, QT.F16) else w.astype(
        np.float16 if qt == QT.F16 else np.float32)


def dense(raw: np.ndarray, qt: QT, rows: int, cols: int) -> np.ndarray:
    return gguf.quants.dequantize(raw, qt).astype(np.float64).reshape(rows, cols)


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


# ---------------------------------------------------------------- exact repacking

@pytest.mark.parametrize("qt", NEW_TYPES + (QT.Q4_0, QT.Q4_1, QT.Q8_0), ids=lambda q: q.name)
def test_dequantize_equals_gguf_bit_for_bit(qt):
    rng = np.random.default_rng(int(qt))
    rows, cols = 7, 512  # 2 K-quant super-blocks a row
    raw = random_raw(qt, rows, cols, rng)
    ref = gguf.quants.dequantize(raw, qt).reshape(rows, cols)
    assert np.isfinite(ref).all()
    fmt, a = quant.repack(raw, rows, cols, qt)
    np.testing.assert_array_equal(quant.dequantize(fmt, a, np.float32), ref)
    # through the kernels' interleaved layout (and every exact widening) as well
    for to in (quant.FMT_Q4, quant.FMT_Q8, quant.FMT_Q8_16, quant.FMT_F32):
        if quant.common_format({fmt, to}) != to:
            continue  # narrower than the tensor's own format
        wt = quant.stack([(to, quant.widen(fmt, a, to))])
        assert wt.fmt == to and wt.cols == cols
        np.testing.assert_array_equal(_dense_from_weight(wt, rows), ref)


def _dense_from_weight(wt: quant.Weight, rows: int) -> np.ndarray:
    """Undo the row interleave of a one-layer Weight with our dequantization (float32)."""
    if wt.fmt == quant.FMT_F32:
        return wt.w[0][:rows]
    G, nb, inner, lanes = wt.qs[0].shape
    qs = wt.qs[0].transpose(0, 3, 1, 2).reshape(G * lanes, nb * inner)
    d = wt.d[0].transpose(0, 2, 1).reshape(G * lanes, nb)
    m = wt.m[0].transpose(0, 2, 1).reshape(G * lanes, nb)
    return quant.dequantize(wt.fmt, {"qs": qs, "d": d, "m": m}, np.float32)[:rows]


def test_formats_map_as_documented():
    rng = np.random.default_rng(1)
    want = {QT.Q4_K: quant.FMT_Q4, QT.Q5_K: quant.FMT_Q8, QT.Q5_0: quant.FMT_Q8, QT.Q5_1: quant.FMT_Q8,
            QT.Q6_K: quant.FMT_Q8_16, QT.BF16: quant.FMT_F32}
    for qt, fmt in want.items():
        assert quant.repack(random_raw(qt, 2, 256, rng), 2, 256, qt)[0] == fmt, qt.name


def test_mixed_layers_widen_to_the_narrowest_common_format():
    """Q4_K_M files mix Q4_K and Q6_K (attn_v, ffn_down of some layers): they stack as
    16-weight byte blocks, not float32; Q4 + Q8 stack as Q8. Exact either way."""
    rng = np.random.default_rng(2)
    rows, cols = 70, 256
    parts, refs = {}, {}
    for qt in (QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.Q5_1, QT.F16):
        raw = gguf_weight(qt, rows, cols, rng)
        parts[qt], refs[qt] = quant.repack(raw, rows, cols, qt), dense(raw, qt, rows, cols)
    for mix, fmt in (((QT.Q4_K, QT.Q6_K), quant.FMT_Q8_16), ((QT.Q4_K, QT.Q8_0, QT.Q5_1), quant.FMT_Q8),
                     ((QT.Q6_K, QT.F16), quant.FMT_F32)):
        f, a = quant.concat_rows([parts[q] for q in mix])
        assert f == fmt
        np.testing.assert_array_equal(quant.dequantize(f, a, np.float64),
                                      np.concatenate([refs[q] for q in mix]))
        wt = quant.stack([parts[q] for q in mix])  # one layer per type
        assert wt.fmt == fmt and wt.d.shape[0] == len(mix)


@pytest.mark.parametrize("qt", [QT.Q8_K, QT.Q2_K, QT.Q3_K, QT.IQ4_NL, QT.IQ4_XS, QT.TQ2_0, QT.MXFP4],
                         ids=lambda q: q.name)
def test_other_types_are_refused_by_name(qt):
    with pytest.raises(UnsupportedModelError, match=rf"'blk\.0\.w'.*type {qt.name}\b"):
        quant.check_type("blk.0.w", int(qt))


def test_k_quant_row_length_must_hold_whole_super_blocks():
    with pytest.raises(UnsupportedModelError, match="Q4_K row length 96"):
        quant.repack(np.zeros(144, np.uint8), 1, 96, QT.Q4_K)


# ---------------------------------------------------------------- CPU kernels

@pytest.mark.parametrize("qt", NEW_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("T", [1, 3, 37])  # decode; batched; the dequantize-to-tile prefill path
def test_matmul_cpu(qt, T):
    from zerolayer.gpu.ops.matmul import matmul, matmul_ref
    rng = np.random.default_rng(10 * int(qt) + T)
    rows, cols = 100, 512  # a padded row group; 2 super-blocks
    raw = gguf_weight(qt, rows, cols, rng)
    wt = quant.stack([quant.repack(raw, rows, cols, qt)])
    x = rng.standard_normal((T, cols)).astype(np.float32)
    y = np.full((T, rows), np.nan, np.float32)
    matmul(*wt.layer(0), x, y)
    assert rel(y, matmul_ref(dense(raw, qt, rows, cols), x)) < TOL


@pytest.mark.parametrize("qt", K_TYPES + (QT.Q5_0,), ids=lambda q: q.name)
def test_embedding_cpu(qt):
    from zerolayer.gpu.ops.embedding import embed, embed_ref
    rng = np.random.default_rng(int(qt))
    raw = gguf_weight(qt, 130, 256, rng)
    wt = quant.stack([quant.repack(raw, 130, 256, qt)])
    tokens = np.array([0, 129, 64, 63, 7], np.int32)
    x = np.full((5, 256), np.nan, np.float32)
    embed(*wt.layer(0), tokens, x)
    np.testing.assert_array_equal(x, embed_ref(dense(raw, qt, 130, 256), tokens))


# ---------------------------------------------------------------- a whole model

# Q4_K_M-like (Q|K|V mixes Q4_K and Q6_K: 16-weight byte blocks), and the 5-bit/BF16 types
MIXES = {
    "k_quants": {"token_embd": QT.Q4_K, "attn_q": QT.Q4_K, "attn_k": QT.Q4_K, "attn_v": QT.Q6_K,
                 "attn_output": QT.Q5_K, "ffn_gate": QT.Q4_K, "ffn_up": QT.Q4_K, "ffn_down": QT.Q6_K},
    "q5_bf16": {"token_embd": QT.Q6_K, "attn_q": QT.Q5_0, "attn_k": QT.Q5_1, "attn_v": QT.Q5_0,
                "attn_output": QT.BF16, "ffn_gate": QT.Q5_K, "ffn_up": QT.Q5_K, "ffn_down": QT.Q5_1},
}
K_CONFIG = dict(n_layer=2, d=256, ff=256, n_head=4, n_kv=2, hd=64, vocab=200, ctx=256)  # K: 256-wide rows


def write_model(path: str, mix: dict, seed: int = 0) -> None:
    """tests/tiny_gguf.py's model, with K-quant tensors as random blocks of the same std."""
    import tiny_gguf
    orig = tiny_gguf._tensor
    rng = np.random.default_rng(seed + 1)

    def tensor(w, name, arr, qt):
        if qt in K_TYPES:
            rows, cols = arr.shape
            w.add_tensor(name, random_blocks(qt, rows, cols, rng, float(arr.std())), raw_dtype=qt)
        elif qt == QT.BF16:
            w.add_tensor(name, gguf.quants.quantize(arr.astype(np.float32), qt), raw_dtype=qt)
        else:
            orig(w, name, arr, qt)

    tiny_gguf._tensor = tensor
    try:
        tiny_gguf.write_tiny_llama(path, seed=seed, override=mix, config=K_CONFIG)
    finally:
        tiny_gguf._tensor = orig


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_model_matches_float64_reference(tmp_path, mix):
    from test_model import REL_TOL, _compare
    from zerolayer.gpu.gguf_loader import open_gguf
    path = str(tmp_path / f"{mix}.gguf")
    write_model(path, MIXES[mix])
    types = {t.name.split(".")[-2]: QT(int(t.tensor_type)) for t in open_gguf(path).tensors
             if t.name.startswith("blk.0.") or t.name == "token_embd.weight"}
    assert {k: v for k, v in types.items() if k in MIXES[mix]} == MIXES[mix]
    prompt = list(np.random.default_rng(3).integers(0, 200, 37))  # 37: the tile prefill path
    errs = _compare(path, prompt, steps=4)
    assert max(errs) < REL_TOL, errs


def test_loaded_k_quant_model_keeps_compact_formats(tmp_path):
    from zerolayer.gpu.model import LlamaModel
    path = str(tmp_path / "k.gguf")
    write_model(path, MIXES["k_quants"])
    w = LlamaModel.load(path, use_cache=False).w
    assert (w.emb.fmt, w.wqkv.fmt, w.wo.fmt, w.wgu.fmt, w.wdown.fmt) == (
        quant.FMT_Q4, quant.FMT_Q8_16, quant.FMT_Q8, quant.FMT_Q4, quant.FMT_Q8_16)


# ---------------------------------------------------------------- CUDA twins (simulator)

# T=3 runs the 8-token tile kernels; the 5-bit types run the Q8_0 byte kernel, so T=1 suffices
SIM_CASES = ["matmul_Q4_K_T1", "matmul_Q4_K_T3", "matmul_Q6_K_T1", "matmul_Q6_K_T3", "matmul_Q5_K_T1",
             "matmul_Q5_0_T1", "matmul_Q5_1_T1", "embed_Q6_K", "embed_Q5_K", "embed_Q4_K"]


@pytest.fixture(scope="module")
def sim_results() -> dict:
    env = dict(os.environ, ZEROLAYER_GPU_BACKEND="sim", NUMBA_ENABLE_CUDASIM="1", PYTHONUNBUFFERED="1",
               ZEROLAYER_CPU_KERNELS="float", ZEROLAYER_CPU_KV="f32")  # the CUDA twins' CPU ones
    proc = subprocess.run([sys.executable, __file__, "--sim-child"], env=env, capture_output=True,
                          text=True, timeout=SIM_TIMEOUT_S)
    assert proc.returncode == 0, f"simulator child failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", SIM_CASES)
def test_cuda_twin_under_simulator(sim_results, case):
    assert sim_results["_sim"] is True
    r = sim_results[case]
    assert "error" not in r, r.get("error")
    assert r["err"] <= TOL, f"{case}: rel err {r['err']:.3g} vs the float64 reference ({r})"


def _sim_child() -> None:
    sys.setswitchinterval(1e-4)  # the simulator's threads hand over much faster
    from zerolayer.gpu.cuda import _cuda_shim as shim
    from zerolayer.gpu.cuda import embedding as cu_emb
    from zerolayer.gpu.cuda import matmul as cu_mm
    from zerolayer.gpu.cuda.weight_layout import device_layer
    from zerolayer.gpu.ops.embedding import embed_ref
    from zerolayer.gpu.ops.matmul import matmul_ref

    rng = np.random.default_rng(0)

    def case_matmul(qt, T):
        # 100 rows: a padded row group; 256 cols: 8 (or, Q6_K, 16) blocks over a K split of 4
        rows, cols = 100, 256
        raw = gguf_weight(qt, rows, cols, rng)
        wt = quant.stack([quant.repack(raw, rows, cols, qt)]).layer(0)
        x = rng.standard_normal((T, cols)).astype(np.float32)
        y = np.full((T, rows), np.nan, np.float32)
        cu_mm.matmul(*device_layer(*wt), x, y)
        assert np.isfinite(y).all()
        return rel(y, matmul_ref(dense(raw, qt, rows, cols), x))

    def case_embed(qt):
        raw = gguf_weight(qt, 130, 256, rng)
        wt = quant.stack([quant.repack(raw, 130, 256, qt)]).layer(0)
        tokens = np.array([0, 129, 64, 63, 7], np.int32)
        x = np.full((5, 256), np.nan, np.float32)
        cu_emb.embed(*device_layer(*wt), tokens, x, threads=64)
        return rel(x, embed_ref(dense(raw, qt, 130, 256), tokens))

    out = {"_sim": shim.SIM}
    for name in SIM_CASES:
        kind, rest = name.split("_", 1)
        t = time.monotonic()
        try:
            if kind == "matmul":
                q, T = rest.rsplit("_T", 1)
                err = case_matmul(QT[q], int(T))
            else:
                err = case_embed(QT[rest])
            out[name] = {"err": err, "s": round(time.monotonic() - t, 2)}
        except Exception:
            out[name] = {"error": traceback.format_exc()}
        print(f"{name}: {out[name]}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__" and sys.argv[1:] == ["--sim-child"]:
    _sim_child()
