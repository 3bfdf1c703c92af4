"""The Kubernetes manifests played for real: deploy/k8s/overlays/cpu through `podman kube play`,
three pods of the Deployment, and the fleet SDK across them (a pod killed mid-run, one
replaced pod by pod).

Rendering: `kubectl kustomize` where installed, else the subset renderer of
tests/test_k8s_manifests.py. The image: scripts/image-check.sh's own build
(ZEROLAYER_IMAGE_BUILD_ONLY=1, its rootfs cache and podman's layer cache, so after
tests/test_image.py it is a cache hit), or ZEROLAYER_K8S_PLAY_IMAGE to use one already built.
Needs root and a few minutes (each pod compiles its kernels cold: the JIT cache is an
emptyDir), so it runs only with ZEROLAYER_IMAGE_CHECK=1 (.ci/run sets it).

What podman 4.3 (Debian 12) does not do as Kubernetes does, and what this test plays instead.
The manifests are not changed; `for_podman()` rewrites the rendered objects, one reason each:
- replicas: 4.3 plays a Deployment's replicas as pods <name>-pod-0..N-1, but an emptyDir
  becomes ONE named volume (the volume's name) shared by every pod of the play, so three
  replicas would share /run/zerolayer (one control socket path for three daemons) and the
  keys copy. So each pod is its own play of the same Deployment (renamed, replicas 1) with
  its emptyDir volumes renamed per pod: private, as on Kubernetes.
- the Secret volume: 4.3 dereferences the unset `optional` (a nil pointer: kube play panics in
  VolumeFromSecret), and writes the Secret's base64 text, not its bytes, into the file, at
  0644 (items, mode and defaultMode are ignored). So `optional: false` is added, and the
  Secret is given as a podman secret holding the decoded keys, in the form kube play reads.
  The init container's copy to a 0400 file owned by 10001 runs as written.
- restartPolicy: 4.3 gives init containers the pod's policy (Always), so the one-shot copy is
  restarted and its second run fails on its own 0400 file; Kubernetes re-runs init
  containers on failure only. Played as OnFailure.
- the ConfigMap's subPath mount: 4.3 ignores subPath and would mount the volume (a directory)
  at /etc/zerolayer/zerolayerd.toml. Mounted at /etc/zerolayer instead: the same file at the
  same path.
- probes: 4.3 turns only the livenessProbe into a podman healthcheck, `curl -f
  http://localhost:<port>/healthz`, with a named port read as 0 and no curl in the image. The
  liveness probe is played as an exec of the image's Python GETting the same path and port;
  the readinessProbe is ignored by 4.3, so the test polls /readyz on the pod IP, as the
  kubelet would. Health is read from `podman healthcheck run` / inspect (no systemd here to
  run podman's timers).
- ports: 4.3 publishes every containerPort on the same port of the host when hostPort is
  unset; Kubernetes only names them. Three pods would collide on the host's 9433, so the
  container's ports list is dropped (the probe's named port is resolved first) and the pods
  are reached on their own IPs, as on Kubernetes.
- not played by 4.3: Services (the SDK gets the pods' addresses from podman inspect: there is
  no cluster DNS for the headless Service's fleet:// name), the PodDisruptionBudget, the
  Prometheus Operator objects, preStop hooks (the test runs the manifest's preStop command
  with `podman exec`) and terminationGracePeriodSeconds (the test stops the daemon's
  container with it as -t; see the rolling test for why not `podman pod stop`).
- the JIT cache: each pod's cache emptyDir starts as a copy of a warm cache (the named volume
  4.3 would make is created first): three cold kernel builds at once took over ten minutes
  on two loaded cores. The pods still load the model and warm up behind a 503 /readyz.
- the warming phase: a warm start can pass from 503 to 200 between two polls, so the daemon
  gets ZEROLAYER_TEST_HOOKS (daemon/test_hooks.py) in its cache volume, with `hold-load`
  there at start: the test sees the 503 while the load is held, then lets it go.
- names: ConfigMap, Secret, network and every volume get a per-run suffix (podman's volumes
  and secrets are host-wide), and teardown removes all of them.
"""
from __future__ import annotations

import copy
import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

if os.environ.get("ZEROLAYER_IMAGE_CHECK") != "1":
    pytest.skip("plays deploy/k8s with podman kube play (root, minutes): set "
                "ZEROLAYER_IMAGE_CHECK=1", allow_module_level=True)

yaml = pytest.importorskip("yaml")

