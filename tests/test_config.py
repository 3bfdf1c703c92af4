"""Configuration checks (daemon/config.py) and the dry run `zerolayerd --check`
(daemon/ops/check.py): every value typed and range-checked, each error naming its setting and
where the value came from, all problems at once, before any model is loaded."""
from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from zerolayer.daemon import config
from zerolayer.daemon.version import package_version


def _load(toml: str | None = None, tmp_path=None, env: dict | None = None, **flags):
    path = None
    if toml is not None:
        path = tmp_path / "z.toml"
        path.write_text(toml)
    args = SimpleNamespace(config=str(path) if path else None,
                           **{k.replace("-", "_"): v for k, v in flags.items()})
    return config.load(args, environ=env or {})


@pytest.mark.parametrize("toml,env,flags,setting,source", [
    ("[network]\nport = true\n", {}, {}, "network.port", "z.toml [network] port"),
    ("[network]\nport = 70000\n", {}, {}, "network.port", "z.toml [network] port"),
    (None, {}, {"engine__max_running": "-4"}, "engine.max_running", "--engine-max-running"),
    (None, {"ZEROLAYER_NETWORK_PORT": "seven"}, {}, "network.port", "$ZEROLAYER_NETWORK_PORT"),
    ("[network]\ningress = \"tcp\"\n", {}, {}, "network.ingress", "[network] ingress"),
    ("[network]\nxsk_ring_size = 1000\n", {}, {}, "network.xsk_ring_size", "xsk_ring_size"),
    ("[cpu]\ncpus = \"two\"\n", {}, {}, "cpu.cpus", "[cpu] cpus"),
    ("[cpu]\nsched_fifo = 200\n", {}, {}, "cpu.sched_fifo", "[cpu] sched_fifo"),
    ("[cache]\nttl_s = \"long\"\n", {}, {}, "cache.ttl_s", "[cache] ttl_s"),
    (None, {"ZEROLAYER_ENGINE_OVERLAP": "maybe"}, {}, "engine.overlap", "$ZEROLAYER_ENGINE_OVERLAP"),
])
def test_a_bad_value_names_its_setting_and_source(tmp_path, toml, env, flags, setting, source):
    with pytest.raises(config.ConfigError) as ei:
        _load(toml, tmp_path, env, **flags)
    [problem] = ei.value.problems
    assert problem.startswith(setting + " (") and source in problem, problem


def test_every_problem_is_listed_at_once(tmp_path):
    toml = "[network]\nport = -1\nbogus = 1\n[engine]\nmax_running = 0\n[nope]\n"
    with pytest.raises(config.ConfigError) as ei:
        _load(toml, tmp_path, {"ZEROLAYER_METRICS_PORT": "x"})
    text = "\n".join(ei.value.problems)
    for part in ("network.port", "bogus", "engine.max_running", "nope", "metrics.port"):
        assert part in text
    assert len(ei.value.problems) == 5


def test_good_values_from_every_source(tmp_path):
    cfg = _load("[network]\nport = 7000\n[cache]\nttl_s = 60\n", tmp_path,
                {"ZEROLAYER_ENGINE_OVERLAP": "off"}, engine__max_running="8")
    assert cfg.network.port == 7000 and cfg.cache.ttl_s == 60.0
    assert cfg.engine.overlap is False and cfg.engine.max_running == 8


def test_cpu_activations_setting_names_the_runtimes_modes(tmp_path):
    """[cpu] activations (ZEROLAYER_CPU_ACTIVATIONS, --cpu-activations) lists the kernels'
    own modes, and selecting one changes the layout the next model is built on."""
    from zerolayer.gpu.ops import cpu_features
    assert set(config.CPU_ACTIVATIONS) == set(cpu_features.ACT_MODES)
    assert cpu_features.ACT_DEFAULT == "int16"
    cfg = _load("[cpu]\nactivations = \"int8-qkv16\"\n", tmp_path, {})
    assert cfg.cpu.activations == "int8-qkv16"
    with pytest.raises(config.ConfigError, match="cpu.activations"):
        _load("[cpu]\nactivations = \"int4\"\n", tmp_path, {})
    saved = cpu_features.ACTIVATIONS
    try:
        cpu_features.use_activations("int8")
        assert cpu_features.ACTIVATIONS == "int8"
        cpu_features.use_activations("")  # the default setting: no change
        assert cpu_features.ACTIVATIONS == "int8"
        with pytest.raises(ValueError):
            cpu_features.use_activations("int4")
    finally:
        cpu_features.ACTIVATIONS = saved


