"""zerolayer-http end to end: a real zerolayerd (the bundled model) and the edge as its own
process on a loopback port, driven with the official `openai` and `anthropic` packages.

One daemon and one edge for the module (start-ups are the expensive part on 2 cores). The
daemon runs with the test hooks (daemon/test_hooks.py) and an admission queue of 1, so the
OVERLOADED and drain tests put it in a known state instead of betting on the machine's
speed; the edge runs with --max-attempts 1 so that a refusal reaches the HTTP client at
once. The last test drains the daemon (SIGTERM): keep it last.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from daemon_proc import DaemonProc, Hooks, free_port
from edge_proc import MODEL, TOKEN, TOKEN_UNKNOWN_KEY, EdgeProc
from zerolayer.client import ChatMessage, Client
from zerolayer.daemon.programs.http_edge import errors as edge_errors
from zerolayer.daemon.programs.http_edge.config import load as load_config
from zerolayer.daemon.programs.http_edge.tokens import TokenFileError, digest, parse_tokens
from zerolayer.protocol.errors import (
    ErrorCode,
    MalformedError,
    StreamRestartedError,
    ZerolayerError,
    ZerolayerTimeoutError,
    error_for,
)

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is the capital of France?"
COUNT = "Count from one to one thousand: one, two, three,"



@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zl-http")
    hooks = Hooks(tmp / "hooks")
    d = DaemonProc(tmp, "--engine-queue-depth", "1", "--cache-lease-s", "30",
                   "--lifecycle-drain-timeout-s", "1",
                   env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    edge = None
    try:
        edge = EdgeProc(tmp, d)
        yield d, edge, hooks
    finally:
        hooks.release()
        if edge is not None:
            # SIGTERM: a clean shutdown; uvicorn re-raises the signal once it is done, which
            # systemd counts as success too
            assert edge.stop() in (0, -signal.SIGTERM), edge.log.read_text()
            assert "Application shutdown complete" in edge.log.read_text()
        d.stop()


def oai(edge: EdgeProc, key: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=edge.base + "/v1", api_key=key, max_retries=0, timeout=120)


def anth(edge: EdgeProc, key: str = TOKEN) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=edge.base, api_key=key, max_retries=0, timeout=120)


def direct(d: DaemonProc) -> Client:
    return Client(d.addr, d.key_id, d.secret, timeout=60)


def wait_idle(d: DaemonProc) -> None:
    d.wait_for(lambda: d.metric("zerolayer_requests_running") == 0
               and d.metric("zerolayer_requests_waiting") == 0, timeout=120, what="idle")


# ---------------------------------------------------------------- no daemon needed


def test_every_error_code_has_an_http_mapping():
    expected = {ErrorCode.OVERLOADED: 429, ErrorCode.DRAINING: 503,
                ErrorCode.CONTEXT_OVERFLOW: 400, ErrorCode.PAYLOAD_TOO_LARGE: 413,
                ErrorCode.MALFORMED: 400, ErrorCode.INTERNAL: 500, ErrorCode.CANCELLED: 503,
                ErrorCode.INVALID_SIGNATURE: 502, ErrorCode.UNKNOWN_KEY: 502,
                ErrorCode.INVALID_TIMESTAMP: 502, ErrorCode.EXPIRED_NONCE: 502}
    assert set(edge_errors.DAEMON_ERRORS) == set(ErrorCode) == set(expected)
    for code in ErrorCode:
        e = edge_errors.ApiError.from_daemon(error_for(code, "daemon says why"))
        assert e.status == expected[code], code
        ob = e.openai_body()["error"]
        assert set(ob) == {"message", "type", "param", "code"} and ob["message"]
        ab = e.anthropic_body()
        assert ab["type"] == "error" and set(ab["error"]) == {"type", "message"}
        retry = e.headers().get("Retry-After")
        assert (retry is not None) == (e.status in (429, 503)), code
        if e.status == 502:         # misconfiguration: the operator's fix, not the daemon's words
            assert "misconfigured" in e.message and "daemon says why" not in e.message
        else:
            assert code.name in e.message and "daemon says why" in e.message
    t = edge_errors.ApiError.from_daemon(ZerolayerTimeoutError("gave up"))
    assert t.status == 504 and t.anthropic_body()["error"]["type"] == "timeout_error"
    assert edge_errors.ApiError.from_daemon(StreamRestartedError("x")).status == 502
    assert edge_errors.ApiError.from_daemon(ZerolayerError("?")).status == 500


def test_tokens_file_lookup_and_syntax():
    t = parse_tokens(f"# c\n7 {TOKEN}\n8 sha256:{digest('zl-another-token-xyz-123').hex()}\n")
    assert t.lookup(TOKEN) == 7 and t.lookup("zl-another-token-xyz-123") == 8
    assert t.lookup(TOKEN + "x") is None and t.lookup("") is None and t.lookup(None) is None
    assert t.key_ids() == {7, 8}
    for bad in ("7\n", "x tok-0123456789abcdef\n", "7 short\n", "7 sha256:abcd\n",
                f"7 {TOKEN}\n8 {TOKEN}\n", "0 tok-0123456789abcdef\n", "# only a comment\n"):
        with pytest.raises(TokenFileError):
            parse_tokens(bad)


def test_config_toml_under_flags(tmp_path):
    p = tmp_path / "edge.toml"
    p.write_text('daemon = "10.0.0.1:7433"\nmodel_name = "m"\nmax_attempts = 2\n')
    cfg = load_config(["--config", str(p), "--model-name", "flag-wins"])
    assert (cfg.daemon, cfg.model_name, cfg.max_attempts) == ("10.0.0.1:7433", "flag-wins", 2)
    assert cfg.listen_host == "127.0.0.1" and cfg.listen_port == 8080
    p.write_text('bogus = 1\n')
    with pytest.raises(SystemExit):
        load_config(["--config", str(p)])


def test_refuses_a_tokens_file_others_can_read(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("7 " + "cd" * 32 + "\n")
    os.chmod(keys, 0o600)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"7 {TOKEN}\n")
    os.chmod(tokens, 0o644)
    cmd = [sys.executable, "-m", "zerolayer.daemon.programs.http_edge.app", "--keys", str(keys),
           "--tokens", str(tokens), "--listen", f"127.0.0.1:{free_port(socket.SOCK_STREAM)}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "chmod 600" in r.stderr
    os.chmod(tokens, 0o600)
    tokens.write_text(f"8 {TOKEN}\n")   # a key id the keys file lacks
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not in" in r.stderr
    # and it imports nothing heavy: no numba, no numpy (it must start fast)
    out = subprocess.run([sys.executable, "-c", "import sys, zerolayer.daemon.programs.http_edge.app; "
                          "print(sorted({'numba', 'numpy', 'tokenizers'} & set(sys.modules)))"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_an_error_after_the_stream_started_is_an_error_event():
    """Once the status line is out, a daemon error goes into the stream: Anthropic's
    `event: error` (OpenAI's `data: {"error": ...}` is tested end to end, by the drain)."""
    import asyncio
    from types import SimpleNamespace

    from zerolayer.daemon.programs.http_edge import anthropic_api, serve
    from zerolayer.daemon.programs.http_edge.generation import Generation
    from zerolayer.daemon.programs.http_edge.metrics import EdgeMetrics
    from zerolayer.protocol.errors import RequestCancelledError

    class CutStream:           # the daemon cuts the request after the first chunk
        request_id = bytes(16)
        result = None
        logprobs: list = []    # (none asked)

        def __aiter__(self):
            return self

        async def __anext__(self):
            raise RequestCancelledError("drain timeout")

    st = SimpleNamespace(cfg=SimpleNamespace(model_name=MODEL), metrics=EdgeMetrics())
    gen = Generation(CutStream(), "messages", st.metrics, 0.0)
    gen.first = "Hello"

    async def collect():
        shape = anthropic_api.MESSAGES.chunks(None, gen.stream.request_id, MODEL, 0)
        return [e async for e in serve.events(gen, shape, st)]

    events = asyncio.run(collect())
    assert [e.split(b"\n")[0] for e in events] == [
        b"event: message_start", b"event: content_block_start", b"event: ping",
        b"event: content_block_delta", b"event: error"]
    assert json.loads(events[-1].split(b"data: ", 1)[1]) == {"type": "error", "error": {
        "type": "overloaded_error", "message": "CANCELLED: drain timeout"}}


# ---------------------------------------------------------------- OpenAI


def test_models_and_health(stack):
    d, edge, _ = stack
    assert [m.id for m in oai(edge).models.list()] == [MODEL]
    assert oai(edge).models.retrieve(MODEL).id == MODEL
    assert [m.id for m in anth(edge).models.list()] == [MODEL]
    h = json.loads(urllib.request.urlopen(edge.base + "/healthz", timeout=10).read())
    assert h["status"] == "ok" and h["daemon_rtt_ms"] > 0


def test_chat_non_streaming_matches_the_sdk(stack):
    d, edge, _ = stack
    r = oai(edge).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=24,
        temperature=0)
    ref = direct(d).invoke(messages=[ChatMessage("user", QUESTION)], max_tokens=24)
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content == ref.text and ref.text
    assert c.finish_reason == ref.finish_reason
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    assert r.usage.prompt_tokens == ref.usage.prompt_tokens
    assert r.usage.completion_tokens == ref.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_with_usage(stack):
    d, edge, _ = stack
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": QUESTION}]
    stream = oai(edge).chat.completions.create(model=MODEL, messages=msgs, max_tokens=24,
                                               temperature=0, stream=True,
                                               stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0] in ("stop", "length")
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens > 0
    assert all(c.object == "chat.completion.chunk" and c.id == last.id for c in chunks)
    full = oai(edge).chat.completions.create(model=MODEL, messages=msgs, max_tokens=24,
                                             temperature=0)
    assert text == full.choices[0].message.content
    assert last.usage.completion_tokens == full.usage.completion_tokens


