"""`zerolayer` command line: generate locally; invoke, ping and keygen against zerolayerd.

    zerolayer generate "text"            run the model in this process (no daemon)
    zerolayer invoke "text" [-v]         a signed invoke to zerolayerd, streamed to stdout;
                                         --logprobs / --top-logprobs N print each token's
                                         logprob to stderr, --response-format constrains
                                         the answer to JSON (a file or inline JSON)
    zerolayer ping [--count N]           authenticated round trips and the daemon's state
    zerolayer keygen [--append PATH]     a new `<key_id> <secret_hex>` keys-file line
    zerolayer ctl COMMAND [--socket P]   operate zerolayerd through its control socket:
                                         status, drain, undrain, reload-keys, config,
                                         cache-stats, cache-flush, kv-stats, xdp-status,
                                         xdp-attach, xdp-detach,
                                         rate-limit [rate_pps=N burst=M],
                                         untagged-rate [rate_pps=N burst=M],
                                         log-level [level=debug|info|warning|error]

Where invoke and ping find the daemon and their key (flags win over the environment):
  address  --addr HOST:PORT, else $ZEROLAYER_ADDR, else 127.0.0.1:7433
  key id   --key-id N, else $ZEROLAYER_KEY_ID; with a keys file and neither, its first key
  secret   --secret HEX or --keys-file PATH, else $ZEROLAYER_SECRET or $ZEROLAYER_KEYS_FILE,
           else the daemon's default keys file (/etc/zerolayer/keys) if it exists.
A secret on the command line is visible in `ps`; prefer the environment or a keys file.
ctl finds the socket at --socket PATH, else $ZEROLAYER_CONTROL_SOCKET, else
/run/zerolayer/control.sock (the systemd unit's); it needs no key, the socket's mode 0600 is
the access control (run it as root or as the daemon's user). It prints the JSON result.

Exit status:
  0 success · 2 usage (flags, address, credentials, keys file) · 3 the daemon answered with
  an error code, or the stream broke · 4 no answer (timeout, daemon unreachable) ·
  130 interrupted (an unfinished invoke is cancelled on the daemon).
Errors are printed as `zerolayer: CODE: message`, CODE being a protocol error code
(docs/PROTOCOL.md §7), a control error code (ctl: BAD_ARGUMENT, UNAVAILABLE, ...) or one of
USAGE, KEYS_FILE, TIMEOUT, STREAM_RESTARTED, NO_SOCKET.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zerolayer.client.address import node_name, parse_host_port
from zerolayer.protocol.sampling_params import MAX_TOP_LOGPROBS

from ..config import CPU_ACTIVATIONS, NetworkSection, SecuritySection

if TYPE_CHECKING:
    from zerolayer.client import Client, InvokeResult
    from zerolayer.protocol.logprobs import TokenLogprob

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_PROTOCOL = 3
EXIT_NO_ANSWER = 4
EXIT_INTERRUPTED = 130

# The daemon's own defaults, so that a client on the daemon's host needs no flags.
DEFAULT_HOST = NetworkSection.host
DEFAULT_PORT = NetworkSection.port
DEFAULT_KEYS_FILE = SecuritySection.keys_file
ENV_ADDR = "ZEROLAYER_ADDR"
ENV_KEY_ID = "ZEROLAYER_KEY_ID"
ENV_SECRET = "ZEROLAYER_SECRET"
ENV_KEYS_FILE = "ZEROLAYER_KEYS_FILE"


class UsageError(Exception):
    """Bad flags, address or credentials: exit 2, nothing was sent."""


# --- arguments shared by subcommands ----------------------------------------------------------

def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", help="GGUF file (default: bundled SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--threads", type=int, help="kernel threads (default: CPUs we may run on)")
    p.add_argument("--max-seq-len", type=int, help="context limit (default: the model's)")
    p.add_argument("--cpu-activations", choices=CPU_ACTIVATIONS, default="",
                   help="the integer CPU kernels' activations (default int16: the F32 model's "
                        "answers; int8 modes: faster prefill, llama.cpp's precision)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="P",
                   help="divide (multiply, if negative) the logit of every token already in "
                        "the prompt or the output by P (llama.cpp's --repeat-penalty; 1 = off)")
    p.add_argument("--presence-penalty", type=float, default=0.0, metavar="P",
                   help="subtract P from the logit of every token already in the output (0 = off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, metavar="P",
                   help="subtract P times its count so far from each output token's logit "
                        "(0 = off)")


def _sampling(args: argparse.Namespace) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, seed=args.seed, stop=tuple(args.stop),
                repetition_penalty=args.repetition_penalty,
                presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty)


def _add_target_args(p: argparse.ArgumentParser, timeout: float, timeout_help: str) -> None:
    g = p.add_argument_group("daemon and credentials (see `zerolayer --help`)")
    g.add_argument("--addr", metavar="HOST:PORT",
                   help=f"daemon address (default: ${ENV_ADDR} or {DEFAULT_HOST}:{DEFAULT_PORT})")
    g.add_argument("--key-id", metavar="N", help=f"key id (default: ${ENV_KEY_ID})")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--secret", metavar="HEX", help=f"the key's secret (default: ${ENV_SECRET})")
    src.add_argument("--keys-file", metavar="PATH",
                     help=f"read the secret from a keys file (default: ${ENV_KEYS_FILE})")
    g.add_argument("--timeout", type=float, default=timeout, metavar="SECONDS", help=timeout_help)


# --- address and credentials: the one place invoke and ping get them from ----------------------

@dataclass(frozen=True)
class Target:
    address: tuple[str, int] | str     # (host, port), or "shm:///path" (same host)
    key_id: int
    secret: bytes = field(repr=False)


def parse_address(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """HOST:PORT, HOST, :PORT, [V6ADDR]:PORT or [V6ADDR] → (host, port): the SDK's grammar
    (client/address.py), with the daemon's own host and port filling in what is left out."""
    try:
        return parse_host_port(text, default_host=DEFAULT_HOST, default_port=default_port)
    except ValueError as e:
        raise UsageError(str(e)) from None


