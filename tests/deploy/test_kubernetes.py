"""deploy/kubernetes: every manifest is valid against Kubernetes' own schemas, the parts refer to
one another correctly, and the pod's config and keys work with the real daemon.

No cluster runs here: the base and the GPU overlay are rendered the way kustomize renders them
(the resources it lists, its namespace, the overlay's strategic-merge patch), each object is
checked against the OpenAPI schemas of Kubernetes (``kubernetes-validate``, which ships them,
strict: an unknown field is an error), and what no schema can check is checked here. The last
test starts ``blazar serve`` with the ConfigMap's config.toml and the init containers' key
commands, and sends the request the kubelet's probes send.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from blazar.auth.keys import new_secret
from blazar.config import load_config, resolve_paths
from tests.support import ROOT, free_port, home_env, start_daemon

DEPLOY = ROOT / "deploy" / "kubernetes"
GPU = DEPLOY / "overlays" / "gpu"
VERSIONS = ("1.29", "1.37")
"""The oldest Kubernetes the manifests are meant for, and the newest the schemas know."""

Doc = dict[str, Any]


def _docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _merge(base: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge for what the overlay patches: maps merge key by key, lists
    of named items (containers, volumes, env) merge by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    named = isinstance(base, list) and isinstance(patch, list)
    if named and all(isinstance(i, dict) and "name" in i for i in [*base, *patch]):
        out_list = [copy.deepcopy(i) for i in base]
        for item in patch:
            at = next((n for n, b in enumerate(out_list) if b["name"] == item["name"]), None)
            if at is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[at] = _merge(out_list[at], item)
        return out_list
    return copy.deepcopy(patch)


def render(kustomization_dir: Path) -> list[Doc]:
    """The objects ``kubectl apply -k DIR`` would apply."""
    (k,) = _docs(kustomization_dir / "kustomization.yaml")
    assert k["kind"] == "Kustomization", k
    objects: list[Doc] = []
    for resource in k["resources"]:
        path = (kustomization_dir / resource).resolve()
        objects += render(path) if path.is_dir() else _docs(path)
    for entry in k.get("patches", []):
        (patch,) = _docs(kustomization_dir / entry["path"])
        target = entry["target"]
        hits = [o for o in objects if (o["kind"], o["metadata"]["name"]) == (target["kind"], target["name"])]
        assert len(hits) == 1, f"patch {entry['path']} targets {target}: {len(hits)} objects match"
        objects[objects.index(hits[0])] = _merge(hits[0], patch)
    if "namespace" in k:
        for obj in objects:
            if obj["kind"] != "Namespace":
                obj.setdefault("metadata", {})["namespace"] = k["namespace"]
    return objects


def one(objects: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in the manifests"
    return found[0]


def container(sts: Doc, name: str = "blazar") -> Doc:
    return next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == name)


BASE = render(DEPLOY)
GPU_RENDERED = render(GPU)


def _validate(obj: Doc, version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path)
        pytest.fail(f"{obj['kind']} {obj['metadata']['name']} at {where}: {exc.message}")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("rendered", ["base", "gpu"])
def test_every_object_is_valid_against_the_kubernetes_schemas(rendered: str, version: str) -> None:
    objects = BASE if rendered == "base" else GPU_RENDERED
    assert {o["kind"] for o in objects} == {"Namespace", "ConfigMap", "Service", "StatefulSet"}
    for obj in objects:
        _validate(obj, version)


def test_the_example_secret_is_valid_and_every_yaml_file_is_used() -> None:
    (secret,) = _docs(DEPLOY / "secret.example.yaml")
    _validate(secret, VERSIONS[-1])
    listed = {
        "kustomization.yaml",
        "secret.example.yaml",
        *yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"],
    }
    assert {p.name for p in DEPLOY.glob("*.yaml")} == listed
    assert {p.name for p in GPU.glob("*.yaml")} == {"kustomization.yaml", "gpu.yaml"}


def test_a_broken_manifest_is_caught() -> None:
    # The check is not vacuous: an unknown field and a wrong type are refused.
    sts = copy.deepcopy(one(BASE, "StatefulSet"))
    container(sts)["livenessprobe"] = container(sts).pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, VERSIONS[-1], strict=True)
    sts = copy.deepcopy(one(BASE, "StatefulSet"))
    sts["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, VERSIONS[-1], strict=True)


def test_the_statefulset_is_governed_by_the_headless_service_and_selects_its_pods() -> None:
    sts = one(BASE, "StatefulSet")
    headless = one(BASE, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert not headless["spec"].get("publishNotReadyAddresses", False)  # only ready pods are peers
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port = next(p for p in container(sts)["ports"] if p["name"] == "http")
    for service in (o for o in BASE if o["kind"] == "Service"):
        assert service["spec"]["selector"].items() <= labels.items(), service["metadata"]["name"]
        (sp,) = service["spec"]["ports"]
        assert sp["targetPort"] == "http" and sp["port"] == port["containerPort"]
    namespace = one(BASE, "Namespace")["metadata"]["name"]
    assert all(o["metadata"].get("namespace") == namespace for o in BASE if o["kind"] != "Namespace")


def _config_toml() -> str:
    sts = one(BASE, "StatefulSet")
    (mount,) = [m for m in container(sts)["volumeMounts"] if m["mountPath"].endswith("/config.toml")]
    volume = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    configmap = one(BASE, "ConfigMap", volume["configMap"]["name"])
    return str(configmap["data"][mount["subPath"]])


def _env(c: Doc) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def test_the_config_sits_in_blazar_home_and_passes_the_daemons_strict_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sts = one(BASE, "StatefulSet")
    blazar = container(sts)
    home = _env(blazar)["BLAZAR_HOME"]
    mounts = {m["mountPath"]: m for m in blazar["volumeMounts"]}
    assert f"{home}/config.toml" in mounts and home in mounts
    claim = next(
        c for c in sts["spec"]["volumeClaimTemplates"] if c["metadata"]["name"] == mounts[home]["name"]
    )
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]  # each replica its own store
    # run/ (this boot's pid file and local token) is never carried over to the next start.
    run = next(
        v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == mounts[f"{home}/run"]["name"]
    )
    assert "emptyDir" in run

    text = _config_toml()
    key_file = tomllib.loads(text)["remotes"][0]["key_file"]
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(text.replace(key_file, str(tmp_path / "peer-key")))
    (tmp_path / "peer-key").write_text(new_secret() + "\n")
    config = load_config(resolve_paths())
    assert config.host == "0.0.0.0"
    (pool,) = config.remotes
    headless = sts["spec"]["serviceName"]
    namespace = one(BASE, "Namespace")["metadata"]["name"]
    assert pool.dns in (headless, f"{headless}.{namespace}", f"{headless}.{namespace}.svc.cluster.local")
    assert pool.port == config.port == container(sts)["ports"][0]["containerPort"]
    assert pool.key is not None and pool.key.startswith("blz-")


def _secret_files(sts: Doc) -> dict[str, tuple[str, str]]:
    """Path in the pod → (Secret name, key in it), for the Secret volumes the pod mounts."""
    spec = sts["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    files: dict[str, tuple[str, str]] = {}
    for c in [*spec["initContainers"], *spec["containers"]]:
        for m in c["volumeMounts"]:
            if m["name"] in secrets:
                assert m.get("readOnly") is True, (c["name"], m)
                for key in _docs(DEPLOY / "secret.example.yaml")[0]["stringData"]:
                    files[f"{m['mountPath']}/{key}"] = (secrets[m["name"]], key)
    return files


def test_the_keys_the_pod_reads_are_the_secrets_keys() -> None:
    sts = one(BASE, "StatefulSet")
    (secret,) = _docs(DEPLOY / "secret.example.yaml")
    files = _secret_files(sts)
    assert {name for name, _ in files.values()} == {secret["metadata"]["name"]}
    read = [
        c["args"][c["args"].index("--secret-file") + 1]
        for c in sts["spec"]["template"]["spec"]["initContainers"]
    ]
    read.append(tomllib.loads(_config_toml())["remotes"][0]["key_file"])
    assert all(path in files for path in read), (read, sorted(files))
    # Every key of the Secret is used, and the peer key is both presented and accepted.
    assert {files[p][1] for p in read} == set(secret["stringData"])
    assert read.count(tomllib.loads(_config_toml())["remotes"][0]["key_file"]) == 2
    for init in sts["spec"]["template"]["spec"]["initContainers"]:
        assert init["args"][:2] == ["keys", "add"] and "--replace" in init["args"]  # every boot
        assert _env(init)["BLAZAR_HOME"] == _env(container(sts))["BLAZAR_HOME"]


def test_the_probes_ask_health_on_the_daemons_port() -> None:
    blazar = container(one(BASE, "StatefulSet"))
    (port,) = blazar["ports"]
    for probe in ("readinessProbe", "livenessProbe"):
        get = blazar[probe]["httpGet"]
        assert get["path"] == "/health" and get["port"] in (port["name"], port["containerPort"])
        assert "httpHeaders" not in get  # the kubelet's plain GET: no key, Host = the pod's IP


def test_gpus_are_asked_for_only_by_the_gpu_overlay() -> None:
    base = container(one(BASE, "StatefulSet"))["resources"]
    assert not any("nvidia.com/gpu" in base.get(k, {}) for k in ("requests", "limits"))
    gpu_sts = one(GPU_RENDERED, "StatefulSet")
    gpu = container(gpu_sts)["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == gpu["requests"]["nvidia.com/gpu"] == "1"
    assert gpu["requests"]["cpu"] == base["requests"]["cpu"]  # merged, not replaced
    # The rest of the pool is the base's: same service, probes, keys and volumes.
    assert container(gpu_sts)["readinessProbe"] == container(one(BASE, "StatefulSet"))["readinessProbe"]
    assert gpu_sts["spec"]["serviceName"] == one(BASE, "StatefulSet")["spec"]["serviceName"]


def test_the_dockerfile_copies_what_exists_and_installs_known_extras() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    copies = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert copies and all((ROOT / src).exists() for srcs in copies for src in srcs)
    extras = next(line for line in dockerfile.splitlines() if line.startswith("ARG EXTRAS="))
    known = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.removeprefix("ARG EXTRAS=").split(",")) <= set(known)
    assert 'ENTRYPOINT ["tini", "--", "blazar"]' in dockerfile
    assert container(one(BASE, "StatefulSet"))["args"][0] == "serve"


@pytest.mark.slow
def test_the_pods_config_serves_and_the_probe_request_is_answered(tmp_path: Path) -> None:
    """The pod's start, on this machine: the init containers' commands import the Secret's keys,
    `blazar serve` runs with the ConfigMap's config.toml (its own port, its peer name pointed
    at this machine), the kubelet's request gets 200, and the peer key works both ways."""
    sts = one(BASE, "StatefulSet")
    home = tmp_path / "home"
    home.mkdir()
    secrets = {key: new_secret() for key in ("peer-key", "api-key")}
    in_pod = {}
    for pod_path, (_, key) in _secret_files(sts).items():
        local = tmp_path / "secret" / key
        local.parent.mkdir(exist_ok=True)
        local.write_text(secrets[key] + "\n")
        in_pod[pod_path] = str(local)

    env = home_env(home)
    for init in sts["spec"]["template"]["spec"]["initContainers"]:
        args = [in_pod.get(a, a) for a in init["args"]]
        for _ in range(2):  # a restarted pod runs them again
            done = subprocess.run(
                [sys.executable, "-m", "blazar", *args], env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr

    port = free_port()
    text = _config_toml()
    doc = tomllib.loads(text)
    assert doc["host"] == "0.0.0.0"
    text = text.replace(f"port = {doc['port']}", f"port = {port}")
    text = text.replace(f'dns = "{doc["remotes"][0]["dns"]}"', 'dns = "localhost"')
    for pod_path, local in in_pod.items():
        text = text.replace(pod_path, local)
    (home / "config.toml").write_text(text)

    daemon = start_daemon(home, port=port)
    try:
        url = f"http://127.0.0.1:{port}"
        # What the kubelet sends: a plain GET, Host = the pod's IP and the port, no key.
        probe = httpx.get(
            f"{url}/health",
            headers={"Host": f"10.244.1.7:{port}", "User-Agent": "kube-probe/1.31", "Accept": "*/*"},
        )
        assert probe.status_code == 200, probe.text
        assert probe.json()["status"] == "ok"
        # Keys are in force: none is refused, the clients' key and the peer key get in.
        assert httpx.get(f"{url}/v1/models").status_code == 401
        for key in secrets.values():
            answer = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert answer.status_code == 200, answer.text
        # The `dns` remote found this daemon, which reads its capacity with the peer key from the
        # file (a refused key would leave the peer down) and knows itself in it: in a pod the
        # headless service's answer holds the pod's own address, never a peer to route to.
        auth = {"Authorization": f"Bearer {secrets['api-key']}"}
        deadline = time.monotonic() + 30
        while True:
            answer = httpx.get(f"{url}/api/peers", headers=auth, timeout=30)
            assert answer.status_code == 200, answer.text
            listed = answer.json()["peers"]
            if any(p["state"] == "self" for p in listed) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert any(p["state"] == "self" and p["name"] == "pool-127.0.0.1" for p in listed), listed
        route = httpx.get(f"{url}/api/route/smollm2-135m", headers=auth, timeout=30).json()
        where = [c["where"] for c in route["candidates"]]
        assert "local" in where and "pool-127.0.0.1" not in where, route
        itself = httpx.post(
            f"{url}/v1/chat/completions",
            headers=auth,
            json={
                "model": "remote:pool-127.0.0.1/smollm2-135m",
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        assert itself.status_code == 400 and itself.json()["error"]["blazar_code"] == "BAD_REQUEST", (
            itself.text
        )
        assert "this daemon itself" in itself.json()["error"]["message"]
    finally:
        daemon.stop()