def test_completions_plain_and_streamed(stack):
    d, edge, _ = stack
    c = oai(edge)
    r = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                             temperature=0)
    ref = direct(d).invoke(prompt="The capital of France is", max_tokens=8)
    assert r.object == "text_completion" and r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    parts = [ch.choices[0].text for ch in c.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0,
        stream=True) if ch.choices]
    assert "".join(parts) == ref.text


def test_stop_string_and_length(stack):
    d, edge, _ = stack
    c = oai(edge)
    prompt = "one, two, three, four, five, six, seven,"
    full = c.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    text = full.choices[0].text
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 12
    assert " nine" in text, text            # the greedy continuation counts on
    cut = c.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                               stop=[" nine"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[:text.index(" nine")]
    one = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": COUNT}],
                                    max_tokens=3, temperature=0, stop="zzz-never")
    assert one.choices[0].finish_reason == "length" and one.usage.completion_tokens == 3


def test_logprobs_through_the_sdk(stack):
    """The SDK against the daemon: one entry per completion token, best first, greedy's
    token the best, the entries' bytes spelling the text, each token's entry no later than
    the chunk that completes its text; none when not asked. (Their values against a float64
    softmax of the model's logits: test_logprobs.py.)"""
    d, _, _ = stack
    msgs = [ChatMessage("user", QUESTION)]
    with direct(d) as c:
        r = c.invoke(messages=msgs, max_tokens=10, logprobs=True, top_logprobs=4)
        assert r.logprobs is not None and len(r.logprobs) == r.usage.completion_tokens
        for t in r.logprobs:
            lps = [a.logprob for a in t.top_logprobs]
            assert len(lps) == 4 and lps == sorted(lps, reverse=True) and lps[0] <= 0.0
            assert t.top_logprobs[0].token_id == t.token_id and t.logprob == lps[0]
        assert b"".join(t.token_bytes for t in r.logprobs).decode() == r.text
        assert c.invoke(messages=msgs, max_tokens=4).logprobs is None
        with c.stream(messages=msgs, max_tokens=10, logprobs=True) as s:
            so_far = ""
            for chunk in s:
                so_far += chunk
                assert b"".join(t.token_bytes for t in s.logprobs).startswith(so_far.encode())
        assert s.result is not None and s.result.logprobs is not None
        assert [t.token_id for t in s.result.logprobs] == [t.token_id for t in r.logprobs]
        assert all(t.top_logprobs == () for t in s.result.logprobs)
        for got, ref in zip(s.result.logprobs, r.logprobs):
            assert got.logprob == pytest.approx(ref.logprob, abs=1e-4)
        with pytest.raises(MalformedError, match="top_logprobs must be in 0..20, got 21"):
            c.invoke(messages=msgs, max_tokens=4, logprobs=True, top_logprobs=21)