from test_k8s_manifests import _kustomize_cmd, render  # noqa: E402
from zerolayer.client import Client, InvokeResult  # noqa: E402
from zerolayer.client.fleet import node_name, rendezvous_order  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / "deploy" / "k8s" / "overlays" / "cpu"
PODMAN = ["podman", "--runtime", "runc"]     # as scripts/image-check.sh: crun refuses hybrid cgroups
INVOKE_PORT, METRICS_PORT = 7433, 9433
REPLICAS = 3
IMAGE_CHECK_CACHE = "zerolayer-image-check-cache"     # scripts/image-check.sh's JIT cache volume
CACHE_MOUNT = "/var/cache/zerolayer"                   # the Deployment's cache emptyDir
HOOKS = "test-hooks"                                   # ZEROLAYER_TEST_HOOKS, inside it
PROMPT = "The capital of France is"
COUNT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"     # a long answer: streams that outlast the drain


CONF: Path | None = None       # containers.conf for podman, set by the fixture


def sh(*args: str, check: bool = True, timeout: float = 300, input: str | None = None
       ) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input,
                       env=dict(os.environ, CONTAINERS_CONF=str(CONF)) if CONF else None)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def rendered() -> list[dict]:
    cmd = _kustomize_cmd()
    if cmd is None:
        return render(OVERLAY)
    r = subprocess.run([*cmd, str(OVERLAY)], capture_output=True, text=True, timeout=120,
                       check=True)
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def for_podman(docs: list[dict], *, run: str, pod: str, image: str,
               hooks: str | None = None) -> list[dict]:
    """The rendered objects as podman 4.3's kube play needs them to do what Kubernetes does
    (the module docstring gives the reason for each change), for one pod named `pod`."""
    out = copy.deepcopy(docs)
    for d in out:
        if d["kind"] == "ConfigMap":
            d["metadata"]["name"] += f"-{run}"
        if d["kind"] != "Deployment":
            continue
        d["metadata"]["name"] = pod
        d["spec"]["replicas"] = 1
        spec = d["spec"]["template"]["spec"]
        spec["restartPolicy"] = "OnFailure"
        for v in spec["volumes"]:
            if "emptyDir" in v:
                name, v["name"] = v["name"], f"{v['name']}-{pod}"
                for c in spec["containers"] + spec["initContainers"]:
                    for m in c.get("volumeMounts", []):
                        if m["name"] == name:
                            m["name"] = v["name"]
            if "secret" in v:
                v["secret"]["secretName"] += f"-{run}"
                v["secret"]["optional"] = False
            if "configMap" in v:
                v["configMap"]["name"] += f"-{run}"
        for c in spec["containers"] + spec["initContainers"]:
            c["image"] = image
            for m in c.get("volumeMounts", []):
                if m.get("subPath"):
                    assert m["mountPath"].endswith("/" + m["subPath"])
                    m["mountPath"] = m["mountPath"].removesuffix("/" + m.pop("subPath"))
        c = spec["containers"][0]
        if hooks is not None:
            c["env"].append({"name": "ZEROLAYER_TEST_HOOKS", "value": hooks})
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        # 4.3 publishes each containerPort on the host's same port when hostPort is unset
        # (Kubernetes only names them): three pods would collide on the host's 9433
        del c["ports"]
        probe = c["livenessProbe"]
        get = probe.pop("httpGet")
        port = ports.get(get["port"], get["port"])
        # podman joins the words with spaces and runs them with /bin/sh -c
        probe["exec"] = {"command": [
            "/opt/zerolayer/.venv/bin/python", "-c",
            f"'import urllib.request as u; u.urlopen(\"http://127.0.0.1:{port}{get['path']}\", "
            f"timeout={probe.get('timeoutSeconds', 1)})'"]}
    return out


def _get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


class Pod:
    def __init__(self, name: str) -> None:
        self.name = name                         # the pod: <deployment>-pod-0
        self.ctr = f"{name}-zerolayerd"
        self.ip = ""
        self.hooks: Path | None = None           # on the host: the pod's test-hooks directory
        self.saw_warming = False

    @property
    def addr(self) -> tuple[str, int]:
        return (self.ip, INVOKE_PORT)

    @property
    def node(self) -> str:
        return node_name(self.addr)

    def metric(self, name: str) -> float:
        status, text = _get(f"http://{self.ip}:{METRICS_PORT}/metrics")
        assert status == 200, (self.name, status)
        m = re.search("^" + re.escape(name) + r" ([0-9.e+-]+)$", text, re.M)
        assert m, name
        return float(m.group(1))

    def logs(self) -> str:
        r = sh(*PODMAN, "logs", self.ctr, check=False)
        return r.stdout + r.stderr


