"""`zerolayer` CLI: keygen (line format, 0600 creation, refusals), address and credential
resolution, exit codes, and invoke/ping through the real SDK against the in-test UDP
responder of test_client.py. The real daemon with the real model is exercised by the
end-to-end tests, not here.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time

import pytest

from test_client import KEY_ID, SECRET, FakeDaemon, Script
from zerolayer.daemon.auth import load_keys, parse_keys
from zerolayer.daemon.programs import cli
from zerolayer.protocol.constraint import Constraint, ConstraintKind
from zerolayer.protocol.errors import ErrorCode

ENV = (cli.ENV_ADDR, cli.ENV_KEY_ID, cli.ENV_SECRET, cli.ENV_KEYS_FILE)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    # Never pick up a real /etc/zerolayer/keys on the test machine.
    monkeypatch.setattr(cli, "DEFAULT_KEYS_FILE", str(tmp_path / "no-such-keys"))


def write_keys(path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def closed_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def target_args(**kw: object) -> argparse.Namespace:
    d = dict(addr=None, key_id=None, secret=None, keys_file=None)
    d.update(kw)
    return argparse.Namespace(**d)


# --- keygen ------------------------------------------------------------------------------------

def test_keygen_prints_one_loadable_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keygen"]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(r"1 [0-9a-f]{64}\n", out)
    assert cli.main(["keygen", "--key-id", "42", "--bytes", "16"]) == 0
    out2 = capsys.readouterr().out
    keys = parse_keys(out2)
    assert list(keys) == [42] and len(keys[42]) == 16


def test_keygen_secrets_are_fresh(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["keygen"])
    cli.main(["keygen"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0] != lines[1]


@pytest.mark.parametrize("argv", [["keygen", "--bytes", "8"], ["keygen", "--bytes", "65"],
                                  ["keygen", "--key-id", "0"], ["keygen", "--key-id", "x"],
                                  ["keygen", "--key-id", str(1 << 32)]])
def test_keygen_rejects_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == cli.EXIT_USAGE
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.startswith("zerolayer: USAGE: ")


def test_keygen_append_creates_a_0600_file_the_daemon_loads(tmp_path, capsys) -> None:
    path = tmp_path / "keys"
    old = os.umask(0)             # even with a permissive umask, the file is born 0600
    try:
        assert cli.main(["keygen", "--append", str(path)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    printed = capsys.readouterr().out
    assert cli.main(["keygen", "--append", str(path)]) == 0        # next id: 2
    assert cli.main(["keygen", "--append", str(path), "--key-id", "10"]) == 0
    assert cli.main(["keygen", "--append", str(path)]) == 0        # next id: 11
    keys = load_keys(path)
    assert list(keys) == [1, 2, 10, 11]
    assert printed == f"1 {keys[1].hex()}\n"     # the printed line is the one appended


def test_keygen_append_refuses_a_file_others_can_read(tmp_path, capsys) -> None:
    path = tmp_path / "keys"
    write_keys(path, "1 " + "ab" * 32 + "\n", mode=0o640)
    before = path.read_bytes()
    assert cli.main(["keygen", "--append", str(path)]) == cli.EXIT_USAGE
    cap = capsys.readouterr()
    assert "KEYS_FILE" in cap.err and "0640" in cap.err and "chmod 600" in cap.err
    assert cap.out == ""                          # no secret printed for a refused key
    assert path.read_bytes() == before
    assert stat.S_IMODE(path.stat().st_mode) == 0o640   # and we did not "fix" it either


def test_keygen_append_refuses_duplicates_and_broken_files(tmp_path, capsys) -> None:
    path = tmp_path / "keys"
    write_keys(path, "# ops\n3 " + "cd" * 32 + "\n")
    before = path.read_bytes()
    assert cli.main(["keygen", "--append", str(path), "--key-id", "3"]) == cli.EXIT_USAGE
    assert "exists already" in capsys.readouterr().err
    assert path.read_bytes() == before
    bad = tmp_path / "bad"
    write_keys(bad, "1 not-hex\n")
    assert cli.main(["keygen", "--append", str(bad)]) == cli.EXIT_USAGE
    assert bad.read_text() == "1 not-hex\n"
    assert cli.main(["keygen", "--append", str(tmp_path)]) == cli.EXIT_USAGE   # a directory


def test_keygen_append_completes_a_last_line_without_newline(tmp_path) -> None:
    path = tmp_path / "keys"
    write_keys(path, "5 " + "ef" * 32)                 # no trailing newline
    assert cli.main(["keygen", "--append", str(path)]) == 0
    assert list(load_keys(path)) == [5, 6]


# --- address and credentials -----------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:7000", ("127.0.0.1", 7000)),
    ("localhost", ("localhost", cli.DEFAULT_PORT)),
    (":7001", ("127.0.0.1", 7001)),
    ("[::1]:7002", ("::1", 7002)),
    ("[::1]", ("::1", cli.DEFAULT_PORT)),
])
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert cli.parse_address(text) == expected


@pytest.mark.parametrize("text", ["h:0", "h:65536", "h:x", "::1", "[::1", "[::1]x", "[]:1"])
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(cli.UsageError):
        cli.parse_address(text)


def test_secret_and_key_id_from_flags_win_over_env() -> None:
    env = {cli.ENV_KEY_ID: "9", cli.ENV_SECRET: "11" * 32, cli.ENV_ADDR: "10.0.0.1:1"}
    t = cli.resolve_target(target_args(key_id="3", secret="22" * 32, addr=":7000"), env)
    assert (t.address, t.key_id, t.secret) == (("127.0.0.1", 7000), 3, b"\x22" * 32)
    t = cli.resolve_target(target_args(), env)
    assert (t.address, t.key_id, t.secret) == (("10.0.0.1", 1), 9, b"\x11" * 32)
    assert "secret" not in repr(t).replace("Target", "")    # never printed by accident


def test_keys_file_gives_first_key_or_the_chosen_one(tmp_path) -> None:
    path = write_keys(tmp_path / "keys", f"7 {'aa' * 32}\n3 {'bb' * 32}\n")
    t = cli.resolve_target(target_args(keys_file=path), {})
    assert (t.key_id, t.secret) == (7, b"\xaa" * 32)          # first line, not lowest id
    t = cli.resolve_target(target_args(), {cli.ENV_KEYS_FILE: path, cli.ENV_KEY_ID: "3"})
    assert (t.key_id, t.secret) == (3, b"\xbb" * 32)
    # A flag-level keys file beats an environment secret.
    t = cli.resolve_target(target_args(keys_file=path), {cli.ENV_SECRET: "cc" * 32})
    assert t.secret == b"\xaa" * 32


def test_default_keys_file_is_the_last_resort(tmp_path) -> None:
    path = write_keys(tmp_path / "keys", f"4 {'dd' * 32}\n")
    t = cli.resolve_target(target_args(), {}, default_keys_file=path)
    assert (t.key_id, t.address) == (4, (cli.DEFAULT_HOST, cli.DEFAULT_PORT))


@pytest.mark.parametrize("case", ["nothing", "secret_without_id", "bad_hex", "short_secret",
                                  "both_env", "loose_file", "missing_file", "unknown_id",
                                  "empty_file", "bad_key_id"])
def test_credential_errors_are_usage_errors(case: str, tmp_path) -> None:
    good = write_keys(tmp_path / "keys", f"1 {'aa' * 32}\n")
    loose = write_keys(tmp_path / "loose", f"1 {'aa' * 32}\n", mode=0o644)
    empty = write_keys(tmp_path / "empty", "# nothing yet\n")
    args, env = {
        "nothing": (target_args(), {}),
        "secret_without_id": (target_args(secret="aa" * 32), {}),
        "bad_hex": (target_args(secret="zz" * 32, key_id="1"), {}),
        "short_secret": (target_args(secret="aa" * 8, key_id="1"), {}),
        "both_env": (target_args(), {cli.ENV_SECRET: "aa" * 32, cli.ENV_KEYS_FILE: good}),
        "loose_file": (target_args(keys_file=loose), {}),
        "missing_file": (target_args(keys_file=str(tmp_path / "nope")), {}),
        "unknown_id": (target_args(keys_file=good, key_id="2"), {}),
        "empty_file": (target_args(keys_file=empty), {}),
        "bad_key_id": (target_args(keys_file=good, key_id="0"), {}),
    }[case]
    with pytest.raises(cli.UsageError):
        cli.resolve_target(args, env)


def test_secret_and_keys_file_flags_are_exclusive(tmp_path) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["ping", "--secret", "aa" * 32, "--keys-file", str(tmp_path / "k")])
    assert e.value.code == cli.EXIT_USAGE


def test_usage_error_exit_code_and_format(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["invoke", "hi"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.startswith("zerolayer: USAGE: no credentials")
    assert cli.main(["invoke", "hi", "--key-id", "1", "--secret", "aa" * 32,
                     "--request-id", "abc"]) == cli.EXIT_USAGE
    assert "--request-id" in capsys.readouterr().err


# --- invoke and ping ---------------------------------------------------------------------------

def fake_argv(d: FakeDaemon, *extra: str) -> list[str]:
    host, port = d.address
    return [*extra, "--addr", f"{host}:{port}", "--key-id", str(KEY_ID), "--secret", SECRET.hex()]


def test_invoke_streams_to_stdout_and_reports_with_v(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeDaemon(Script(chunks=["Par", "is", "."])) as d:
        assert cli.main(fake_argv(d, "invoke", "-v", "What is the capital of France?",
                                  "--max-tokens", "8")) == 0
    cap = capsys.readouterr()
    assert cap.out == "Paris.\n"
    assert re.search(r"ttft \d+\.\d ms, 3 tokens, [\d.]+ tok/s decode", cap.err)
    assert "prefill 0.9 ms" in cap.err       # the daemon's timings (TIMINGS in test_client)
    req = d.invokes[0]
    assert req.key_id == KEY_ID
    assert req.body.params.max_tokens == 8


def test_invoke_passes_request_id_raw_and_credentials_from_env(monkeypatch, capsys) -> None:
    rid = "0123456789abcdef0123456789abcdef"
    with FakeDaemon(Script(chunks=["x"])) as d:
        monkeypatch.setenv(cli.ENV_ADDR, "%s:%d" % d.address)
        monkeypatch.setenv(cli.ENV_KEY_ID, str(KEY_ID))
        monkeypatch.setenv(cli.ENV_SECRET, SECRET.hex())
        assert cli.main(["invoke", "--raw", "--request-id", rid, "The capital"]) == 0
    assert capsys.readouterr().out == "x\n"
    assert d.invokes[0].request_id.hex() == rid
    assert d.invokes[0].body.prompt == "The capital"


def test_invoke_logprobs_and_response_format_reach_the_request(tmp_path, capsys) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    inline = json.dumps({"type": "json_object"})
    with FakeDaemon(Script(chunks=["{}"])) as d:
        assert cli.main(fake_argv(d, "invoke", "hi", "--top-logprobs", "3",
                                  "--response-format", str(path))) == 0
        assert cli.main(fake_argv(d, "invoke", "hi", "--logprobs",
                                  "--response-format", inline)) == 0
        assert cli.main(fake_argv(d, "invoke", "hi")) == 0
    first, second, plain = (r.body.params for r in d.invokes)
    # a bare schema is wrapped as json_schema; --top-logprobs implies --logprobs
    assert (first.logprobs, first.top_logprobs) == (True, 3)
    assert first.constraint == Constraint(ConstraintKind.JSON_SCHEMA,
                                          json.dumps(schema, separators=(",", ":")))
    assert (second.logprobs, second.top_logprobs) == (True, 0)
    assert second.constraint == Constraint(ConstraintKind.JSON_OBJECT)
    assert (plain.logprobs, plain.constraint) == (False, None)


@pytest.mark.parametrize("flags,message", [
    (["--response-format", "{not json"], "is not JSON"),
    (["--response-format", "/no/such/schema.json"], "cannot read"),
    (["--response-format", "[1]"], "cannot read"),
    (["--response-format", '{"type": "json_schema"}'], "json_schema must be an object"),
    (["--top-logprobs", "21"], "--top-logprobs must be in 0..20"),
])
def test_invoke_bad_logprob_and_format_flags_are_usage_errors(flags, message, capsys) -> None:
    with FakeDaemon(Script()) as d:
        assert cli.main(fake_argv(d, "invoke", "hi", *flags)) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("zerolayer: USAGE: ") and message in err, err
    assert not d.invokes                   # refused before anything was sent


def test_invoke_error_code_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeDaemon(Script(error_code=ErrorCode.CONTEXT_OVERFLOW, error_times=5)) as d:
        assert cli.main(fake_argv(d, "invoke", "hi")) == cli.EXIT_PROTOCOL
    err = capsys.readouterr().err
    assert err.startswith("zerolayer: CONTEXT_OVERFLOW: ")


def test_wrong_secret_is_invalid_signature(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeDaemon(Script()) as d:
        argv = fake_argv(d, "ping")
        argv[-1] = "00" * 32
        assert cli.main(argv) == cli.EXIT_PROTOCOL
    assert capsys.readouterr().err.startswith("zerolayer: INVALID_SIGNATURE: ")


def test_ping_prints_rtt_and_state(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeDaemon(Script()) as d:
        assert cli.main(fake_argv(d, "ping", "--count", "2", "--interval", "0")) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3
    for i, line in enumerate(out[:2]):
        assert re.match(rf"pong from 127\.0\.0\.1:\d+: seq={i} rtt=\d+ µs state=ready "
                        r"clock_offset=[+-][\d.]+ ms$", line)
    assert re.match(r"--- .*: 2 sent, 2 received, 0% lost, rtt min/avg/max \d+/\d+/\d+ µs$",
                    out[2])


@pytest.mark.parametrize("sub", ["invoke", "ping"])
def test_closed_port_fails_fast_with_timeout(sub: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [sub, "--addr", f"127.0.0.1:{closed_port()}", "--key-id", "1",
            "--secret", "aa" * 32, "--timeout", "0.3"]
    if sub == "invoke":
        argv.insert(1, "hello")
    t0 = time.monotonic()
    assert cli.main(argv) == cli.EXIT_NO_ANSWER
    assert time.monotonic() - t0 < 3.0
    cap = capsys.readouterr()
    if sub == "invoke":
        assert cap.err.startswith("zerolayer: TIMEOUT: ") and cap.out == ""
    else:
        assert "no answer from" in cap.out and "0 received, 100% lost" in cap.out


def test_console_entry_point_exit_code(tmp_path) -> None:
    """The same through a real process: the exit status is what scripts see."""
    env = {k: v for k, v in os.environ.items() if k not in ENV}
    env[cli.ENV_KEYS_FILE] = write_keys(tmp_path / "keys", f"1 {'aa' * 32}\n")
    p = subprocess.run([sys.executable, "-m", "zerolayer.daemon.programs.cli", "ping", "--addr",
                        f"127.0.0.1:{closed_port()}", "--timeout", "0.2", "--count", "1"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == cli.EXIT_NO_ANSWER, p.stderr