def test_openai_logprobs_chat_and_completions(stack):
    """With the real openai package: chat's logprobs.content[] (token, logprob, bytes,
    top_logprobs) and legacy completions' tokens / token_logprobs / top_logprobs /
    text_offset, plain and streamed, with the SDK's values."""
    d, edge, _ = stack
    c = oai(edge)
    msgs = [{"role": "user", "content": QUESTION}]
    ref = direct(d).invoke(messages=[ChatMessage("user", QUESTION)], max_tokens=10,
                           logprobs=True, top_logprobs=3)
    assert ref.logprobs is not None
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0,
                                  logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert r.choices[0].message.content == ref.text
    assert [x.token for x in content] == [t.token for t in ref.logprobs]
    for x, t in zip(content, ref.logprobs):
        assert x.logprob == pytest.approx(t.logprob, abs=1e-4)
        assert bytes(x.bytes) == t.token_bytes
        assert [a.token for a in x.top_logprobs] == [a.token for a in t.top_logprobs]
        assert [bytes(a.bytes) for a in x.top_logprobs] == [a.token_bytes for a in t.top_logprobs]
    streamed = [x for ch in c.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=10, temperature=0, logprobs=True,
        top_logprobs=3, stream=True) if ch.choices and ch.choices[0].logprobs
        for x in ch.choices[0].logprobs.content]
    assert [x.token for x in streamed] == [x.token for x in content]
    plain = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None

    prompt = "The capital of France is"
    r2 = c.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                              logprobs=2)
    lp = r2.choices[0].logprobs
    assert "".join(lp.tokens) == r2.choices[0].text and len(lp.tokens) == 6
    assert len(lp.token_logprobs) == 6 and all(v <= 0.0 for v in lp.token_logprobs)
    assert all(len(m) in (2, 3) and tok in m for m, tok in zip(lp.top_logprobs, lp.tokens))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    parts = [ch.choices[0].logprobs for ch in c.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=2, stream=True)
        if ch.choices and ch.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset
    with pytest.raises(openai.BadRequestError) as ei:
        c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, logprobs=21)
    assert ei.value.body["param"] == "logprobs"


