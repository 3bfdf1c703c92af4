"""The GPU check's peers in gpu_bench.py's shapes, in the same run: a plain PyTorch Llama whose
decode step is a replayed CUDA graph, and HF transformers' eager generate, checked against
each other before they are timed. Writes gpu_peer.json; see bench/README.md.

    python bench/gpu_peer.py [--out DIR] [--budget-s 60]
    python bench/gpu_peer.py --device cpu --tiny     # logic check without a GPU
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_warm  # noqa: E402  (the shapes only: it imports nothing heavy)

SMOL = dict(gpu_warm.SMOL, rope_base=100000.0, eps=1e-5)
TINY = dict(gpu_warm.TINY, ff=96, rope_base=100000.0, eps=1e-5)


class PlainLlama:
    """A Llama forward pass in plain torch ops over a static KV cache."""

    def __init__(self, c: dict, device, dtype, seed: int = 0):
        import torch
        self.c, self.device, self.dtype = c, device, dtype
        g = torch.Generator(device="cpu").manual_seed(seed)
        D, F, nh, nkv, hd, V = c["d"], c["ff"], c["n_head"], c["n_kv"], c["hd"], c["vocab"]

        def w(*shape, fan_in=None):
            t = torch.randn(*shape, generator=g) / math.sqrt(fan_in or shape[-1])
            return t.to(device=device, dtype=dtype)

        self.emb = w(V, D, fan_in=1)  # tied: also the LM head
        self.layers = []
        for _ in range(c["n_layer"]):
            self.layers.append({
                "attn_norm": (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype),
                "wq": w(nh * hd, D), "wk": w(nkv * hd, D), "wv": w(nkv * hd, D), "wo": w(D, nh * hd),
                "ffn_norm": (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype),
                "wg": w(F, D), "wu": w(F, D), "wd": w(D, F)})
        self.out_norm = (1 + 0.1 * torch.randn(D, generator=g)).to(device, dtype)
        inv = 1.0 / (c["rope_base"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = torch.arange(c["ctx"], dtype=torch.float32)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)                      # HF's rotate_half layout
        self.cos, self.sin = ang.cos().to(device, dtype), ang.sin().to(device, dtype)
        self.k = self.v = None

    def alloc_cache(self, batch: int, length: int) -> None:
        import torch
        c = self.c
        shape = (c["n_layer"], batch, c["n_kv"], length, c["hd"])
        self.k = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.v = torch.zeros(shape, device=self.device, dtype=self.dtype)

    def _norm(self, x, w):
        import torch
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.c["eps"])).to(self.dtype) * w

    @staticmethod
    def _rot(x, cos, sin):
        import torch
        h = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin

    def forward(self, tokens, pos0=None, pos=None):
        """tokens [B, T]. Prefill (pos0: int, the first position; T tokens attend causally to
        the cache up to them) or decode (pos: a device scalar tensor, T = 1, graph-safe).
        Writes K, V to the cache; returns the last position's logits [B, V]."""
        import torch
        import torch.nn.functional as F
        c = self.c
        nh, nkv, hd = c["n_head"], c["n_kv"], c["hd"]
        B, T = tokens.shape
        S = self.k.shape[3]
        if pos is None:
            idx = torch.arange(pos0, pos0 + T, device=self.device)
        else:
            idx = pos.reshape(1)
        cos, sin = self.cos[idx][None, None], self.sin[idx][None, None]   # [1, 1, T, hd]
        if pos is None:
            keys = torch.arange(S, device=self.device)
            mask = keys[None, :] <= idx[:, None]                            # [T, S]
        else:
            mask = (torch.arange(S, device=self.device) <= pos)[None, :]   # [1, S]
        x = self.emb[tokens]
        for i, L in enumerate(self.layers):
            h = self._norm(x, L["attn_norm"])
            q = (h @ L["wq"].T).view(B, T, nh, hd).transpose(1, 2)
            k = (h @ L["wk"].T).view(B, T, nkv, hd).transpose(1, 2)
            v = (h @ L["wv"].T).view(B, T, nkv, hd).transpose(1, 2)
            q, k = self._rot(q, cos, sin), self._rot(k, cos, sin)
            self.k[i].index_copy_(2, idx, k)
            self.v[i].index_copy_(2, idx, v)
            # GQA: each KV head serves nh // nkv query heads (expand + reshape: no host sync)
            K = self.k[i][:, :, None].expand(B, nkv, nh // nkv, S, hd).reshape(B, nh, S, hd)
            V = self.v[i][:, :, None].expand(B, nkv, nh // nkv, S, hd).reshape(B, nh, S, hd)
            a = F.scaled_dot_product_attention(q, K, V, attn_mask=mask)
            x = x + a.transpose(1, 2).reshape(B, T, nh * hd) @ L["wo"].T
            h = self._norm(x, L["ffn_norm"])
            x = x + (F.silu(h @ L["wg"].T) * (h @ L["wu"].T)) @ L["wd"].T
        return self._norm(x[:, -1], self.out_norm) @ self.emb.T

    def hf_state_dict(self) -> dict:
        """These weights under HF LlamaForCausalLM's names."""
        sd = {"model.embed_tokens.weight": self.emb, "lm_head.weight": self.emb,
              "model.norm.weight": self.out_norm}
        names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
                 "wo": "self_attn.o_proj", "wg": "mlp.gate_proj", "wu": "mlp.up_proj",
                 "wd": "mlp.down_proj"}
        for i, L in enumerate(self.layers):
            for k, n in names.items():
                sd[f"model.layers.{i}.{n}.weight"] = L[k]
        return sd


def hf_model(c: dict, device, dtype):
    """HF's LlamaForCausalLM in the shapes of c, randomly initialised."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["d"], intermediate_size=c["ff"],
                      num_hidden_layers=c["n_layer"], num_attention_heads=c["n_head"],
                      num_key_value_heads=c["n_kv"], head_dim=c["hd"], rope_theta=c["rope_base"],
                      max_position_embeddings=c["ctx"], rms_norm_eps=c["eps"],
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(device):
        m = LlamaForCausalLM(cfg)
    return m.to(dtype=dtype).eval()


def _syncer(device):
    """torch.cuda.synchronize on a GPU, else nothing."""
    import torch
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _median_s(fn, n: int) -> float:
    """The median wall seconds of n calls of fn."""
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[n // 2]


def agreement(c: dict, device, dtype) -> dict:
    """The plain model against HF's LlamaForCausalLM with the same weights (one prompt), and
    a decode step through the static cache against the prefill of the same tokens. In float32
    and two layers of the full width: what is checked is the structure (RoPE, GQA, masks,
    norms, the tied head), which bf16 rounding over 30 layers would blur."""
    import torch
    c = dict(c, n_layer=min(c["n_layer"], 2))
    dtype = torch.float32
    with torch.no_grad():
        pm = PlainLlama(c, device, dtype, seed=1)
        g = torch.Generator(device="cpu").manual_seed(5)
        toks = torch.randint(3, c["vocab"], (2, 12), generator=g).to(device)
        pm.alloc_cache(2, 64)
        full = pm.forward(toks, pos0=0).float()
        pm.alloc_cache(2, 64)
        pm.forward(toks[:, :-1], pos0=0)
        step = pm.forward(toks[:, -1:], pos=torch.tensor(11, device=device)).float()
        hf = hf_model(c, device, dtype)
        missing, unexpected = hf.load_state_dict(pm.hf_state_dict(), strict=False)
        ref = hf(toks).logits[:, -1].float()
    scale = float(ref.abs().max())
    out = {"plain_vs_hf": float((full - ref).abs().max()) / scale,
           "decode_vs_prefill": float((step - full).abs().max()) / scale,
           "same_argmax_hf": bool((full.argmax(-1) == ref.argmax(-1)).all()),
           "missing": list(missing), "unexpected": list(unexpected)}
    # float32: differences of summation order only (a wrong RoPE base alone gives 5e-2)
    tol = 1e-4
    out.update(tol=tol, layers=c["n_layer"], dtype="float32")
    if out["plain_vs_hf"] > tol or out["decode_vs_prefill"] > tol or missing:
        raise AssertionError(f"peer models disagree: {out}")
    return out


def torch_graph(c: dict, p: dict, device, dtype) -> dict:
    """(a): decode steps replayed as a CUDA graph (eager on the CPU), prefill eager."""
    import torch
    graphs, sync = device.type == "cuda", _syncer(device)
    out: dict = {"graphs": graphs}
    with torch.no_grad():
        pm = PlainLlama(c, device, dtype)
        gen = torch.Generator(device="cpu").manual_seed(3)
        for batch in p["batches"]:
            length = -(-(p["prompt"] + p["steps"] + 8) // 64) * 64
            pm.alloc_cache(batch, length)
            prompt = torch.randint(3, c["vocab"], (batch, p["prompt"]), generator=gen).to(device)
            logits = pm.forward(prompt, pos0=0)
            tok = logits.argmax(-1, keepdim=True)
            pos = torch.tensor(p["prompt"], device=device)
            t = time.perf_counter()
            if graphs:
                static_tok, static_pos = tok.clone(), pos.clone()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):  # warm-up outside capture (rewrites one KV slot)
                        pm.forward(static_tok, pos=static_pos)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_logits = pm.forward(static_tok, pos=static_pos)

                def step():
                    graph.replay()
                    nxt = static_logits.argmax(-1, keepdim=True)
                    static_tok.copy_(nxt)
                    static_pos.add_(1)
                    return nxt.cpu()  # ids to the host each step, as our engine
            else:
                static_tok, static_pos = tok, pos

                def step():
                    nonlocal static_tok
                    lg = pm.forward(static_tok, pos=static_pos)
                    static_tok = lg.argmax(-1, keepdim=True)
                    static_pos.add_(1)
                    return static_tok.cpu()
            step()
            sync()
            warm_s = time.perf_counter() - t
            med = _median_s(step, p["steps"])
            out[f"b{batch}"] = {"batch": batch, "step_us": med * 1e6, "us_per_token": med * 1e6 / batch,
                                "tok_s": batch / med, "steps": p["steps"], "warm_s": round(warm_s, 3),
                                "cache_len": length}
            print(f"  plain torch{' graph' if graphs else ''} b{batch}: {med * 1e6 / batch:,.0f} us/token, "
                  f"{batch / med:,.0f} tok/s", flush=True)
        n = p["prefill"]
        pm.alloc_cache(1, n)
        toks = torch.randint(3, c["vocab"], (1, n), generator=gen).to(device)
        pm.forward(toks, pos0=0)
        sync()
        med = _median_s(lambda: pm.forward(toks, pos0=0).argmax(-1).cpu(), 3)
        out["prefill"] = {"tokens": n, "s": med, "tok_s": n / med}
        print(f"  plain torch prefill {n}: {n / med:,.0f} tok/s", flush=True)
    return out


def hf_eager(c: dict, p: dict, device, dtype) -> dict:
    """(b): HF generate, greedy, eager. Per token: (t(n2) - t(n1)) / (n2 - n1) new tokens."""
    import torch
    m, sync = hf_model(c, device, dtype), _syncer(device)
    gen = torch.Generator(device="cpu").manual_seed(4)
    out: dict = {"attn_implementation": str(getattr(m.config, "_attn_implementation", "?"))}
    n1, n2 = p["hf_new"]
    with torch.no_grad():
        for batch in p["hf_batches"]:
            ids = torch.randint(3, c["vocab"], (batch, 32), generator=gen).to(device)
            att = torch.ones_like(ids)

            def gen_n(n):
                sync()
                t = time.perf_counter()
                r = m.generate(input_ids=ids, attention_mask=att, max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=0)
                sync()
                assert r.shape[1] == 32 + n, r.shape
                return time.perf_counter() - t
            gen_n(2)  # warm-up
            a = min(gen_n(n1) for _ in range(2))
            b = min(gen_n(n2) for _ in range(2))
            if b <= a:  # noise larger than the extra tokens' cost: nothing to report
                out[f"b{batch}"] = {"batch": batch, "note": f"{n2} new tokens took no longer than {n1}"}
                continue
            per = (b - a) / (n2 - n1)
            out[f"b{batch}"] = {"batch": batch, "ms_per_step": per * 1e3, "ms_per_token": per * 1e3 / batch,
                                "tok_s": batch / per}
            print(f"  HF eager generate b{batch}: {per * 1e3:.1f} ms/step, {batch / per:,.0f} tok/s",
                  flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (logic check)")
    ap.add_argument("--budget-s", type=float, default=60.0,
                    help="stop starting new sections after this many seconds")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    import torch
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_peer: no CUDA device for torch", file=sys.stderr)
        return 2
    c = TINY if a.tiny else SMOL
    p = (dict(batches=(1, 4), prompt=8, steps=4, prefill=32, hf_batches=(1, 4), hf_new=(2, 4)) if a.tiny
         else dict(batches=(1, 16, 64), prompt=128, steps=64, prefill=512, hf_batches=(1, 16),
                   hf_new=(8, 24)))
    dtype = torch.bfloat16
    res: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                 "torch": torch.__version__, "dtype": "bfloat16", "config": c, "plan": p,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sections": {}}
    try:
        import transformers
        res["transformers"] = transformers.__version__
    except ImportError:
        res["transformers"] = None
    print(f"gpu_peer: torch {torch.__version__} on {res['device']}", flush=True)
    for name, fn in (("agree", agreement), ("torch_graph", torch_graph), ("hf_eager", hf_eager)):
        if time.monotonic() - t0 > a.budget_s:
            res["sections"][name] = {"skipped": "time budget spent"}
            continue
        t = time.monotonic()
        print(f"[{name}] ...", flush=True)
        try:
            r = fn(c, device, dtype) if name == "agree" else fn(c, p, device, dtype)
            res["sections"][name] = {"ok": True, **r}
        except Exception:
            res["sections"][name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
            print(traceback.format_exc(), flush=True)
        res["sections"][name]["s"] = round(time.monotonic() - t, 2)
        print(f"[{name}] done in {time.monotonic() - t:.1f} s", flush=True)
    res["wall_s"] = round(time.monotonic() - t0, 1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_peer.json"
    path.write_text(json.dumps(res, indent=1))
    print(f"gpu_peer: {path} ({res['wall_s']} s)")
    return 1 if any(v.get("ok") is False for v in res["sections"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
