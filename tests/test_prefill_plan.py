"""gpu/cuda/prefill_plan.py, the model of the tensor-core prefill path, on the synthetic
SmolLM2-135M and Llama-3.2-1B shapes (host code, no CUDA). Its launch count is held to the
path's real launches under the simulator in tests/test_cuda_prefill_gemm.py."""
from __future__ import annotations

import pytest

from zerolayer.gpu.cuda import prefill_plan as pp
from zerolayer.gpu.cuda.step_plan import H100_SXM, H200
from zerolayer.gpu.cuda.step_shapes import SHAPES, synthetic


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_gemm_flops_are_two_per_weight_and_token(name):
    s = SHAPES[name]
    D, F, hd = s["d_model"], s["n_ff"], s["head_dim"]
    per_layer = ((s["n_head"] + 2 * s["n_kv"]) * hd * D + D * s["n_head"] * hd
                 + 2 * F * D + D * F)
    cfg, w = synthetic(name)
    p = pp.predict_prefill(cfg, w, 512, H100_SXM)
    gemm = next(ln for ln in p.lines if ln.name.startswith("GEMMs"))
    assert gemm.flops == 2 * 512 * per_layer * s["n_layer"]
    assert gemm.gemms == 4 * s["n_layer"]
    # never faster than the tensor cores' peak, nor than HBM for its bytes
    assert gemm.seconds >= max(gemm.flops / pp.TC_FP16_FLOPS[H100_SXM.name],
                               gemm.bytes / H100_SXM.hbm_bytes_s) * (1 - 1e-12)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_wall_is_the_slower_of_host_and_device(name):
    cfg, w = synthetic(name)
    for dev in (H100_SXM, H200):
        p = pp.predict_prefill(cfg, w, 512, dev)
        assert p.wall_s == max(p.device_s, p.host_s)
        assert p.tok_s == pytest.approx(512 / p.wall_s)
    h100, h200 = (pp.predict_prefill(cfg, w, 512, d) for d in (H100_SXM, H200))
    assert h200.device_s < h100.device_s  # more HBM bandwidth, the same compute
    assert h200.host_s == h100.host_s


def test_the_table_is_labelled_as_a_model():
    cfg, w = synthetic("smollm2-135m")
    text = pp.table(pp.predict_prefill(cfg, w, 512, H200), "smollm2")
    assert "a model, not a measurement" in text and "(assumed)" in text