def test_penalties_reach_the_daemon(stack):
    """OpenAI's presence/frequency penalties and the repetition penalty (vLLM's and
    llama.cpp's names) give the SDK's answer with the same penalties, and change it."""
    from test_penalties import LOOP
    d, edge, _ = stack
    c = oai(edge)
    story = "Once upon a time"  # no repeats in 12 tokens: presence alone changes this one
    for prompt, body, kw in [
            (LOOP, {"frequency_penalty": 1.0}, dict(frequency_penalty=1.0)),
            (story, {"presence_penalty": 2.0}, dict(presence_penalty=2.0)),
            (LOOP, {"extra_body": {"repetition_penalty": 1.5}}, dict(repetition_penalty=1.5)),
            (LOOP, {"extra_body": {"repeat_penalty": 1.5}}, dict(repetition_penalty=1.5))]:
        plain = direct(d).invoke(prompt=prompt, max_tokens=12)
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                 **body)
        ref = direct(d).invoke(prompt=prompt, max_tokens=12, **kw)
        assert r.choices[0].text == ref.text != plain.text, (body, ref.text, plain.text)


def test_unsupported_parameters_are_refused(stack):
    d, edge, _ = stack
    c = oai(edge)
    msgs = [{"role": "user", "content": "hi"}]
    for kwargs, param in [({"n": 2}, "n"), ({"logprobs": "yes"}, "logprobs"),
                          ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                          ({"top_logprobs": 2}, "top_logprobs"),
                          ({"tools": [{"type": "function", "function": {
                              "name": "f", "parameters": {"type": "string"}}}]}, "tools"),
                          ({"tool_choice": "auto"}, "tool_choice"),
                          ({"presence_penalty": 2.5}, "presence_penalty"),
                          ({"logit_bias": {"5": 10}}, "logit_bias"),
                          ({"extra_body": {"repetition_penalty": 1.2, "repeat_penalty": 1.1}},
                           "repetition_penalty"),
                          ({"temperature": 3}, "temperature"),
                          ({"extra_body": {"frobnicate": 1}}, "frobnicate")]:
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, **kwargs)
        assert ei.value.status_code == 400
        err = ei.value.body
        assert err["param"] == param and err["type"] == "invalid_request_error", err
    with pytest.raises(openai.NotFoundError) as ei:
        c.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=4)
    assert ei.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL, prompt="hi", n=2)