class Fleet:
    def __init__(self) -> None:
        self.run = f"zlp{os.getpid()}{secrets.token_hex(3)}"
        self.net = f"{self.run}-net"
        self.secret = f"zerolayer-keys-{self.run}"
        self.key_id, self.secret_hex = 1, secrets.token_hex(32)
        self.docs = rendered()
        self.image = self._image()
        self.pods: list[Pod] = []
        self.grace = self.docs_deployment()["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"]

    def docs_deployment(self) -> dict:
        return next(d for d in self.docs if d["kind"] == "Deployment")

    @staticmethod
    def _image() -> str:
        if os.environ.get("ZEROLAYER_K8S_PLAY_IMAGE"):
            return os.environ["ZEROLAYER_K8S_PLAY_IMAGE"]
        r = subprocess.run(["bash", str(ROOT / "scripts" / "image-check.sh")], cwd=ROOT,
                           env=dict(os.environ, ZEROLAYER_PY=sys.executable,
                                    ZEROLAYER_IMAGE_BUILD_ONLY="1"),
                           capture_output=True, text=True, timeout=45 * 60)
        assert r.returncode == 0, f"image-check.sh (build only): {r.returncode}\n{r.stderr[-4000:]}"
        m = re.search(r"^image (\S+) size \d+ MB$", r.stdout, re.M)
        assert m, r.stdout
        return m.group(1)

    def up(self) -> None:
        sh(*PODMAN, "network", "create", self.net)
        # The Secret as kube play 4.3 reads a podman secret: a Secret object whose data are
        # the file's text (it does not base64-decode them).
        obj = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": self.secret},
               "data": {"keys": f"{self.key_id} {self.secret_hex}\n"}}
        sh(*PODMAN, "secret", "create", self.secret, "-", input=json.dumps(obj))

    def volume_path(self, name: str) -> Path | None:
        r = sh(*PODMAN, "volume", "inspect", name, "--format", "{{.Mountpoint}}", check=False)
        return Path(r.stdout.strip()) if r.returncode == 0 else None

    def make_cache(self, index: int, src: Path | None) -> Path:
        """The pod's cache emptyDir (podman 4.3: the named volume cache-<pod>, which kube
        play reuses) made before the play, holding a copy of a warm JIT cache (where there
        is one) and the test-hooks directory with `hold-load` in it; that directory."""
        vol = f"cache-{self.run}-{index}"
        sh(*PODMAN, "volume", "create", vol)
        dst = self.volume_path(vol)
        assert dst is not None
        if src is not None:
            # cp -a: owners and modes as the daemon (uid 10001) wrote them
            sh("cp", "-a", f"{src}/.", f"{dst}/")
        hooks = dst / HOOKS
        shutil.rmtree(hooks, ignore_errors=True)     # a copied pod's, with its marks
        hooks.mkdir()
        (hooks / "hold-load").touch()
        for d in (dst, hooks):
            os.chown(d, 10001, 10001)
        return hooks

    def play(self, index: int, seed: Path | None = None) -> Pod:
        pod = Pod(f"{self.run}-{index}-pod-0")
        self.pods.append(pod)
        pod.hooks = self.make_cache(index, seed)
        docs = for_podman(self.docs, run=self.run, pod=f"{self.run}-{index}", image=self.image,
                          hooks=f"{CACHE_MOUNT}/{HOOKS}")
        text = yaml.safe_dump_all(docs, sort_keys=False)
        r = sh(*PODMAN, "kube", "play", "--network", self.net, "-", input=text, timeout=600)
        assert pod.name in r.stdout or "Pod:" in r.stdout, r.stdout
        infra = sh(*PODMAN, "pod", "inspect", pod.name, "--format",
                   "{{.InfraContainerID}}").stdout.strip()
        pod.ip = sh(*PODMAN, "inspect", infra, "--format",
                    "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}").stdout.strip()
        assert pod.ip, pod.name
        return pod

    def wait_ready(self, pods: list[Pod], timeout: float = 900) -> None:
        """Readiness as the kubelet sees it (/readyz on the pod IP), checked against the
        daemon's own word: /readyz is 200 only once the log says "ready on", i.e. warm.
        Each pod's load is held (`hold-load`) until its /readyz has answered 503 warming."""
        end = time.monotonic() + timeout
        waiting = list(pods)
        while waiting and time.monotonic() < end:
            for p in list(waiting):
                status, body = _get(f"http://{p.ip}:{METRICS_PORT}/readyz", timeout=2)
                assert p.hooks is not None
                held = (p.hooks / "load-held").exists()
                if status == 200:
                    assert p.saw_warming, f"{p.name}: ready before its held load was let go"
                    assert "zerolayerd: ready on" in p.logs(), (p.name, body)
                    waiting.remove(p)
                elif status == 503:
                    assert "warming" in body or "starting" in body, body
                    if held:     # the daemon is up and holds its load: warming, for certain
                        assert "warming" in body, body
                        p.saw_warming = True
                        (p.hooks / "hold-load").unlink(missing_ok=True)
                state = sh(*PODMAN, "inspect", p.ctr, "--format", "{{.State.Status}}").stdout
                assert state.strip() == "running", (p.name, state, p.logs()[-3000:])
            time.sleep(0.2)
        assert not waiting, [(p.name, p.logs()[-3000:]) for p in waiting]

    def client(self, pods: list[Pod]) -> Client:
        return Client([f"{p.ip}:{INVOKE_PORT}" for p in pods], self.key_id, self.secret_hex,
                      timeout=45, failover_after_s=1.0)

    def down(self) -> None:
        names = [p.name for p in self.pods]
        if names:
            sh(*PODMAN, "pod", "rm", "-f", "-t", "0", *names, check=False)
        vols = sh(*PODMAN, "volume", "ls", "--format", "{{.Name}}", check=False).stdout.split()
        mine = [v for v in vols if self.run in v]
        if mine:
            sh(*PODMAN, "volume", "rm", "-f", *mine, check=False)
        sh(*PODMAN, "secret", "rm", self.secret, check=False)
        sh(*PODMAN, "network", "rm", "-f", self.net, check=False)