def parse_key_id(text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= 0xFFFFFFFF:
        raise UsageError(f"bad key id {text!r}: must be an integer in 1..4294967295")
    return int(text)


def parse_secret(text: str) -> bytes:
    from ..auth import MAX_SECRET_BYTES, MIN_SECRET_BYTES
    try:
        raw = bytes.fromhex(text.strip())
    except ValueError:
        raise UsageError("the secret is not hex") from None
    if not MIN_SECRET_BYTES <= len(raw) <= MAX_SECRET_BYTES:
        raise UsageError(f"the secret must be {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes "
                         f"({2 * MIN_SECRET_BYTES}..{2 * MAX_SECRET_BYTES} hex digits)")
    return raw


def resolve_target(args: argparse.Namespace, environ: Mapping[str, str] | None = None,
                   default_keys_file: str = DEFAULT_KEYS_FILE) -> Target:
    """Address, key id and secret from flags, then the environment, then defaults."""
    env = os.environ if environ is None else environ
    addr = args.addr or env.get(ENV_ADDR) or f"{DEFAULT_HOST}:{DEFAULT_PORT}"
    address: tuple[str, int] | str = addr if addr.startswith("shm://") else parse_address(addr)
    kid_s = args.key_id if args.key_id is not None else env.get(ENV_KEY_ID)
    key_id = parse_key_id(kid_s) if kid_s else None

    if args.secret is not None:
        secret_hex, keys_file = args.secret, None
    elif args.keys_file is not None:
        secret_hex, keys_file = None, args.keys_file
    elif env.get(ENV_SECRET) and env.get(ENV_KEYS_FILE):
        raise UsageError(f"both ${ENV_SECRET} and ${ENV_KEYS_FILE} are set; unset one")
    elif env.get(ENV_SECRET):
        secret_hex, keys_file = env[ENV_SECRET], None
    elif env.get(ENV_KEYS_FILE):
        secret_hex, keys_file = None, env[ENV_KEYS_FILE]
    elif os.path.exists(default_keys_file):
        secret_hex, keys_file = None, default_keys_file
    else:
        raise UsageError(f"no credentials: give --secret or --keys-file, or set ${ENV_SECRET} "
                         f"(with ${ENV_KEY_ID}) or ${ENV_KEYS_FILE}")

    if secret_hex is not None:
        if key_id is None:
            raise UsageError(f"a secret needs its key id: --key-id or ${ENV_KEY_ID}")
        return Target(address, key_id, parse_secret(secret_hex))

    from ..auth import KeyFileError, load_keys
    assert keys_file is not None
    try:
        keys = load_keys(keys_file)     # the same checks as the daemon's, 0600 included
    except KeyFileError as e:
        raise UsageError(str(e)) from None
    if not keys:
        raise UsageError(f"{keys_file}: no keys in it")
    if key_id is None:
        key_id = next(iter(keys))
    elif key_id not in keys:
        raise UsageError(f"{keys_file}: no key with id {key_id}")
    return Target(address, key_id, keys[key_id])


def _client(args: argparse.Namespace) -> Client:
    from zerolayer.client import Client
    t = resolve_target(args)
    return Client(t.address, t.key_id, t.secret, timeout=args.timeout)


def _addr(client: Client) -> str:
    if isinstance(client.address, str):
        return f"shm://{client.address}"
    return node_name(client.address)


# --- generate ------------------------------------------------------------------------------

def cmd_generate(args: argparse.Namespace) -> int:
    from zerolayer.gpu.errors import RuntimeModelError
    from zerolayer.gpu.generate import Generator, SamplingParams, stderr_log
    from zerolayer.gpu.ops import cpu_features

    cpu_features.use_activations(args.cpu_activations)
    try:
        gen = Generator.load(args.model, threads=args.threads, max_seq_len=args.max_seq_len,
                             log=stderr_log)
        params = SamplingParams(**_sampling(args))
        kw = {"prompt": args.text} if args.raw else {"messages": [{"role": "user", "content": args.text}]}
        t0 = time.perf_counter()
        first = None
        for chunk in gen.generate(**kw, params=params):
            if first is None:
                first = time.perf_counter() - t0
            sys.stdout.write(chunk)
            sys.stdout.flush()
        sys.stdout.write("\n")
    except (RuntimeModelError, ValueError) as e:
        print(f"zerolayer: error: {e}", file=sys.stderr)
        return 2
    r = gen.last
    tps = r.completion_tokens / r.decode_s if r.decode_s > 0 else 0.0
    stderr_log(f"{r.prompt_tokens} prompt tokens in {r.prefill_s * 1e3:.1f} ms, "
               f"{r.completion_tokens} tokens at {tps:.1f} tok/s, "
               f"first token {1e3 * (first or 0):.1f} ms, finish: {r.finish_reason}")
    return 0


# --- invoke --------------------------------------------------------------------------------

def cmd_invoke(args: argparse.Namespace) -> int:
    from zerolayer.protocol.wire import ChatMessage
    text = sys.stdin.read() if args.text == "-" else args.text
    client = _client(args)
    payload = {"prompt": text} if args.raw else {"messages": [ChatMessage("user", text)]}
    fmt = response_format(args.response_format) if args.response_format else None
    if not 0 <= args.top_logprobs <= MAX_TOP_LOGPROBS:
        raise UsageError(f"--top-logprobs must be in 0..{MAX_TOP_LOGPROBS}")
    try:
        stream = client.stream(**payload, **_sampling(args), request_id=args.request_id,
                               logprobs=args.logprobs or args.top_logprobs > 0,
                               top_logprobs=args.top_logprobs, response_format=fmt)
    except ValueError as e:               # a bad --request-id
        raise UsageError(f"--request-id: {e}") from None
    wrote = False
    try:
        with stream:                      # leaving early (error, Ctrl-C) sends CANCEL
            for chunk in stream:
                sys.stdout.write(chunk)
                sys.stdout.flush()
                wrote = True
    finally:
        if wrote:
            sys.stdout.write("\n")
            sys.stdout.flush()
    r = stream.result
    assert r is not None
    if r.logprobs:
        _print_logprobs(r.logprobs)
    if args.verbose:
        _print_invoke_stats(r)
    return EXIT_OK


def response_format(value: str) -> dict:
    """--response-format: inline JSON (it starts with `{`) or a JSON file's path, holding
    either OpenAI's response_format object (type json_schema, json_object or text) or a
    bare JSON schema, which is wrapped as a json_schema response_format."""
    from zerolayer.protocol.constraint import from_response_format
    from zerolayer.protocol.errors import MalformedError
    if value.lstrip().startswith("{"):
        text, where = value, "inline JSON"
    else:
        try:
            with open(value, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--response-format: cannot read {value}: {e}") from None
        where = value
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--response-format: {where} is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise UsageError(f"--response-format: {where} must hold a JSON object")
    if obj.get("type") not in ("json_schema", "json_object", "text"):
        obj = {"type": "json_schema", "json_schema": {"name": "cli", "schema": obj}}
    try:
        from_response_format(obj)
    except MalformedError as e:
        raise UsageError(f"--response-format: {e.message}") from None
    return obj


def _print_logprobs(lps: Sequence[TokenLogprob]) -> None:
    """One stderr line per generated token: its logprob, the token (as JSON, so spaces and
    control bytes show), and the most likely alternatives if --top-logprobs asked."""
    for t in lps:
        line = f"zerolayer: logprob {t.logprob:.4f} {json.dumps(t.token, ensure_ascii=False)}"
        if t.top_logprobs:
            line += " top: " + ", ".join(
                f"{json.dumps(a.token, ensure_ascii=False)} "
                f"{a.logprob:.4f}" for a in t.top_logprobs)
        print(line, file=sys.stderr)


def _print_invoke_stats(r: InvokeResult) -> None:
    u, t = r.usage, r.timings
    # The first token comes out of the prefill; decode_us spans first → last token, so the
    # decode rate is over the completion_tokens - 1 tokens made after the first.
    decoded = max(u.completion_tokens - 1, 0)
    if t.decode_us > 0 and decoded:
        tps = f"{decoded / (t.decode_us / 1e6):.1f} tok/s"
    elif t.decode_per_token_us > 0:
        tps = f"{1e6 / t.decode_per_token_us:.1f} tok/s"
    else:
        tps = "- tok/s"                   # a single token: no decode step to time
    ttft = f"{r.ttft_s * 1e3:.1f} ms" if r.ttft_s is not None else "-"
    print(f"zerolayer: ttft {ttft}, {u.completion_tokens} tokens, {tps} decode, "
          f"e2e {r.elapsed_s * 1e3:.1f} ms, finish {r.finish_reason}, "
          f"prompt {u.prompt_tokens} tokens ({u.cached_prompt_tokens} cached), "
          f"attempts {r.attempts}, request {r.request_id.hex()}", file=sys.stderr)
    print(f"zerolayer: daemon: reassembly {t.ingress_us / 1e3:.2f} ms, "
          f"queue {t.queue_us / 1e3:.2f} ms, prefill {t.prefill_us / 1e3:.1f} ms, "
          f"decode {t.decode_us / 1e3:.1f} ms ({t.decode_per_token_us / 1e3:.2f} ms/token, "
          f"slowest step {t.decode_step_max_us / 1e3:.2f} ms), total {t.total_us / 1e3:.1f} ms",
          file=sys.stderr)


# --- ping ----------------------------------------------------------------------------------

def cmd_ping(args: argparse.Namespace) -> int:
    from zerolayer.protocol.errors import ZerolayerTimeoutError
    if args.count < 1:
        raise UsageError("--count must be at least 1")
    client = _client(args)
    addr = _addr(client)
    rtts: list[float] = []
    for i in range(args.count):
        if i:
            time.sleep(args.interval)
        try:
            rtt, pong = client.probe()
        except ZerolayerTimeoutError:
            print(f"no answer from {addr}: seq={i} (timeout {args.timeout} s)")
            continue
        rtts.append(rtt)
        received_us = time.time_ns() // 1000
        # Daemon clock minus ours, at the middle of the round trip (INVALID_TIMESTAMP beyond
        # ±300 s).
        offset_ms = (pong.server_time_us - (pong.echo_timestamp_us + received_us) / 2) / 1e3
        print(f"pong from {addr}: seq={i} rtt={rtt * 1e6:.0f} µs "
              f"state={pong.state.name.lower()} clock_offset={offset_ms:+.1f} ms", flush=True)
    loss = 100.0 * (args.count - len(rtts)) / args.count
    line = f"--- {addr}: {args.count} sent, {len(rtts)} received, {loss:.0f}% lost"
    if rtts:
        line += (f", rtt min/avg/max {min(rtts) * 1e6:.0f}/{sum(rtts) / len(rtts) * 1e6:.0f}/"
                 f"{max(rtts) * 1e6:.0f} µs")
    print(line)
    return EXIT_OK if rtts else EXIT_NO_ANSWER


# --- keygen --------------------------------------------------------------------------------

def append_key(path: str, secret: bytes, key_id: int | None = None) -> tuple[int, str]:
    """Append a key line to a keys file, creating it with mode 0600. Refuses a file that
    group or others can access, one the daemon could not load, and a duplicate key id.
    Without key_id, takes the largest id in the file + 1. Returns (key id, line)."""
    from ..auth import MAX_KEYS_FILE_BYTES, KeyFileError, format_key_line, parse_keys
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)        # two keygens must not pick the same id
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{path}: not a regular file")
        if st.st_mode & 0o077:
            raise KeyFileError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets group/others "
                               f"access the secrets; refusing to append (chmod 600 {path})")
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
            if len(data) > MAX_KEYS_FILE_BYTES:
                raise KeyFileError(f"{path}: larger than {MAX_KEYS_FILE_BYTES} bytes")
        try:
            existing = parse_keys(data.decode("utf-8"), path)
        except UnicodeDecodeError:
            raise KeyFileError(f"{path}: not UTF-8") from None
        if key_id is None:
            key_id = max(existing, default=0) + 1
        elif key_id in existing:
            raise KeyFileError(f"{path}: key id {key_id} exists already")
        line = format_key_line(key_id, secret)
        out = (b"" if not data or data.endswith(b"\n") else b"\n") + line.encode()
        if os.write(fd, out) != len(out):
            raise KeyFileError(f"{path}: short write")
        os.fsync(fd)
    finally:
        os.close(fd)
    return key_id, line