def test_bad_or_missing_token_is_401(stack):
    d, edge, _ = stack
    with pytest.raises(openai.AuthenticationError) as ei:
        oai(edge, key="zl-wrong-token-0123456789").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert ei.value.status_code == 401 and ei.value.body["code"] == "invalid_api_key"
    r = httpx.post(edge.base + "/v1/chat/completions", json={"model": MODEL}, timeout=10)
    assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(anthropic.AuthenticationError) as ai:
        anth(edge, key="zl-wrong-token-0123456789").messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert ai.value.body["error"]["type"] == "authentication_error"
    assert edge.metric("zerolayer_http_requests_total",
                       'api="chat_completions",status="401"') >= 2


def test_a_key_the_daemon_does_not_know_is_a_502_not_a_401(stack):
    d, edge, _ = stack
    with pytest.raises(openai.APIStatusError) as ei:
        oai(edge, key=TOKEN_UNKNOWN_KEY).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert ei.value.status_code == 502 and "misconfigured" in ei.value.message


def test_context_overflow_is_400(stack):
    d, edge, _ = stack
    with pytest.raises(openai.BadRequestError) as ei:
        oai(edge).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5000)
    assert ei.value.body["code"] == "context_length_exceeded"
    assert "CONTEXT_OVERFLOW" in ei.value.message


def test_disconnect_mid_stream_cancels_the_daemon_request(stack):
    d, edge, _ = stack
    cancels0 = edge.metric("zerolayer_http_cancels_total")
    daemon0 = d.metric("zerolayer_requests_total", 'outcome="cancelled"')
    stream = oai(edge).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": COUNT}], max_tokens=400,
        temperature=0, stream=True)
    got = 0
    for ch in stream:
        got += bool(ch.choices and ch.choices[0].delta.content)
        if got >= 2:
            break
    assert edge.metric("zerolayer_http_active_streams") == 1
    stream.close()                       # the HTTP connection goes away mid-stream
    d.wait_for(lambda: edge.metric("zerolayer_http_cancels_total") >= cancels0 + 1,
               what="the edge cancels")
    d.wait_for(lambda: d.metric("zerolayer_requests_total", 'outcome="cancelled"')
               >= daemon0 + 1, what="the daemon saw CANCEL")
    assert edge.metric("zerolayer_http_active_streams") == 0
    wait_idle(d)


