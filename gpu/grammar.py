"""Constrained decoding: a request's constraint (protocol/constraint.py) compiled into a
grammar, and per sequence a matcher that says which tokens may come next.

The library is llguidance (llama.cpp's): one wheel with no dependencies, where xgrammar
pulls torch, CUDA and transformers into the daemon; measured at this vocabulary it compiles
a schema in ~0.5 ms and computes a mask in tens of µs, far below a decode step
(docs/BENCHMARKS.md). Its tokenizer view is built here from the GGUF's own token bytes, so
the mask is over exactly the ids the model samples; control tokens are marked (0xFF first,
llguidance's convention) so that no grammar ever admits them as text, and EOS is allowed
exactly where the grammar may end.

`Grammars` is the engine thread's: the tokenizer view is built on first use (~0.1 s), and a
compiled grammar is kept per distinct constraint (by its SHA-256), a bounded LRU, so a
schema that every request of an application sends is compiled once. A matcher is the cached
grammar's copy. Everything that can be wrong with a constraint (text nested too deep or
not JSON, a number the grammar cannot hold, a schema llguidance refuses or fails on, one
no finite value satisfies) is a SchemaError (a ValueError: the daemon's MALFORMED) with a
one-line reason, raised before the request is accepted: schema_text.py, schema_numbers.py
and schema_finite.py judge what the compiler would get wrong, and the compiler runs under
stated limits (GRAMMAR_LIMITS).

The mask is one bit per token id in little-endian 32-bit words (bit b of word w is token
32w + b), llguidance's layout, which the CPU and the device samplers both read.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from zerolayer.protocol.constraint import Constraint, ConstraintKind

from .schema_errors import SchemaError
from .schema_finite import check_finite, check_no_loop
from .schema_numbers import check_numbers
from .schema_spelling import check_spelling
from .schema_text import load_schema
from .tokenizer import Tokenizer

if TYPE_CHECKING:  # imported when first needed: the daemon's dependency, never the SDK's
    from llguidance import LLMatcher, LLParserLimits, LLTokenizer
    from llguidance._lib import JsonCompileOptions

CACHE_ENTRIES = 64   # compiled grammars kept; each is small (the schema's rules), not a table
# One layout, json.dumps's (", " and ": ", no other whitespace): with llguidance's default,
# free whitespace between tokens, a sampled small model can spend its max_tokens on newlines
# and never close the object. A schema's own "x-guidance" options still override these.
JSON_LAYOUT: JsonCompileOptions = {"item_separator": ", ", "key_separator": ": ",
                                   "whitespace_flexible": False}
# The grammar engine's limits, stated rather than inherited from a release of the library.
# Items bound the work of one mask (~20k items a ms, so a few ms a token at most); lexer
# fuel the regex work at compile (~50k a ms) and per mask (~14k a ms); lexer states the
# memory a grammar's lexer may grow to (1-2 kB each, so 40 MB at most); grammar size the
# symbols a 16 KiB schema may expand into. A schema that needs more is refused
# (MALFORMED), at compile or on its first mask; the engine's own messages, which can
# carry its parser state, go to the log only (verbose_errors off keeps them short too).
GRAMMAR_LIMITS = {"max_items_in_row": 2000, "initial_lexer_fuel": 1_000_000,
                  "step_lexer_fuel": 200_000, "step_max_items": 50_000,
                  "max_lexer_states": 20_000, "max_grammar_size": 500_000}


def mask_words(vocab: int) -> int:
    """uint32 words per row of a token mask."""
    return (vocab + 31) // 32


class _Vocab:
    """What llguidance.TokenizerWrapper reads: every id's bytes (padded to the model's
    vocabulary with empty, never-allowed tokens), the EOS id and the special ids."""

    def __init__(self, tok: Tokenizer, vocab: int):
        specials = tok.special_ids
        self.tokens = [b"\xff" + tok.token_bytes(i) if i in specials else tok.token_bytes(i)
                       for i in range(tok.vocab_size)] + [b""] * (vocab - tok.vocab_size)
        self.eos_token_id = tok.eos_id
        self.bos_token_id = tok.bos_id
        self.special_token_ids = sorted(specials)
        self._tok = tok

    def __call__(self, s: bytes) -> list[int]:
        return self._tok.encode(s.decode("utf-8", "replace"))


class Matcher:
    """One sequence's place in its grammar."""

    def __init__(self, m: LLMatcher):
        self._m = m
        self._row: npt.NDArray[np.uint32] | None = None
        # The grammar engine failed on this schema: a limit reached computing a mask, or a
        # token its own mask allowed then refused. Not the sampler's doing (it draws only
        # allowed tokens), so the daemon's answer is MALFORMED, not INTERNAL.
        self.gave_up = False

    def fill(self, row: npt.NDArray[np.uint32]) -> None:
        """Write the allowed next tokens into `row` (mask_words(vocab) words, contiguous)."""
        self._m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        self._row = row
        self.gave_up = self.gave_up or bool(self._m.is_error())

    def advance(self, token: int) -> bool:
        """The sampled token; False if the grammar refused it (a matcher in error)."""
        if self._m.consume_token(token):
            return True
        row = self._row
        if row is not None and token < 32 * len(row) and (int(row[token >> 5]) >> (token & 31)) & 1:
            self.gave_up = True
        return False

    @property
    def stopped(self) -> bool:
        """The grammar is complete and allows nothing more but EOS: generation ends."""
        return bool(self._m.is_stopped())

    @property
    def error(self) -> str:
        return str(self._m.get_error())