def cmd_keygen(args: argparse.Namespace) -> int:
    from ..auth import KeyFileError, format_key_line, generate_secret
    key_id = parse_key_id(args.key_id) if args.key_id is not None else None
    try:
        secret = generate_secret(args.bytes)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.append is None:
        sys.stdout.write(format_key_line(key_id or 1, secret))
        return EXIT_OK
    try:
        key_id, line = append_key(args.append, secret, key_id)
    except (KeyFileError, ValueError) as e:
        print(f"zerolayer: KEYS_FILE: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"zerolayer: KEYS_FILE: {args.append}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(line)
    print(f"zerolayer: key {key_id} appended to {args.append}; reload the daemon "
          f"(systemctl reload zerolayerd, or kill -HUP) to use it", file=sys.stderr)
    return EXIT_OK


# --- parser and error handling ----------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="zerolayer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="run the model in this process and stream the answer")
    g.add_argument("text")
    g.add_argument("--raw", action="store_true", help="raw prompt, no chat template")
    _add_model_args(g)
    _add_sampling_args(g)
    g.set_defaults(func=cmd_generate)

    i = sub.add_parser("invoke", help="send a signed invoke to zerolayerd and stream the answer")
    i.add_argument("text", help='the user message ("-" reads it from stdin)')
    i.add_argument("--raw", action="store_true", help="raw prompt, no chat template")
    i.add_argument("--request-id", metavar="HEX",
                   help="16-byte request id as 32 hex digits (default: random); a repeat "
                        "within 5 minutes gets the cached answer")
    i.add_argument("-v", "--verbose", action="store_true",
                   help="print TTFT, tok/s and the daemon's timings to stderr")
    i.add_argument("--logprobs", action="store_true",
                   help="print each generated token's logprob to stderr, a line a token")
    i.add_argument("--top-logprobs", type=int, default=0, metavar="N",
                   help="with each token, the N most likely tokens at its position and "
                        "their logprobs (0..20; implies --logprobs)")
    i.add_argument("--response-format", metavar="JSON|PATH",
                   help="constrain the answer: OpenAI's response_format object or a bare "
                        "JSON schema, inline (starting with '{') or in a file")
    _add_sampling_args(i)
    _add_target_args(i, 45.0, "give up after this long without any answer; retries go on "
                              "until then, so a daemon restart of up to 30 s is survived "
                              "(default: 45)")
    i.set_defaults(func=cmd_invoke)

    p = sub.add_parser("ping", help="authenticated round trips to zerolayerd, and its state")
    p.add_argument("--count", "-c", type=int, default=3, help="probes (default: 3)")
    p.add_argument("--interval", type=float, default=0.2, metavar="SECONDS",
                   help="pause between probes (default: 0.2)")
    _add_target_args(p, 1.0, "wait this long for each answer (default: 1)")
    p.set_defaults(func=cmd_ping)

    k = sub.add_parser("keygen", help="make a new key: print its keys-file line, or append it")
    k.add_argument("--key-id", metavar="N",
                   help="key id (default: 1; with --append, the file's largest id + 1)")
    k.add_argument("--append", metavar="PATH",
                   help="append to this keys file (created with mode 0600; a file that group "
                        "or others can access is refused)")
    k.add_argument("--bytes", type=int, default=32, help="secret length (16..64, default: 32)")
    k.set_defaults(func=cmd_keygen)

    from ..version import package_version
    ap.add_argument("--version", action="version", version=f"zerolayer {package_version()}")

    from ..ops.control import COMMANDS
    c = sub.add_parser("ctl", help="operate a running zerolayerd through its control socket")
    c.add_argument("command", choices=COMMANDS)
    c.add_argument("args", nargs="*", metavar="KEY=VALUE",
                   help="the command's arguments, e.g. `log-level level=debug`")
    c.add_argument("--socket", metavar="PATH",
                   help="the control socket (default: $ZEROLAYER_CONTROL_SOCKET, else "
                        f"{DEFAULT_CONTROL_SOCKET})")
    c.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="wait this long for the answer (default: 10)")
    c.add_argument("--connect", metavar="tcp://HOST:PORT",
                   help="a remote daemon's [control] tcp endpoint (CURVE), instead of --socket")
    c.add_argument("--curve-dir", metavar="DIR",
                   help="with --connect: DIR/server.key and DIR/operator.key_secret "
                        "(see ctl-keys; default: $ZEROLAYER_CURVE_DIR)")
    c.set_defaults(func=cmd_ctl)

    ck = sub.add_parser("ctl-keys", help="make CURVE keys for the remote control socket")
    ck.add_argument("dir", help="directory: server.key(_secret), clients/, NAME.key_secret")
    ck.add_argument("--client", default="operator",
                    help="the operator key to make (default: operator)")
    ck.set_defaults(func=cmd_ctl_keys)
    return ap


