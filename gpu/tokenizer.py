"""In-process tokenizer, chat template and incremental detokenizer, built from GGUF metadata.

The GGUF file is the single source of truth (no tokenizer service, no tokenizer.json
on the side). The BPE itself runs in HuggingFace `tokenizers` (Rust); the pre-tokenizer is set
up to reproduce llama.cpp's pre-tokenizer named by `tokenizer.ggml.pre` (`smollm`, `qwen2`,
Llama 3's `llama-bpe`) so ids match llama.cpp token for token; other names are refused.
A BOS is prepended where the GGUF asks for one (`tokenizer.ggml.add_bos_token`, as Llama 3's
do): `with_bos`, applied to every prompt by gpu/generate.encode_prompt.

Special tokens are never matched inside user text: `encode` only splits on control tokens when
the caller asks (`parse_special=True`), and `encode_chat` only lets the *template* emit them.
"""
from __future__ import annotations

import codecs
import math
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TypeAlias, TypedDict

import gguf
import numpy as np
import numpy.typing as npt
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

from .errors import ModelFormatError, UnsupportedModelError

# A chat message as the GGUF template reads it: JSON (role, content, and whatever else the
# template looks at, such as tool calls).
JSONValue: TypeAlias = "str | int | float | bool | None | list[JSONValue] | dict[str, JSONValue]"
Message: TypeAlias = Mapping[str, JSONValue]


class TokenizerMeta(TypedDict):
    """Tokenizer's constructor arguments, as plain JSON-able data (cached beside the weights)."""
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int
    eos_id: int
    chat_template: str | None
    pre: str
    add_bos: bool | None

