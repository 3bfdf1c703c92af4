"""What each of the daemon's buffers holds now and the most it can hold, in bytes.

Every structure that grows with traffic has a bound set by configuration, so hostile input
can make the daemon use memory only up to the sum of these bounds, never more
(docs/OPERATIONS.md "Memory bounds" gives the same list with the settings behind each).
Exported as `zerolayer_memory_bytes{buffer}` and `zerolayer_memory_limit_bytes{buffer}`.

Python objects have no fixed size, so the per-entry figures below are measured upper
estimates (tracemalloc on CPython 3.11, see the comments), not exact counts. Buffers that
hold bytes objects count them by their length plus the object overhead.
"""
from __future__ import annotations

from zerolayer.protocol.wire import MAX_CHAT_MESSAGES, MAX_MESSAGE_BYTES, InvokeBody

from .auth import ReplayGuard
from .config import DaemonConfig
from .engines import EngineSlot
from .event_size import EVENT_LIMIT_BYTES
from .reassembly import Reassembler
from .result_cache import ResultCache

# A remembered nonce: its 32-byte bytes object (65 B), the dict slot, its bucket's list slot
# and per-key counts. Measured ~160 B/entry with 200,000 entries.
NONCE_ENTRY_BYTES = 160
# A reassembly in progress besides its body bytes: the (key, request id, nonce) tuple, the
# bookkeeping object, two ordered-dict slots, the fragments' dict and bytes headers.
# Measured ~850 B for a two-fragment message.
REASSEMBLY_MESSAGE_BYTES = 1024
# A decoded chat message (object, role and content string headers, tuple slot).
CHAT_MESSAGE_BYTES = 256
# A Request, its Admitted, the InvokeRequest, signer and sampling parameters, without the body.
REQUEST_BYTES = 2048
# Per prompt or generated token held by a request in the engine: 4 B of prompt ids, or a
# list slot and an int object of the sampled tokens, plus the detokenizer's text.
TOKEN_BYTES = 48


def body_bytes(body: InvokeBody) -> int:
    """What a decoded INVOKE body holds: the payload as received and its decoded text (a
    str is at most about one byte per UTF-8 byte of the payload, plus its header), and one
    object per chat message."""
    return (2 * len(body.payload) + CHAT_MESSAGE_BYTES * len(body.messages or ())
            + REQUEST_BYTES)


MAX_BODY_BYTES = 2 * MAX_MESSAGE_BYTES + CHAT_MESSAGE_BYTES * MAX_CHAT_MESSAGES + REQUEST_BYTES


def buffers(c: DaemonConfig, replay: ReplayGuard, r: Reassembler, cache: ResultCache,
            slots: list[EngineSlot], admitted_bytes: int,
            umem_bytes: int = 0) -> dict[str, tuple[int, int]]:
    """buffer name → (bytes held now, bound in bytes); a function of what it is given alone.
    `slots`: one per engine ([[engines]]), summed; `admitted_bytes`: body bytes ever handed
    to the engines (InFlight); `umem_bytes`: the AF_XDP UMEM, 0 without it."""
    # an engine not loaded yet holds no arena, and one not started has taken nothing
    arenas = [s.model.arena for s in slots if s.model is not None]
    threads = [s.thread for s in slots if s.thread is not None]
    n = len(slots)
    per_request = TOKEN_BYTES * c.model.max_seq_len + REQUEST_BYTES
    out = {
        "nonce_cache": (NONCE_ENTRY_BYTES * len(replay),
                        NONCE_ENTRY_BYTES * replay.config.capacity),
        "reassembly": (r.reserved_bytes + REASSEMBLY_MESSAGE_BYTES * len(r),
                       r.budget_bytes + REASSEMBLY_MESSAGE_BYTES * r.max_messages),
        # Running streams may pass max_bytes by what they have emitted so far (a stream is
        # never cut); that part is bounded by the engine's requests below.
        "result_cache": (cache.nbytes, cache.max_bytes),
        "admissions": (max(0, admitted_bytes - sum(t.taken_bytes for t in threads)),
                       n * c.engine.queue_depth * MAX_BODY_BYTES),
        "engine_requests": (sum(t.held_tokens * TOKEN_BYTES + REQUEST_BYTES * t.held_requests
                                for t in threads),
                            n * (c.engine.max_waiting + c.engine.max_running) * per_request),
        # each event counted as it is, logprob entries included (event_size.py); the
        # bound assumes one token's worth with full top_logprobs per event
        "events": (sum(s.events.nbytes for s in slots),
                   sum(EVENT_LIMIT_BYTES * s.events.capacity for s in slots)),
        # Allocated at start, backed by the OS as blocks are first written.
        "kv_arena": (sum((a.n_blocks - a.free_blocks) * a.bytes_per_block for a in arenas),
                     sum(a.n_blocks * a.bytes_per_block for a in arenas)),
    }
    if umem_bytes:
        out["umem"] = (umem_bytes, umem_bytes)
    return out
