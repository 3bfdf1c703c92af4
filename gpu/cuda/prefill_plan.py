"""A model's prediction of a prefill step through the tensor-core path (tensor_gemm.py):
each layer matmul as a dequantization pass, a float16 cast of its input and a cuBLAS GEMM;
attention and the elementwise ops on the per-op kernels; and the host's launches, which
run ahead of the device and bound the step when the device is faster than they are.

A model, never a measurement: the GPU check times the path (bench/gpu_bench.py, prefill
sections) and the difference is what this gets wrong. Pure host code, no CUDA.

Per stage, time = max(FLOPs / peak, bytes / HBM bandwidth) (a roofline), with:
  * GEMM FLOPs 2 T R K at the dense FP16 tensor-core peak (float32 accumulation runs at
    that rate on Hopper); bytes: the float16 weight, float16 input, float32 output, all
    from HBM (the weight was just written and may still be in L2: the model ignores that);
  * dequantization: the weight's uploaded bytes read, its float16 copy written;
  * attention: 4 hd FLOPs per (query, key) pair and head (QK^T and PV) at the FP32 CUDA-core
    peak, causal within the prompt; its K/V reads are taken to hit L2 (one sequence's K/V
    of a layer is under a few MB);
  * elementwise ops (rmsnorm x2, RoPE, KV write, SwiGLU, residual adds x2): bytes only;
  * the host: LAUNCH_S a Numba launch and CUBLAS_CALL_S a GEMM call; the step's wall
    time is the larger of the host's and the device's (launches are asynchronous).
Left out: kernel tails and wave quantization of the GEMMs, clocks, L2 hits of the
dequantized weights, the embedding and the one-row LM head (a few µs).

    python -m zerolayer.gpu.cuda.prefill_plan          # both shapes, H100 SXM and H200
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from .step_plan import DEVICES, Device, _layer_bytes

# NVIDIA H100 SXM5 datasheet: FP16 tensor core 989.4 TFLOPS dense (1,979 with sparsity),
# FP32 67 TFLOPS. The H200 datasheet gives the same compute (the same GH100 at the same
# clocks) with HBM3e at 4.8 TB/s.
TC_FP16_FLOPS = {"H100 SXM": 989.4e12, "H200": 989.4e12}
FP32_FLOPS = {"H100 SXM": 67e12, "H200": 67e12}
# Host cost of one Numba kernel launch: an assumption, from the per-op decode step measured
# on an H100 before the fused kernel (8,576 µs for 4 + 13 x 30 = 394 launches, device time
# included, so at most ~22 µs a launch); 20 µs here.
LAUNCH_S = 20e-6
# Host cost of one GEMM through CuPy (the ExternalStream context, cublasSetStream,
# cublasGemmEx's enqueue): an assumption, 10 µs, to be replaced by the check's enqueue time.
CUBLAS_CALL_S = 10e-6
F16, F32 = 2, 4


@dataclass
class Line:
    name: str
    flops: float
    bytes: float
    seconds: float
    launches: int = 0   # Numba launches (per step, all layers)
    gemms: int = 0      # cuBLAS calls


@dataclass
class PrefillPrediction:
    device: Device
    tokens: int
    lines: list[Line]

    @property
    def device_s(self) -> float:
        return sum(ln.seconds for ln in self.lines)

    @property
    def host_s(self) -> float:
        return sum(ln.launches * LAUNCH_S + ln.gemms * CUBLAS_CALL_S for ln in self.lines)

    @property
    def wall_s(self) -> float:
        return max(self.device_s, self.host_s)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s


def predict_prefill(cfg, w, tokens, dev):
    """One sequence's prompt of `tokens` tokens from position 0, through the tensor-core
    path, on `dev` (step_plan.DEVICES); w: quant.Weight stacks (gpu/cuda/step_shapes.py's
    synthetic ones, or a loaded model's)."""
    T, L = tokens, cfg.n_layer
    D, hd, F = cfg.d_model, cfg.head_dim, cfg.n_ff
    q_w, kv_w = cfg.n_head * hd, cfg.n_kv * hd
    tc, fp32, bw = TC_FP16_FLOPS[dev.name], FP32_FLOPS[dev.name], dev.hbm_bytes_s

    def roof(flops: float, nbytes: float, peak: float) -> float:
        return max(flops / peak if peak else 0.0, nbytes / bw)

    lines = []
    deq = [0.0, 0.0]
    cast = [0.0, 0.0]
    gemm = [0.0, 0.0, 0.0]
    for wt, out_rows in ((w.wqkv, q_w + 2 * kv_w), (w.wo, D), (w.wgu, 2 * F), (w.wdown, D)):
        K = wt.cols
        nb = _layer_bytes(wt, F32) + out_rows * K * F16  # the per-op arrays: float32 scales
        deq[0] += nb
        deq[1] += nb / bw
        cb = T * K * (F32 + F16)
        cast[0] += cb
        cast[1] += cb / bw
        fl = 2.0 * T * out_rows * K
        gb = out_rows * K * F16 + T * K * F16 + T * out_rows * F32
        gemm[0] += fl
        gemm[1] += gb
        gemm[2] += roof(fl, gb, tc)
    lines.append(Line("dequantize (weights -> fp16)", 0.0, deq[0] * L, deq[1] * L, 4 * L))
    lines.append(Line("cast activations to fp16", 0.0, cast[0] * L, cast[1] * L, 4 * L))
    lines.append(Line("GEMMs (cuBLAS, fp16 tensor cores)", gemm[0] * L, gemm[1] * L,
                      gemm[2] * L, 0, 4 * L))
    pairs = T * (T + 1) / 2
    att_fl = 4.0 * hd * cfg.n_head * pairs
    att_b = T * (q_w + 2 * kv_w + q_w) * F32   # Q, K, V in; the output out
    lines.append(Line("attention (CUDA cores, fp32)", att_fl * L, att_b * L,
                      roof(att_fl, att_b, fp32) * L, 2 * L))  # splits, then their merge
    ew = T * F32 * (2 * 2 * D                  # rmsnorm x2: read, write
                    + 2 * (q_w + kv_w)         # RoPE on Q and K, in place
                    + 2 * 2 * kv_w             # KV write: read K, V, write them
                    + 3 * F                    # SwiGLU: read gate|up, write h
                    + 2 * 3 * D)               # residual adds x2: read 2, write 1
    qb = getattr(w, "qkv_bias", None)  # qwen2's Q/K/V biases: one more launch a layer
    bias = int(qb is not None and qb.shape[1] > 0)
    lines.append(Line("elementwise (rmsnorm, rope, kv write, swiglu, adds)", 0.0, ew * L,
                      ew / bw * L, (7 + bias) * L))
    out_b = _layer_bytes(w.output, F32)
    lines.append(Line("embed + LM head (1 row, per-op)", 2.0 * D * cfg.vocab, out_b,
                      out_b / bw, 4))  # embed; gather the row, rmsnorm, matmul
    return PrefillPrediction(dev, T, lines)


def table(p: PrefillPrediction, title: str) -> str:
    """A markdown table of a prediction, labelled as the model it is."""
    d = p.device
    lines = [f"{title}: predicted by gpu/cuda/prefill_plan.py on {d.name} (FP16 tensor "
             f"{TC_FP16_FLOPS[d.name] / 1e12:.0f} TFLOPS, FP32 {FP32_FLOPS[d.name] / 1e12:.0f} "
             f"TFLOPS, HBM {d.hbm_bytes_s / 1e12:.2f} TB/s): a model, not a measurement", "",
             "| stage (all layers) | GFLOP | MB | predicted µs | launches | GEMM calls |",
             "|---|---|---|---|---|---|"]
    for ln in p.lines:
        lines.append(f"| {ln.name} | {ln.flops / 1e9:.1f} | {ln.bytes / 1e6:.1f} | "
                     f"{ln.seconds * 1e6:.1f} | {ln.launches} | {ln.gemms} |")
    lines.append(f"| **device** | | | **{p.device_s * 1e6:.0f}** | | |")
    lines.append(f"| host: launches x {LAUNCH_S * 1e6:.0f} µs + GEMM calls x "
                 f"{CUBLAS_CALL_S * 1e6:.0f} µs (assumed) | | | {p.host_s * 1e6:.0f} | | |")
    lines.append(f"| **step wall = max(device, host)** | | | **{p.wall_s * 1e6:.0f}** | | |")
    lines.append(f"| **tok/s** | | | **{p.tok_s:,.0f}** (device alone "
                 f"{p.tokens / p.device_s:,.0f}) | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the model's prediction for a prefill of --tokens tokens, for the synthetic
    SmolLM2-135M and Llama-3.2-1B Q4_1 shapes (gpu/cuda/step_shapes.py)."""
    from .step_shapes import SHAPES, synthetic
    ap = argparse.ArgumentParser(prog="python -m zerolayer.gpu.cuda.prefill_plan",
                                 description=main.__doc__)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--shapes", choices=sorted(SHAPES), nargs="*", default=sorted(SHAPES))
    ap.add_argument("--device", choices=sorted(DEVICES), nargs="*", default=sorted(DEVICES))
    a = ap.parse_args(argv)
    for name in a.shapes:
        cfg, w = synthetic(name)
        for dev in a.device:
            p = predict_prefill(cfg, w, a.tokens, DEVICES[dev])
            print(table(p, f"{name}, prefill of {a.tokens} tokens, tensor-core path"), "\n")


if __name__ == "__main__":
    main()