def test_disconnect_before_the_first_token_cancels_too(stack):
    """The engine is held, so the edge is still waiting for the first token (no response
    sent) when the HTTP client leaves: the edge notices and cancels anyway."""
    d, edge, hooks = stack
    first = direct(d).stream(COUNT, max_tokens=300)
    next(iter(first))
    hooks.hold(d)
    try:
        cancels0 = edge.metric("zerolayer_http_cancels_total")
        # admitted = handed to the engine by the I/O thread; the waiting gauge is the engine
        # thread's, which the hold may keep from taking the request at all
        routed = 'engine="0",reason="load"'
        routed0 = d.metric("zerolayer_engine_routed_total", routed)
        body = json.dumps({"model": MODEL, "max_tokens": 50, "stream": True,
                           "messages": [{"role": "user", "content": "Say hello."}]}).encode()
        sock = socket.create_connection(("127.0.0.1", edge.port), timeout=30)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\n"
                     b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        d.wait_for(lambda: d.metric("zerolayer_engine_routed_total", routed) >= routed0 + 1,
                   what="the edge's request admitted")
        sock.close()                    # gone before the edge could answer anything
        d.wait_for(lambda: edge.metric("zerolayer_http_cancels_total") >= cancels0 + 1,
                   what="the edge cancels before any response")
        first.cancel()
    finally:
        hooks.release()
    wait_idle(d)


def test_overloaded_is_429_with_retry_after(stack):
    """Admission queue of 1 and the engine held: one request running, one queued, the
    edge's is refused OVERLOADED by the daemon -> 429 + Retry-After."""
    d, edge, hooks = stack
    a = direct(d).stream(COUNT, max_tokens=200)
    next(iter(a))
    hooks.hold(d)
    try:
        b = direct(d).stream("Say hello.", max_tokens=4)
        tb = threading.Thread(target=lambda: list(b))
        tb.start()
        d.wait_for(lambda: d.metric("zerolayer_requests_waiting") >= 1, what="B queued")
        with pytest.raises(openai.RateLimitError) as ei:
            oai(edge).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert ei.value.status_code == 429
        assert ei.value.response.headers["retry-after"] == "1"
        assert "OVERLOADED" in ei.value.message
        with pytest.raises(anthropic.RateLimitError) as ai:
            anth(edge).messages.create(model=MODEL, max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}])
        assert ai.value.response.headers["retry-after"] == "1"
        a.cancel()
    finally:
        hooks.release()
    tb.join(120)
    assert not tb.is_alive() and b.result is not None
    assert edge.metric("zerolayer_http_daemon_errors_total", 'code="OVERLOADED"') >= 2
    wait_idle(d)


# ---------------------------------------------------------------- Anthropic