@pytest.fixture(scope="module")
def fleet():
    global CONF
    if os.geteuid() != 0:
        pytest.fail("ZEROLAYER_IMAGE_CHECK=1 needs root (rootful podman)")
    if shutil.which("podman") is None:
        pytest.fail("podman is missing: scripts/image-check.sh installs it")
    with tempfile.TemporaryDirectory() as tmp:
        # podman's default ulimits cannot be set without CAP_SYS_RESOURCE here, and kube play
        # has no --ulimit: the same values as image-check.sh's, through containers.conf
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        CONF = Path(tmp) / "containers.conf"
        CONF.write_text(f'[containers]\ndefault_ulimits = ["nofile={hard}:{hard}", '
                        f'"nproc=4096:4096"]\n')
        f = Fleet()
        # a CI timeout's SIGTERM still tears down (pytest would exit without finally blocks)
        old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
        try:
            f.up()
            # Each pod's JIT cache is an emptyDir: three cold kernel builds at once take over
            # ten minutes on two loaded cores. The first pod starts from image-check.sh's warm
            # cache where tests/test_image.py left it (else cold), the others from a copy of
            # the first pod's: warm starts, which still load the model and warm up behind a
            # 503 /readyz.
            f.play(0, seed=f.volume_path(IMAGE_CHECK_CACHE))
            f.wait_ready(f.pods)
            for i in range(1, REPLICAS):
                f.play(i, seed=f.volume_path(f"cache-{f.run}-0"))
            f.wait_ready(f.pods)
            yield f
        finally:
            f.down()
            signal.signal(signal.SIGTERM, old)
            CONF = None


def _ids_first_on(pod: Pod, pods: list[Pod], k: int) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < k:
        r = secrets.token_bytes(16)
        if rendezvous_order(r, [p.addr for p in pods])[0] == pod.addr:
            out.append(r)
    return out


