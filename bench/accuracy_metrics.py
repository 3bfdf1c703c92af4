"""What bench/accuracy.py measures (per position, at llama-perplexity's positions: KL(p_F32 || q)
and top-1 agreement against the F32 model dequantized from the same file) and the rule that
picks the default CPU mode; see bench/README.md ("accuracy.py") and docs/BENCHMARKS.md.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

N_CTX = 512  # llama-perplexity's -c here; 3,155 tokens of the shipped text make 6 chunks


def read_text(path: str) -> str:
    """The evaluated text: the file without its '#' header lines."""
    with open(path, encoding="utf-8") as f:
        return "".join(line for line in f if not line.startswith("#"))


def chunks(ids, n_ctx: int = N_CTX, bos: int | None = None) -> list[np.ndarray]:
    """Whole chunks of n_ctx tokens (a partial last one is dropped, as llama-perplexity
    does), the first token of each replaced by `bos` when given."""
    ids = np.asarray(ids, np.int32)
    out = [ids[i * n_ctx:(i + 1) * n_ctx].copy() for i in range(len(ids) // n_ctx)]
    if bos is not None:
        for c in out:
            c[0] = bos
    return out


def scored(n_ctx: int = N_CTX) -> slice:
    """The positions of a chunk whose next-token distributions are scored (llama-perplexity's:
    each has at least n_ctx/2 tokens of context)."""
    return slice(n_ctx // 2, n_ctx - 1)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


@dataclass
class Score:
    """Per-position KL(p_ref || q) (nats, float64) and top-1 agreements, over chunks."""
    kl: list = field(default_factory=list)
    top: list = field(default_factory=list)

    @classmethod
    def empty(cls) -> Score:
        return cls()

    def add(self, ref_logp: np.ndarray, logits: np.ndarray) -> None:
        """ref_logp: the reference's log-probabilities; logits: the evaluated model's."""
        self.kl.append((np.exp(ref_logp) * (ref_logp - log_softmax(logits))).sum(axis=-1))
        self.top.append(np.argmax(ref_logp, axis=-1) == np.argmax(logits, axis=-1))

    def summary(self) -> dict:
        kl, top = np.concatenate(self.kl), np.concatenate(self.top)
        return {"positions": int(kl.size), "kl_mean": float(kl.mean()),
                "kl_p99": float(np.quantile(kl, 0.99)), "kl_max": float(kl.max()),
                "top1": float(top.mean())}


# ---------------------------------------------------------------- llama.cpp's base files

def read_kld_base(path: str):
    """A `llama-perplexity --kl-divergence-base` file: (n_ctx, n_vocab, tokens, logp), logp
    [n_chunk, n_scored, n_vocab] float32 log-probabilities as llama.cpp stores them (uint16
    steps between the row's max and max - 16; anything lower reads as the floor)."""
    with open(path, "rb") as f:
        if f.read(8) != b"_logits_":
            raise ValueError(f"{path}: not a llama-perplexity logits file")
        n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", f.read(12))
        tokens = np.frombuffer(f.read(4 * n_ctx * n_chunk), np.int32)
        nv = 2 * ((n_vocab + 1) // 2) + 4
        n_scored = n_ctx - 1 - n_ctx // 2
        raw = np.frombuffer(f.read(2 * nv * n_scored * n_chunk), np.uint16).reshape(
            n_chunk, n_scored, nv)
    head = raw[..., :4].copy().view(np.float32)  # [scale, min_log_prob] per row
    logp = head[..., :1] * raw[..., 4:4 + n_vocab].astype(np.float32) + head[..., 1:2]
    return n_ctx, n_vocab, tokens, logp


def kl_rows_llamacpp(base_logp: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL as llama-perplexity computes it against a stored base: only tokens whose base
    log-probability is above -16 count."""
    b = np.asarray(base_logp, np.float64)
    return np.where(b > -16, np.exp(b) * (b - log_softmax(logits)), 0.0).sum(axis=-1)


# ---------------------------------------------------------------- modes and the rule

@dataclass(frozen=True)
class Mode:
    """One CPU configuration, as the environment selects it (gpu/ops/cpu_features.py):
    ZEROLAYER_CPU_KERNELS, ZEROLAYER_CPU_ACTIVATIONS (ignored by the float kernels) and
    ZEROLAYER_CPU_KV."""
    kernels: str      # vnni, avx2, float
    activations: str  # int8, int16, int8-qkv16; "-" for the float kernels
    kv: str           # f16, f32

    @property
    def name(self) -> str:
        return f"{self.kernels}/{self.activations}/{self.kv}"

    @classmethod
    def parse(cls, name: str) -> Mode:
        return cls(*name.split("/"))


# Fastest first, within one machine, from docs/BENCHMARKS.md's measurements (not re-timed
# by the harness): bench_activations.py, interleaved on one model, puts int8 ahead of
# int8-qkv16 ahead of int16 at prefill (bundled pp100 1.39x / 1.33x int16's; synthetic 1.1B
# 1.47-1.64x / 1.41-1.51x) with decode level within 5%; all three faster than the float
# kernels (108 vs 137+ tok/s); the f16 KV cache reads half the bytes of f32 at depth; VNNI
# before AVX2 where both run.
SPEED_ORDER = [Mode(k, a, kv) for k in ("vnni", "avx2") for a in ("int8", "int8-qkv16", "int16")
               for kv in ("f16", "f32")] + [Mode("float", "-", kv) for kv in ("f16", "f32")]

TOP1_MIN = 0.995  # at most one position in 200 whose greedy token differs from the F32 model's
KL_MAX = 1e-5     # mean KL per position (int16 activations: 5e-7; the int8 modes: ~2e-3)


def acceptable(kl_mean: float, top1: float) -> bool:
    return kl_mean <= KL_MAX and top1 >= TOP1_MIN


def pick_default(kl_by_mode: dict[str, float], top1_by_mode: dict[str, float],
                 order: list[Mode] = SPEED_ORDER) -> Mode | None:
    """The fastest measured mode that passes the rule (None: none does)."""
    return next((m for m in order if kl_by_mode.get(m.name) is not None
                 and top1_by_mode.get(m.name) is not None
                 and acceptable(kl_by_mode[m.name], top1_by_mode[m.name])), None)


def apply_rule(res: dict) -> dict:
    """Per mode the figures the rule uses (the worse path's KL and top-1) and whether it
    passes; the pick. llama.cpp's KL rides along as information: the bar is the F32 model,
    not the peer's loss (its Q4_1 agrees at ~97%, as our int8 activations do)."""
    kl = {m: max(r[p]["kl_mean"] for p in r) for m, r in res["modes"].items()}
    top1 = {m: min(r[p]["top1"] for p in r) for m, r in res["modes"].items()}
    picked = pick_default(kl, top1)
    return {"kl": kl, "top1": top1, "bounds": {"kl_max": KL_MAX, "top1_min": TOP1_MIN},
            "llamacpp_kl": res.get("llamacpp", {}).get("kl_mean"),
            "acceptable": {m: acceptable(kl[m], top1[m]) for m in kl},
            "picked": picked.name if picked else None}