DEFAULT_CONTROL_SOCKET = "/run/zerolayer/control.sock"


def cmd_ctl(args: argparse.Namespace) -> int:
    import json

    from ..ops.control import request
    path = args.socket or os.environ.get("ZEROLAYER_CONTROL_SOCKET") or DEFAULT_CONTROL_SOCKET
    kv = {}
    for a in args.args:
        key, eq, value = a.partition("=")
        if not eq or not key:
            raise UsageError(f"argument {a!r} is not KEY=VALUE")
        kv[key] = value
    curve = None
    if args.connect:
        path = args.connect
        d = args.curve_dir or os.environ.get("ZEROLAYER_CURVE_DIR", "")
        if not d:
            raise UsageError("--connect needs --curve-dir (or $ZEROLAYER_CURVE_DIR)")
        curve = (os.path.join(d, "operator.key_secret"), os.path.join(d, "server.key"))
        if not all(os.path.isfile(f) for f in curve):
            raise UsageError(f"{d} lacks operator.key_secret or server.key (ctl-keys)")
    try:
        reply = request(path, args.command, kv, timeout_s=args.timeout, curve=curve)
    except FileNotFoundError:
        print(f"zerolayer: NO_SOCKET: {path} does not exist (is zerolayerd running with "
              f"[control] socket set?)", file=sys.stderr)
        return EXIT_NO_ANSWER
    except TimeoutError as e:
        print(f"zerolayer: TIMEOUT: {e}", file=sys.stderr)
        return EXIT_NO_ANSWER
    if not reply.get("ok"):
        err = reply.get("error")
        if not isinstance(err, Mapping):
            err = {}
        print(f"zerolayer: {err.get('code', 'ERROR')}: {err.get('message', '')}", file=sys.stderr)
        return EXIT_PROTOCOL
    print(json.dumps(reply["result"], indent=2, sort_keys=True))
    return EXIT_OK