class Grammars:
    def __init__(self, tok: Tokenizer, vocab: int, entries: int = CACHE_ENTRIES):
        self.tok, self.vocab, self.entries = tok, vocab, entries
        self._lt: LLTokenizer | None = None
        self._cache: OrderedDict[bytes, LLMatcher] = OrderedDict()
        self._missing: frozenset[int] | None = None
        self.compiled = 0   # grammars compiled (not found in the cache), for tests and metrics

    def _tokenizer(self) -> LLTokenizer:
        if self._lt is None:
            import llguidance  # the daemon's dependency only: the SDK never imports this
            self._lt = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab(self.tok,
                                                                                 self.vocab)),
                                              eos_token=sorted(self.tok.eos_ids))
        return self._lt

    def _unspellable(self) -> frozenset[int]:
        """The bytes no token of the vocabulary contains (schema_spelling.py)."""
        if self._missing is None:
            seen: set[int] = set()
            for i in range(self.tok.vocab_size):
                seen.update(self.tok.token_bytes(i))
            self._missing = frozenset(range(256)) - seen
        return self._missing

    def matcher(self, c: Constraint) -> Matcher:
        """A fresh matcher for the constraint; SchemaError if it cannot be used."""
        key = hashlib.sha256(bytes([int(c.kind)]) + c.text.encode("utf-8")).digest()
        m = self._cache.get(key)
        if m is None:
            m = self._compile(c)
            self._cache[key] = m
            if len(self._cache) > self.entries:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return Matcher(m.deep_copy())

    def _compile(self, c: Constraint) -> LLMatcher:
        """Everything that decides whether a constraint can be used, in the order that keeps
        each step safe for the next: the text's nesting, then JSON, then the numbers and
        the recursion the compiler would get wrong, then the compiler itself under stated
        limits, then its first mask and forced prefix. Any refusal is a SchemaError."""
        if c.kind is ConstraintKind.JSON_OBJECT:
            text = '{"type": "object"}'
        else:
            text = c.text
            schema = load_schema(text)
            if not isinstance(schema, dict):
                raise SchemaError("the JSON schema must be a JSON object")
            check_numbers(schema)
            check_no_loop(schema)
            check_finite(schema)
            check_spelling(schema, self._unspellable())
        try:
            return self._matcher_for(text)
        except SchemaError:
            raise
        except Exception as e:  # noqa: BLE001 - the engine failed on this schema: its refusal
            raise SchemaError("the grammar engine failed on the JSON schema",
                              f"{type(e).__name__}: {e}") from None

    def _matcher_for(self, text: str) -> LLMatcher:
        import llguidance
        try:
            g = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
        except ValueError as e:
            raise SchemaError(f"the JSON schema cannot be used: {_first_line(str(e))}",
                              str(e)) from None
        m = llguidance.LLMatcher(self._tokenizer(), g, log_level=0, limits=_limits())
        if m.is_error():
            raise SchemaError(f"the JSON schema cannot be used: {_first_line(m.get_error())}",
                              m.get_error())
        # A schema no string satisfies may compile, then allow no first token at all; one
        # whose every value is endless forces its bytes until the item limit stops it.
        row = np.zeros(mask_words(self.vocab), np.uint32)
        m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if not m.is_error() and row.any():
            m.compute_ff_bytes()
        if m.is_error() or not row.any():
            raise SchemaError("no JSON value satisfies the schema"
                              + (f" ({_first_line(m.get_error())})" if m.is_error() else ""),
                              m.get_error())
        self.compiled += 1
        return m


def _limits() -> LLParserLimits:
    import llguidance
    g = GRAMMAR_LIMITS
    return llguidance.LLParserLimits(
        max_items_in_row=g["max_items_in_row"], initial_lexer_fuel=g["initial_lexer_fuel"],
        step_lexer_fuel=g["step_lexer_fuel"], step_max_items=g["step_max_items"],
        max_lexer_states=g["max_lexer_states"], max_grammar_size=g["max_grammar_size"],
        verbose_errors=False)


def _first_line(msg: str, n: int = 200) -> str:
    """The head of the engine's message for the client: its first line, shortened (the
    rest can be the parser's state, which is the log's)."""
    line = msg.strip().split("\n", 1)[0].strip()
    return line if len(line) <= n else line[:n - 3] + "..."