def test_pods_run_as_the_manifests_say(fleet):
    dep = fleet.docs_deployment()
    toml = next(d for d in fleet.docs if d["kind"] == "ConfigMap")["data"]["zerolayerd.toml"]
    for p in fleet.pods:
        assert p.saw_warming, f"{p.name}: /readyz never said warming (503) before ready"
        # config from the ConfigMap, at the path --config names
        r = sh(*PODMAN, "exec", p.ctr, "cat", "/etc/zerolayer/zerolayerd.toml")
        assert r.stdout == toml
        # the Secret's keys, copied by the init container to a 0400 file owned by 10001
        r = sh(*PODMAN, "exec", p.ctr, "stat", "-c", "%a %u %g", "/run/zerolayer-keys/keys")
        assert r.stdout.split() == ["400", "10001", "10001"], r.stdout
        r = sh(*PODMAN, "exec", p.ctr, "cat", "/run/zerolayer-keys/keys")
        assert r.stdout.split() == [str(fleet.key_id), fleet.secret_hex]
        info = json.loads(sh(*PODMAN, "inspect", p.ctr).stdout)[0]
        assert info["Config"]["User"] in ("10001", "10001:10001"), info["Config"]["User"]
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        assert info["Config"]["Cmd"] == dep["spec"]["template"]["spec"]["containers"][0]["args"]
        # the liveness probe as podman's healthcheck: healthy
        r = sh(*PODMAN, "healthcheck", "run", p.ctr, check=False)
        assert r.returncode == 0, (r.stdout, r.stderr)
        health = sh(*PODMAN, "inspect", p.ctr, "--format", "{{.State.Health.Status}}").stdout
        assert health.strip() == "healthy", health
        # metrics on the pod IP: the ConfigMap's host 0.0.0.0 and port 9433 were read
        assert p.metric("zerolayer_model_runs_total") >= 0


def test_200_requests_spread_and_a_pod_killed_mid_run(fleet):
    pods = list(fleet.pods)
    victim, live = pods[2], pods[:2]
    c = fleet.client(pods)
    before = {p.name: p.metric("zerolayer_model_runs_total") for p in pods}
    rids = [secrets.token_bytes(16) for _ in range(200)]
    first = {r: rendezvous_order(r, [p.addr for p in pods]) for r in rids}
    spread = {p.node: sum(1 for r in rids if first[r][0] == p.addr) for p in pods}
    assert all(n >= 30 for n in spread.values()), spread      # 200 ids: ~67 each

    killed, finished = threading.Event(), threading.Event()
    assert victim.hooks is not None
    hold = victim.hooks / "hold"

    def killer() -> None:
        # mid-run: the victim has finished some of its share and holds more in its engine.
        # Its engine is then held (test hook) so that what it has taken stays in flight until
        # the kill lands, however fast it decodes: a scrape that sees requests running can be
        # stale by the time `pod kill` returns.
        while not finished.is_set():
            if not hold.exists():
                done = victim.metric("zerolayer_model_runs_total") - before[victim.name]
                if done >= 5:
                    hold.touch()
            elif (victim.hooks / "held").exists():
                busy = (victim.metric("zerolayer_requests_running")
                        + victim.metric("zerolayer_requests_waiting"))
                if busy >= 1:
                    sh(*PODMAN, "pod", "kill", victim.name)
                    killed.set()
                    return
            time.sleep(0.05)

    kt = threading.Thread(target=killer, daemon=True)
    kt.start()

    def one(r: bytes) -> InvokeResult | BaseException:
        try:
            return c.invoke(prompt=PROMPT, max_tokens=6, request_id=r)
        except BaseException as e:  # noqa: BLE001 - asserted below
            return e
    with ThreadPoolExecutor(24) as ex:
        out = dict(zip(rids, ex.map(one, rids)))
    finished.set()
    kt.join(60)
    hold.unlink(missing_ok=True)  # a victim left alive (the assertion below) is not held
    assert killed.is_set(), "the victim never held requests in flight"
    state = sh(*PODMAN, "inspect", victim.ctr, "--format", "{{.State.Status}}").stdout.strip()
    assert state != "running", state

    errors = {r.hex(): v for r, v in out.items() if not isinstance(v, InvokeResult)}
    assert not errors, errors
    res = {r: v for r, v in out.items() if isinstance(v, InvokeResult)}
    restarted = 0
    for r, v in res.items():
        order = first[r]
        if order[0] == victim.addr:
            # ran on the victim before the kill, or recovered on its second node
            assert v.node in (victim.node, node_name(order[1])), (v.node, order)
            restarted += v.node != victim.node and v.restarts >= 1
        else:
            assert v.node == node_name(order[0]) and v.restarts == 0, (v.node, order)
        assert v.text.strip(), r.hex()
    assert restarted >= 1, "no request was cut on the victim and re-run elsewhere"
    print(f"k8s-play: 200 requests, first nodes {sorted(spread.values())}, {restarted} cut on "
          f"the killed pod and re-run on their next node")
    # no request ran twice on a live pod: each ran there exactly the requests it answered
    for p in live:
        ran = p.metric("zerolayer_model_runs_total") - before[p.name]
        assert ran == sum(1 for v in res.values() if v.node == p.node), (p.name, ran)
    fleet.pods.remove(victim)
    sh(*PODMAN, "pod", "rm", "-f", "-t", "0", victim.name)