def _zerolayerd(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zerolayer.daemon.server", *args],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def _keys(tmp_path) -> str:
    p = tmp_path / "keys"
    p.write_text("1 " + "ab" * 32 + "\n")
    os.chmod(p, 0o600)
    return str(p)


def test_check_passes_a_good_configuration(tmp_path):
    r = _zerolayerd("--check", "--security-keys-file", _keys(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("config", "addresses", "keys", "model"):
        assert f"ok   {name}:" in r.stdout
    assert "forward pass ok" in r.stdout and "all checks passed" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--network-port", "true"], "network.port (--network-port)"),
    (["--engine-max-running", "-4"], "engine.max_running (--engine-max-running)"),
    (["--network-ingress", "tcp"], "network.ingress (--network-ingress)"),
    (["--model-max-seq-len", "0"], "model.max_seq_len (--model-max-seq-len)"),
    (["--cache-lease-s", "0"], "cache.lease_s (--cache-lease-s)"),
    (["--lifecycle-drain-timeout-s", "-1"], "lifecycle.drain_timeout_s"),
    (["--network-host", "no.such.host.invalid"], "[network] host"),
    (["--model-path", "/nonexistent.gguf"], "FAIL model"),
])
def test_check_refuses_a_bad_configuration_naming_it(tmp_path, args, needle):
    r = _zerolayerd("--check", "--security-keys-file", _keys(tmp_path), *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stdout and "problem(s)" in r.stdout


def test_check_reports_a_bad_keys_file_and_goes_on(tmp_path):
    bad = tmp_path / "keys"
    bad.write_text("1 " + "ab" * 32 + "\n")
    os.chmod(bad, 0o644)                                   # readable by others: refused
    r = _zerolayerd("--check", "--security-keys-file", str(bad))
    assert r.returncode == 2 and "FAIL keys" in r.stdout
    assert "ok   model:" in r.stdout                       # the other checks still ran


def test_the_daemon_refuses_a_bad_value_before_loading_the_model(tmp_path):
    r = _zerolayerd("--security-keys-file", _keys(tmp_path), "--engine-max-running", "-4",
                    "--network-port", "0", "--metrics-port", "0")
    assert r.returncode == 2
    assert "bad configuration: engine.max_running (--engine-max-running)" in r.stderr
    assert "loaded" not in r.stderr                        # never got to the model


def test_version_is_the_package_metadata():
    from zerolayer.gpu import __version__
    assert package_version() == __version__
    r = _zerolayerd("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"zerolayerd {__version__}"
    r = subprocess.run([sys.executable, "-m", "zerolayer.daemon.programs.cli", "--version"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == f"zerolayer {__version__}"


@pytest.mark.skipif(os.geteuid() != 0, reason="loading BPF programs needs root")
def test_check_loads_the_xdp_program_through_the_verifier(tmp_path):
    r = _zerolayerd("--check", "--security-keys-file", _keys(tmp_path), "--network-ingress",
                    "xdp", "--network-interface", "lo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok   xdp: loaded through the verifier" in r.stdout and "not attached" in r.stdout


def test_every_flag_help_renders_with_the_settings_comments():
    """`zerolayerd --help` formats each flag's help with %-formatting: a comment of
    deploy/'s TOML with a literal % (e.g. "~97% top-1") must print, not raise."""
    import argparse
    comments = config.setting_comments()
    assert any("%" in c for c in comments.values())
    ap = argparse.ArgumentParser()
    config.add_flags(ap, comments)
    text = ap.format_help()
    assert "%" in text and "%%" not in text