def cmd_ctl_keys(args: argparse.Namespace) -> int:
    """The daemon's keypair (once) and one operator keypair; the operator's public key goes
    into clients/, which the daemon reads at start ([control] curve_dir)."""
    import shutil

    from zmq.auth import create_certificates
    d = args.dir
    os.makedirs(os.path.join(d, "clients"), mode=0o700, exist_ok=True)
    old = os.umask(0o077)
    try:
        if not os.path.exists(os.path.join(d, "server.key_secret")):
            create_certificates(d, "server")
        if os.path.exists(os.path.join(d, f"{args.client}.key_secret")):
            raise UsageError(f"{d}/{args.client}.key_secret exists already")
        pub, _ = create_certificates(d, args.client)
        shutil.copy(pub, os.path.join(d, "clients", f"{args.client}.key"))
    finally:
        os.umask(old)
    print(f"{d}: server.key(_secret), {args.client}.key_secret, clients/{args.client}.key")
    return EXIT_OK


def _error_name(e: Exception) -> str:
    from zerolayer.protocol.errors import StreamRestartedError, ZerolayerTimeoutError
    code = getattr(e, "code", None)
    if code is not None:
        return code.name
    if isinstance(e, ZerolayerTimeoutError):
        return "TIMEOUT"
    if isinstance(e, StreamRestartedError):
        return "STREAM_RESTARTED"
    return "ERROR"


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    from zerolayer.protocol.errors import ZerolayerError, ZerolayerTimeoutError
    try:
        return func(args)
    except UsageError as e:
        print(f"zerolayer: USAGE: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ZerolayerError as e:
        print(f"zerolayer: {_error_name(e)}: {e.message}", file=sys.stderr)
        return EXIT_NO_ANSWER if isinstance(e, ZerolayerTimeoutError) else EXIT_PROTOCOL
    except KeyboardInterrupt:
        print("zerolayer: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:               # stdout closed early (`| head`): not our error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _run(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