def test_rolling_replacement_loses_no_admitted_stream(fleet):
    """Pod by pod as the Deployment's RollingUpdate (maxSurge 1, maxUnavailable 0): a new pod
    is played and warms, then an old one gets its preStop hook and SIGTERM with the grace
    period, while streams admitted on it are in flight."""
    dep = fleet.docs_deployment()["spec"]["template"]["spec"]["containers"][0]
    pre_stop = dep["lifecycle"]["preStop"]["exec"]["command"]
    new = fleet.play(90, seed=fleet.volume_path(f"cache-{fleet.run}-0"))
    fleet.wait_ready([new])
    old = fleet.pods[0]
    pods = [p for p in fleet.pods if p is not new]         # what the clients were given
    c = fleet.client(pods)
    rids = _ids_first_on(old, pods, 4)
    started = threading.Barrier(len(rids) + 1, timeout=300)
    results: dict[bytes, InvokeResult | BaseException] = {}

    def stream(r: bytes) -> None:
        try:
            s = c.stream(prompt=COUNT, max_tokens=96, request_id=r)
            text = ""
            for i, chunk in enumerate(s):
                text += chunk
                if i == 0:
                    started.wait()                         # admitted and streaming
            assert s.result is not None
            results[r] = s.result
        except BaseException as e:  # noqa: BLE001 - asserted below
            results[r] = e
            started.abort()
    ts = [threading.Thread(target=stream, args=(r,)) for r in rids]
    for t in ts:
        t.start()
    started.wait()
    # the kubelet's preStop hook: `zerolayer ctl drain`, then a sleep
    hook = subprocess.Popen([*PODMAN, "exec", old.ctr, *pre_stop],
                            env=dict(os.environ, CONTAINERS_CONF=str(CONF)))
    end = time.monotonic() + 60
    while _get(f"http://{old.ip}:{METRICS_PORT}/readyz")[1].strip() != "draining":
        assert time.monotonic() < end and hook.poll() in (None, 0), "the preStop drain failed"
        time.sleep(0.05)
    in_flight = (old.metric("zerolayer_requests_running")
                 + old.metric("zerolayer_requests_waiting"))
    assert in_flight >= 1, "the streams ended before the drain: nothing was in flight"
    # while draining, a new request first-ordered on the old pod goes to its next node
    late = _ids_first_on(old, pods, 1)[0]
    lr = c.invoke(prompt=PROMPT, max_tokens=4, request_id=late)
    assert lr.node == node_name(rendezvous_order(late, [p.addr for p in pods])[1])
    assert hook.wait(60) == 0
    # SIGTERM with the grace period to the daemon's container, as the kubelet does. Not `pod
    # stop`: with it, the streams still in flight stopped getting frames right after the
    # SIGTERM and were re-run on the next pod (StreamRestartedError), while the container's
    # own stop keeps them streaming to the end of the drain (4.3 stops the pod's infra
    # container, which holds its network, alongside the daemon's).
    sh(*PODMAN, "stop", "-t", str(fleet.grace), old.ctr, timeout=fleet.grace + 60)
    for t in ts:
        t.join(120)
    code = sh(*PODMAN, "inspect", old.ctr, "--format", "{{.State.ExitCode}}").stdout.strip()
    assert code == "0", (code, old.logs()[-3000:])       # drained, not killed
    for r in rids:
        v = results[r]
        assert isinstance(v, InvokeResult), v
        assert v.node == old.node and v.restarts == 0 and v.text.strip()
    print(f"k8s-play: {int(in_flight)} of {len(rids)} streams in flight on the pod at its "
          f"drain, all completed there; it exited 0 after SIGTERM")
    fleet.pods.remove(old)
    sh(*PODMAN, "pod", "rm", "-f", "-t", "0", old.name)
    # the replacement serves
    c2 = fleet.client([new] + [p for p in pods if p is not old])
    rid = _ids_first_on(new, [new] + [p for p in pods if p is not old], 1)[0]
    assert c2.invoke(prompt=PROMPT, max_tokens=4, request_id=rid).node == new.node