def test_anthropic_messages_plain_and_streamed(stack):
    d, edge, _ = stack
    c = anth(edge)
    # temperature: not a keyword of this anthropic SDK any more; older clients send it
    greedy = {"extra_body": {"temperature": 0}}
    r = c.messages.create(model=MODEL, max_tokens=24, system="You are terse.",
                          messages=[{"role": "user", "content": QUESTION}], **greedy)
    ref = direct(d).invoke(messages=[ChatMessage("system", "You are terse."),
                                     ChatMessage("user", QUESTION)], max_tokens=24)
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL
    assert r.content[0].type == "text" and r.content[0].text == ref.text
    assert r.stop_reason == ("max_tokens" if ref.finish_reason == "length" else "end_turn")
    assert r.usage.output_tokens == ref.usage.completion_tokens
    assert (r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
            == ref.usage.prompt_tokens)
    with c.messages.stream(model=MODEL, max_tokens=24, system="You are terse.",
                           messages=[{"role": "user", "content": QUESTION}], **greedy) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == ref.text and final.content[0].text == ref.text
    assert final.stop_reason == r.stop_reason and final.usage.output_tokens == r.usage.output_tokens
    # the raw event sequence, in Anthropic's order
    with httpx.stream("POST", edge.base + "/v1/messages", timeout=60,
                      headers={"x-api-key": TOKEN, "anthropic-version": "2023-06-01"},
                      json={"model": MODEL, "max_tokens": 3, "stream": True,
                            "messages": [{"role": "user", "content": COUNT}]}) as resp:
        events = [line[7:] for line in resp.iter_lines() if line.startswith("event: ")]
    assert events[:3] == ["message_start", "content_block_start", "ping"]
    assert set(events[3:-3]) == {"content_block_delta"}
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_anthropic_stop_sequence_names_the_matched_string(stack):
    """A matched stop string ends the message with stop_reason "stop_sequence" and the string
    itself (DONE's stop_index), plain and streamed; the end of the turn stays "end_turn"."""
    d, edge, _ = stack
    c = anth(edge)
    msgs = [{"role": "user", "content": COUNT}]
    full = c.messages.create(model=MODEL, max_tokens=16, messages=msgs, extra_body={"temperature": 0})
    text = full.content[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = " " + words[2]                   # greedy: the same text comes again, and stops there
    cut = c.messages.create(model=MODEL, max_tokens=16, messages=msgs, stop_sequences=["zzz", stop],
                            extra_body={"temperature": 0})
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, cut
    assert cut.content[0].text == text[:text.index(stop)]
    with c.messages.stream(model=MODEL, max_tokens=16, messages=msgs, stop_sequences=[stop],
                           extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    sdk = direct(d).invoke(messages=[ChatMessage("user", COUNT)], max_tokens=16, stop=["zzz", stop])
    assert sdk.finish_reason == "stop" and sdk.stop_sequence == stop
    assert full.stop_reason in ("end_turn", "max_tokens") and full.stop_sequence is None


def test_anthropic_errors(stack):
    d, edge, _ = stack
    c = anth(edge)
    with pytest.raises(anthropic.BadRequestError) as ei:   # max_tokens is required
        c.post("/v1/messages", cast_to=object,
               body={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert ei.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "'max_tokens' is required"}}
    with pytest.raises(anthropic.BadRequestError) as ei:      # a name no tool has
        c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                          tools=[{"name": "f", "input_schema": {"type": "object"}}],
                          tool_choice={"type": "tool", "name": "g"})
    assert "'g'" in ei.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        c.messages.create(model="claude-x", max_tokens=4,
                          messages=[{"role": "user", "content": "hi"}])
    r = c.messages.create(model=MODEL, max_tokens=3, extra_body={"temperature": 0},
                          messages=[{"role": "user", "content": COUNT}])
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3


def test_metrics_are_documented_and_counted(stack):
    d, edge, _ = stack
    from zerolayer.daemon.programs.http_edge.metrics import EdgeMetrics
    documented = {fam.name + "_total" if fam.type == "counter" else fam.name
                  for fam in EdgeMetrics().registry.collect()}
    ops = (ROOT / "docs" / "OPERATIONS.md").read_text()
    missing = sorted(n for n in documented if f"`{n}`" not in ops)
    assert not missing, f"edge metrics not documented in docs/OPERATIONS.md: {missing}"
    assert edge.metric("zerolayer_http_requests_total", 'api="chat_completions",status="200"') > 0
    assert edge.metric("zerolayer_http_time_to_first_token_seconds_count",
                       'api="messages"') > 0
    assert edge.metric("zerolayer_http_completion_tokens_total", 'api="completions"') > 0


# ---------------------------------------------------------------- last: drains the daemon


def test_drain_is_503_and_a_cut_stream_ends_with_an_sse_error(stack):
    """SIGTERM with a stream in flight and the engine held: new requests get DRAINING
    (503 + Retry-After); the drain timeout (1 s) then ends the stream with CANCELLED,
    which arrives as OpenAI's in-stream error event."""
    d, edge, hooks = stack
    stream = oai(edge).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": COUNT}], max_tokens=400,
        temperature=0, stream=True)
    it = iter(stream)
    while not next(it).choices[0].delta.content:
        pass
    hooks.hold(d)
    d.signal()
    d.wait_for(lambda: any("draining" in line for line in d.log), what="draining")
    with pytest.raises(openai.InternalServerError) as ei:
        oai(edge).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert ei.value.status_code == 503 and ei.value.response.headers["retry-after"] == "2"
    with pytest.raises(openai.APIError, match="CANCELLED"):
        for _ in it:
            pass
    hooks.release()
    assert d.wait(60) == 0
    assert edge.metric("zerolayer_http_stream_errors_total", 'api="chat_completions"') == 1
