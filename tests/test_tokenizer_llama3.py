"""Llama 3's tokenizer (tokenizer.ggml.pre = llama-bpe): the pre-tokenizer, BOS handling and
the token-count lower bound, on a small vocabulary here, and on llama.cpp's own vocabulary
test files (models/ggml-vocab-*.gguf with their .inp/.out ids) where bench/setup_llamacpp.sh
has unpacked llama.cpp's source (not in CI: skipped there, with the reason)."""
from __future__ import annotations

import glob
import os

import gguf
import numpy as np
import pytest

from zerolayer.gpu.generate import encode_prompt
from zerolayer.gpu.tokenizer import Tokenizer, _byte_decoder

# The start of Llama 3.x's chat template: it writes the BOS itself
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]


def small_llama3(pre: str = "llama-bpe", add_bos: bool | None = None) -> Tokenizer:
    byte_char = {b: c for c, b in _byte_decoder().items()}  # GPT-2's byte alphabet
    toks = SPECIALS + [byte_char[b] for b in range(256)] + ["12", "123", "Ġab"]
    return Tokenizer(toks, [3] * len(SPECIALS) + [1] * (len(toks) - len(SPECIALS)),
                     ["1 2", "12 3"], bos_id=0, eos_id=4, chat_template=LLAMA3_TEMPLATE,
                     pre=pre, add_bos=add_bos)


def test_numbers_are_pieces_of_up_to_three_digits():
    tok = small_llama3()
    ids = tok.encode("1234567")
    assert [tok.decode([i]) for i in ids] == ["123", "4", "5", "6", "7"]  # pieces 123|456|7
    assert tok.decode(ids) == "1234567"
    # SmolLM2's pre-tokenizer isolates every digit: no "123" there
    smol = small_llama3(pre="smollm")
    assert [smol.decode([i]) for i in smol.encode("1234567")] == list("1234567")
    # ignore_merges: the piece " ab" is in the vocabulary, taken whole with no merge for it
    assert tok.encode(" ab") == [tok.vocab_size - 1]
    assert len(smol.encode(" ab")) == 3


def test_bos_once_for_prompts_and_chats():
    tok = small_llama3()
    assert tok.add_bos and not small_llama3(pre="smollm").add_bos
    assert not small_llama3(add_bos=False).add_bos  # the GGUF's add_bos_token wins
    ids = encode_prompt(tok, tok.vocab_size, prompt="hi 123")
    assert ids[0] == tok.bos_id and tok.bos_id not in ids[1:]
    assert list(ids[1:]) == tok.encode("hi 123")
    chat = encode_prompt(tok, tok.vocab_size, messages=[{"role": "user", "content": "hi"}])
    assert chat[0] == tok.bos_id and list(chat).count(tok.bos_id) == 1  # the template's BOS
    assert tok.token_id("<|eot_id|>") in tok.eos_ids
    # a plain-text BOS typed by a user stays text, and the real one is still added
    typed = encode_prompt(tok, tok.vocab_size, prompt="<|begin_of_text|>")
    assert typed[0] == tok.bos_id and list(typed).count(tok.bos_id) == 1
    # token ids are taken as they are
    assert list(encode_prompt(tok, tok.vocab_size, token_ids=[7, 8])) == [7, 8]


@pytest.mark.parametrize("text", ["1234567890" * 50, "a1b22c333d4444 " * 40, "2024-12-03"])
def test_min_tokens_stays_a_lower_bound_with_digit_groups(text):
    tok = small_llama3()
    n = len(tok.encode(text))
    assert tok.min_tokens(text) <= n and tok.plain_bound(text) <= n


# ------------------------------------------------- llama.cpp's own vocabulary test files

def _vocab_dir() -> str | None:
    env = os.environ.get("ZEROLAYER_LLAMACPP_SRC")
    roots = [env] if env else glob.glob(os.path.join(
        os.path.dirname(__file__), "..", ".bench-llamacpp", "src", "*", "vendor", "llama.cpp"))
    for root in roots:
        d = os.path.join(root, "models")
        if os.path.exists(os.path.join(d, "ggml-vocab-llama-bpe.gguf.inp")):
            return d
    return None


VOCABS = _vocab_dir()


@pytest.mark.skipif(VOCABS is None, reason="llama.cpp's source is not unpacked here (bash "
                    "bench/setup_llamacpp.sh, or ZEROLAYER_LLAMACPP_SRC): its vocabulary test "
                    "files are not part of this repository")
@pytest.mark.parametrize("name", ["llama-bpe", "qwen2"])
def test_llamacpp_vocabulary_test_files(name):
    """Every case of llama.cpp's test-tokenizer-0 for this vocabulary: the same ids."""
    path = os.path.join(VOCABS, f"ggml-vocab-{name}.gguf")
    tok = Tokenizer.from_gguf(gguf.GGUFReader(path))
    with open(path + ".inp", encoding="utf-8") as f:
        inputs = f.read().split("\n__ggml_vocab_test__\n")
    with open(path + ".out", encoding="utf-8") as f:
        outputs = [line.strip() for line in f.read().split("\n")]
    assert len(inputs) >= 40 and len(outputs) >= len(inputs)
    for text, out in zip(inputs, outputs):
        want = [int(x) for x in out.split()]
        assert tok.encode(text) == want, repr(text)
        assert tok.min_tokens(text) <= len(want)
    assert tok.add_bos == (name == "llama-bpe")
    ids = encode_prompt(tok, tok.vocab_size, prompt="Hello world")
    assert list(ids) == ([tok.bos_id] if tok.add_bos else []) + tok.encode("Hello world")
    assert np.all(ids < tok.vocab_size)