# llama.cpp (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM) splits in two passes: every numeric
# code point on its own, then the classic GPT-2 pattern. Pieces that no pattern matches are kept
# as their own pieces (Split "isolated" does the same), then each piece is byte-level BPE'd.
_SMOLLM_DIGITS = r"\p{N}"
_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2: one pass of Qwen2's tokenizer.json pattern, its
# case-insensitive contractions spelled out. Digits are single pieces here too.
_QWEN2_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                  r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                  r"|\s+(?!\S)|\s+")
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_LLAMA3 (Llama 3.x's tokenizer.json pattern, contractions
# spelled out as above): as Qwen2's but numbers in pieces of up to three digits.
_LLAMA3_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                   r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the regexes applied one after the other (Split "isolated" each)
_PRE_PATTERNS = {"smollm": (_SMOLLM_DIGITS, _GPT2_PATTERN), "qwen2": (_QWEN2_PATTERN,),
                 "llama-bpe": (_LLAMA3_PATTERN,), "llama3": (_LLAMA3_PATTERN,),
                 "llama-v3": (_LLAMA3_PATTERN,)}
# Pre-tokenizers whose BPE takes a piece that is itself in the vocabulary as one token, merges
# or not (llama.cpp's ignore_merges), and that add a BOS when the GGUF does not say.
_IGNORE_MERGES = frozenset({"llama-bpe", "llama3", "llama-v3"})
_DEFAULT_ADD_BOS = frozenset({"llama-bpe", "llama3", "llama-v3"})
# The most ASCII digits one piece (so one token) can hold, where a pattern groups them
# (\p{N}{1,3}); elsewhere each digit is its own piece. Used by the token-count lower bound.
_DIGITS_PER_PIECE = {"llama-bpe": 3, "llama3": 3, "llama-v3": 3}

# ChatML, for a qwen2 GGUF without tokenizer.chat_template (llama.cpp's default template):
# no system prompt of its own.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# gguf token_type values (llama.cpp's llama_token_type).
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4

# Names llama.cpp also treats as end-of-generation when present in the vocab.
_EXTRA_EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte<->printable-unicode table, inverted: token text char -> raw byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _field_str(reader: gguf.GGUFReader, key: str) -> str | None:
    f = reader.fields.get(key)
    return None if f is None else bytes(f.parts[f.data[0]]).decode("utf-8")


def _field_int(reader: gguf.GGUFReader, key: str) -> int | None:
    f = reader.fields.get(key)
    return None if f is None else int(f.parts[f.data[0]][0])


def _field_bool(reader: gguf.GGUFReader, key: str) -> bool | None:
    f = reader.fields.get(key)
    return None if f is None else bool(f.parts[f.data[0]][0])


def _field_strs(reader: gguf.GGUFReader, key: str) -> list[str]:
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


class IncrementalDetokenizer:
    """Turns a token stream into text chunks that never end inside a UTF-8 character.

    A multi-byte character (emoji, CJK) is often spread over several byte-level tokens; the
    codec's incremental decoder holds back the incomplete tail until the next push completes it.
    """

    def __init__(self, tok: Tokenizer, skip_special: bool = True) -> None:
        self._tok = tok
        self._skip_special = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self._skip_special and self._tok.is_special(token_id):
            return ""
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        # A dangling partial sequence can never complete now: it becomes U+FFFD, like decode().
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out


class Tokenizer:
    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str],
        *,
        bos_id: int,
        eos_id: int,
        chat_template: str | None,
        pre: str = "smollm",
        add_bos: bool | None = None,
    ) -> None:
        if pre not in _PRE_PATTERNS:
            # Other pre-tokenizers need other regexes; refuse rather than silently drift.
            raise UnsupportedModelError(
                f"unsupported tokenizer.ggml.pre={pre!r} (supported: {', '.join(_PRE_PATTERNS)})")
        self.pre = pre
        self.add_bos = pre in _DEFAULT_ADD_BOS if add_bos is None else bool(add_bos)
        self._digit_share = 1.0 / _DIGITS_PER_PIECE.get(pre, 1)
        self._tokens = list(tokens)
        self._types = list(token_types)
        self._bos_id = bos_id
        self._eos_id = eos_id
        self._chat_template = chat_template

        vocab = {t: i for i, t in enumerate(self._tokens)}
        pairs = [(a, b) for a, b in (m.split(" ", 1) for m in merges)]
        hf = _HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False,
                                     ignore_merges=pre in _IGNORE_MERGES))
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in _PRE_PATTERNS[pre]]
            # Regex already applied above; ByteLevel only maps bytes to its alphabet.
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        # No added tokens are registered: HF would then match them inside any text.
        self._hf = hf

        # Control tokens (and user-defined ones) are what parse_special may match.
        self._special_ids = frozenset(
            i for i, t in enumerate(self._types) if t in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED)
        )
        specials = sorted((self._tokens[i] for i in self._special_ids), key=len, reverse=True)
        self._special_by_text = {self._tokens[i]: i for i in self._special_ids}
        # Longest first, so a token that is a prefix of another never wins the match.
        self._special_re = re.compile("|".join(map(re.escape, specials))) if specials else None

        # token text -> raw bytes: the byte-level alphabet's chars to latin-1 code points by
        # str.translate, one C call per token (a Python loop per char was 0.1 s of start-up)
        to_latin1 = {ord(c): b for c, b in _byte_decoder().items()}
        self._bytes: list[bytes] = [
            t.encode("utf-8") if i in self._special_ids else t.translate(to_latin1).encode("latin-1")
            for i, t in enumerate(self._tokens)]

        # The longest token, in bytes: a text of n bytes is at least ceil(n / this) tokens.
        self.max_token_bytes = max(1, max(len(b) for b in self._bytes))
        # A sharper bound, per byte value: the longest token containing it. A token of n
        # bytes covers n bytes, each of which has longest >= n, so over any text
        # sum(1 / longest[byte]) <= tokens: the bound that lets an over-long prompt of any
        # shape be refused before it is tokenized (a run of "a" needs >= 1 token per 8
        # bytes, not per 81). Digits: at most _DIGITS_PER_PIECE per token (the pre-tokenizer).
        lens = np.array([len(b) for b in self._bytes], np.int64)
        flat = np.frombuffer(b"".join(self._bytes), np.uint8)  # every token's bytes, in order
        flat_len = np.repeat(lens, lens)  # the length of the token each byte is in
        sets = np.zeros((len(self._bytes), 256), np.bool_)  # which bytes each token holds
        sets[np.repeat(np.arange(len(lens)), lens), flat] = True
        longest = np.ones(256)
        np.maximum.at(longest, flat, flat_len)
        self._byte_share = _share(longest, self._digit_share)
        # kept packed for plain_bound(), which redoes this over a text's own byte set
        self._token_len, self._token_sets = lens, np.packbits(sets, axis=1)

        eog = {eos_id}
        for text in _EXTRA_EOG_TEXTS:
            if text in self._special_by_text:
                eog.add(self._special_by_text[text])
        self._eos_ids = frozenset(eog)

        self._template = None
        if chat_template is not None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            env.globals["strftime_now"] = _strftime_now  # Llama 3.2's templates date the system turn
            self._template = env.from_string(chat_template)
        self._specials_per_message = self._count_specials_per_message()

    def _count_specials_per_message(self) -> dict[str, int]:
        """Control tokens the template adds for one more message of each common role (what a
        message costs at least, whatever its content). Roles not listed count 0."""
        if self._template is None or self._special_re is None:
            return {}
        out = {}
        for role in ("system", "user", "assistant"):
            try:
                m = {"role": role, "content": ""}
                one = self._render([{"role": "user", "content": ""}, m], False)
                two = self._render([{"role": "user", "content": ""}, m, m], False)
            except Exception:  # noqa: BLE001 - a template that refuses the shape: no bound
                continue
            n = len(self._special_re.findall(two)) - len(self._special_re.findall(one))
            if n > 0:
                out[role] = n
        return out

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, reader: gguf.GGUFReader) -> Tokenizer:
        return cls(**cls.metadata_from_gguf(reader))

    @staticmethod
    def metadata_from_gguf(reader: gguf.GGUFReader) -> TokenizerMeta:
        """The constructor's arguments, as plain JSON-able data (cached beside the weights)."""
        model = _field_str(reader, "tokenizer.ggml.model")
        if model != "gpt2":
            raise UnsupportedModelError(f"unsupported tokenizer.ggml.model={model!r} (want gpt2 BPE)")
        tokens = _field_strs(reader, "tokenizer.ggml.tokens")
        tf = reader.fields["tokenizer.ggml.token_type"]
        types = [int(tf.parts[i][0]) for i in tf.data]
        merges = _field_strs(reader, "tokenizer.ggml.merges")
        bos = _field_int(reader, "tokenizer.ggml.bos_token_id")
        eos = _field_int(reader, "tokenizer.ggml.eos_token_id")
        if bos is None or eos is None:
            raise ModelFormatError("GGUF lacks bos/eos token ids")
        template = _field_str(reader, "tokenizer.chat_template")
        if template is None and _field_str(reader, "general.architecture") == "qwen2":
            template = CHATML_TEMPLATE
        return TokenizerMeta(
            tokens=tokens,
            token_types=types,
            merges=merges,
            bos_id=bos,
            eos_id=eos,
            chat_template=template,
            pre=_field_str(reader, "tokenizer.ggml.pre") or "smollm",
            add_bos=_field_bool(reader, "tokenizer.ggml.add_bos_token"),
        )

    @classmethod
    def from_path(cls, path: str) -> Tokenizer:
        return cls.from_gguf(gguf.GGUFReader(path))

    # ---- properties ---------------------------------------------------------------------

    @property
    def bos_id(self) -> int:
        return self._bos_id

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._eos_ids

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def token_id(self, text: str) -> int | None:
        """Id of a special token by its text (e.g. "<|im_end|>"), or None."""
        return self._special_by_text.get(text)

    # ---- encode / decode ----------------------------------------------------------------

    def _encode_plain(self, text: str) -> list[int]:
        if not text:
            return []
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode(self, text: str, *, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, without BOS (see with_bos).

        With parse_special=False (the default, for anything a user wrote) a string like
        "<|im_end|>" is tokenized as ordinary characters and can never end a turn.
        """
        if not parse_special or self._special_re is None:
            return self._encode_plain(text)
        ids: list[int] = []
        pos = 0
        for m in self._special_re.finditer(text):
            ids += self._encode_plain(text[pos : m.start()])
            ids.append(self._special_by_text[m.group()])
            pos = m.end()
        ids += self._encode_plain(text[pos:])
        return ids

    def with_bos(self, ids: list[int]) -> list[int]:
        """A prompt's ids as the model expects them: BOS first when the GGUF adds one
        (add_bos_token), and only one (a chat template that writes its own BOS keeps it)."""
        if self.add_bos and (not ids or ids[0] != self._bos_id):
            return [self._bos_id] + list(ids)
        return list(ids)

    def min_tokens(self, prompt: str | None = None,
                   messages: Sequence[Message] | None = None) -> int:
        """A lower bound on len(encode(prompt)) or len(encode_chat(messages)), in one pass
        over the text's bytes (~2 ms per MiB): the per-byte bound above, over the prompt or
        the messages' contents (the template's glue only adds tokens), plus each message's
        control tokens."""
        if messages is None:
            return self._bytes_bound(prompt or "")
        text = "".join(c for m in messages if isinstance(c := m.get("content", ""), str))
        return self.control_tokens(messages) + self._bytes_bound(text)

    def plain_bound(self, text: str) -> int:
        """A sharper lower bound on len(encode(text)), for a plain text (not a chat: the
        template's glue could join its edges): every token of it is made of bytes the text
        has, so only those tokens count when finding the longest token per byte. A run of
        spaces then needs a token per 64 bytes (the longest all-space token), not per 81
        (a newline and 80 spaces). It matters for texts of few distinct bytes (long runs,
        which the pre-tokenizer cannot split); for others it is the cheap bound (< 5 ms)."""
        counts = _byte_counts(text)
        if np.count_nonzero(counts) > 16:
            return _bound(counts, self._byte_share)
        usable = ~np.any(self._token_sets & np.packbits(counts == 0), axis=1)
        sets = np.unpackbits(self._token_sets[usable], axis=1).astype(np.bool_)
        return _bound(counts, _byte_share(sets, self._token_len[usable], np.flatnonzero(counts),
                                          self._digit_share))

    def _bytes_bound(self, text: str) -> int:
        return _bound(_byte_counts(text), self._byte_share)

    def control_tokens(self, messages: Sequence[Message]) -> int:
        """The control tokens the template adds for these messages, at least."""
        per = self._specials_per_message
        return sum(per.get(r, 0) for m in messages if isinstance(r := m.get("role", ""), str))

    def encode_until(self, text: str, limit: int, chunk: int = 4096) -> list[int]:
        """encode(text) when it is at most `limit` tokens; otherwise its first tokens, more
        than `limit` of them, found by tokenizing only as much of the text as it takes. The
        text is cut only between two of the pre-tokenizer's pieces, and BPE never merges
        across those, so the chunks' ids are exactly those of the whole."""
        ids: list[int] = []
        pos, end_all = 0, len(text)
        while pos < end_all:
            end = self._piece_boundary(text, pos, chunk)
            ids += self._encode_plain(text[pos:end])
            if len(ids) > limit:
                break
            pos = end
        return ids

    def _piece_boundary(self, text: str, pos: int, chunk: int) -> int:
        """A position about `chunk` characters after `pos` (a piece boundary) where the
        pre-tokenization of the whole text has a boundary too, or len(text).

        Pre-tokenizing text[pos:pos + chunk] gives the whole text's pieces up to its last
        one: each piece is decided by the characters up to its end and one after, which the
        window holds for every piece but the last (cut short by the window, perhaps). So the
        last piece's start is a boundary of both. A window of one piece (a run of one kind
        of character, longer than the window) gives none: then the rest is tokenized at
        once, which min_tokens() has already bounded to about room x 81 bytes."""
        if pos + chunk >= len(text):
            return len(text)
        pieces = self._hf.pre_tokenizer.pre_tokenize_str(text[pos:pos + chunk])
        return pos + pieces[-1][1][0] if len(pieces) >= 2 else len(text)

    @staticmethod
    def interior(text: str, window: int = 4096) -> str:
        """The part of `text` between its first and its last word start (looked for within
        `window` characters of each end; "" if there is none): tokenized alone it gives
        exactly the tokens it gets inside any surrounding text."""
        first = _WORD_START.search(text, 0, window)
        if first is None:
            return ""
        last = None
        for last in _WORD_START.finditer(text, max(first.end(), len(text) - window)):  # noqa: B007 (the last)
            pass
        return text[first.start():last.start()] if last is not None else ""

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (special tokens: their text). May be part of a character."""
        return self._bytes[token_id]

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        data = b"".join(
            self._bytes[i] for i in ids if not (skip_special and i in self._special_ids)
        )
        return data.decode("utf-8", errors="replace")

    def detokenizer(self, skip_special: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special=skip_special)

    # ---- chat ---------------------------------------------------------------------------

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        if self._template is None:
            raise ValueError("GGUF has no tokenizer.chat_template")
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._tokens[self._bos_id],
            eos_token=self._tokens[self._eos_id],
        )

    def render_chat(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> str:
        """The chat as text, exactly as the GGUF template renders it."""
        return self._render(list(messages), add_generation_prompt)

    def encode_chat(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[int]:
        """Ids of the rendered chat: template markup -> control tokens, content -> plain text.

        The content is swapped for unguessable placeholders, so we know which spans of the
        rendered text came from the template. Only those spans are searched for control tokens;
        the text between two control tokens (template glue + content together) is then tokenized
        as one run, which is what llama.cpp does with special parsing on, so ordinary chats get
        the same ids while a "<|im_end|>" typed by a user stays plain text.
        """
        nonce = secrets.token_hex(8)
        contents: list[str] = []
        masked = []
        for i, msg in enumerate(messages):
            content = msg.get("content", "")
            if not isinstance(content, str):
                raise ValueError("message content must be a string")
            role = msg.get("role", "")
            if self._special_re is not None and self._special_re.search(str(role)):
                # Roles are template markup; a control token inside one would forge a turn.
                raise ValueError("message role contains a special token")
            contents.append(content)
            masked.append({**msg, "content": f"\ue000{nonce}:{i}\ue001"})
        rendered = self._render(masked, add_generation_prompt)

        ids: list[int] = []
        run: list[str] = []  # text waiting to be tokenized as one piece
        # One pattern for every placeholder (the message index captured), not an alternation
        # of them all: linear in the rendered text, whatever the number of messages.
        split_re = re.compile("\ue000" + nonce + ":([0-9]+)\ue001")
        pieces = split_re.split(rendered)
        for k, piece in enumerate(pieces):
            if k % 2 == 1:  # a placeholder's index: user content, never special
                run.append(contents[int(piece)])
                continue
            pos = 0
            for m in self._special_re.finditer(piece) if self._special_re else ():
                run.append(piece[pos : m.start()])
                ids += self._encode_plain("".join(run))
                run = []
                ids.append(self._special_by_text[m.group()])
                pos = m.end()
            run.append(piece[pos:])
        ids += self._encode_plain("".join(run))
        return ids


# Where the GPT-2 pre-tokenizer pattern (` ?\p{L}+`) must start a new piece: a space after a
# non-space, before a letter.
def _byte_share(sets: npt.NDArray[np.bool_], lens: npt.NDArray[np.int64],
                columns: Iterable[int], digit_share: float) -> npt.NDArray[np.float64]:
    """Per byte value, 1 / the longest of these tokens holding it (1 where none does), and
    digit_share for ASCII digits (the pre-tokenizer's own bound: 1 where it isolates each
    digit, 1/3 where numbers are pieces of up to three digits)."""
    longest = np.ones(256)
    for c in columns:
        having = lens[sets[:, c]]
        if having.size:
            longest[c] = having.max()
    return _share(longest, digit_share)


def _share(longest: npt.NDArray[np.float64], digit_share: float) -> npt.NDArray[np.float64]:
    """1 / the longest token holding each byte value, digits capped by the pre-tokenizer."""
    share = 1.0 / longest
    share[ord("0"):ord("9") + 1] = digit_share
    return share


def _byte_counts(text: str) -> npt.NDArray[np.intp]:
    return np.bincount(np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8),
                       minlength=256)


def _bound(counts: npt.NDArray[np.intp], share: npt.NDArray[np.float64]) -> int:
    """ceil(sum(count x share)), rounded down by a hair against float error."""
    return max(0, math.ceil(float(counts @ share) - 1e-6))


_WORD_START = re.compile(r"(?<=\S) (?=[^\W\d_])")


def _strftime_now(fmt: str) -> str:
    import datetime
    return datetime.datetime.now().strftime(fmt)


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)
