"""Kubernetes: every manifest in launch/k8s/ against Kubernetes' own schemas, offline, and against zmqrl.

``kubernetes-validate --strict`` checks each resource (unknown fields included) against the
OpenAPI schemas it ships; the kustomization is rendered by ``kubectl kustomize`` where kubectl is
installed (the ConfigMap and Secret generators included). Beyond the schemas: the config the
ConfigMap carries loads, its actor count matches the hosts' replicas, the containers' arguments
parse with zmqrl's own command line, ports and mounts agree with the config, and the image's
entrypoint really derives actor ids from a pod's ordinal and installs the keys with the right modes.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from procs import REPO
from zmqrl import config as config_mod
from zmqrl.cli.app import build_parser
from zmqrl.wire.security import keygen

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (dev extras)")

K8S = REPO / "launch" / "k8s"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests are meant for (StatefulSet pod names as ordinals)


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def resources() -> list[dict[str, Any]]:
    return [doc for name in kustomization()["resources"] for doc in documents(K8S / name)]


def by_kind(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name))


def validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def container(statefulset: dict[str, Any]) -> dict[str, Any]:
    (only,) = statefulset["spec"]["template"]["spec"]["containers"]
    return only


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def mounts(statefulset: dict[str, Any]) -> dict[str, str]:
    """``{volume name: mount path}`` of the only container."""
    return {m["name"]: m["mountPath"] for m in container(statefulset)["volumeMounts"]}


def test_every_manifest_passes_strict_schema_validation() -> None:
    files = kustomization()["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name not in ("kustomization.yaml", "config.yaml"))
    assert sorted(files) == on_disk, f"kustomization.yaml lists {files}; the directory has {on_disk}"
    docs = resources()
    assert sorted(d["kind"] for d in docs) == ["Service", "Service", "StatefulSet", "StatefulSet"], docs
    for doc in docs:
        validate(doc)
    # The check can fail: a misspelt field is refused.
    broken = yaml.safe_load(yaml.safe_dump(by_kind(docs, "StatefulSet", "zmqrl-hosts")))
    broken["spec"]["template"]["spec"]["containers"][0]["argz"] = ["host"]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


@pytest.mark.slow
def test_kustomization_renders_and_validates(tmp_path: Path) -> None:
    """``kubectl kustomize`` on a copy holding keys made by ``zmqrl keygen``, every rendered document validated."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (the manifests themselves are validated in the test above)")
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("keys"))
    keygen(copy / "keys", "server")
    done = subprocess.run([kubectl, "kustomize", str(copy)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "Secret", "Service", "Service", "StatefulSet", "StatefulSet"], kinds
    for doc in docs:
        validate(doc)
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "zmqrl", doc["metadata"]
    cm, secret = by_kind(docs, "ConfigMap", "zmqrl-config"), by_kind(docs, "Secret", "zmqrl-keys")
    assert cm["data"]["config.yaml"] == (K8S / "config.yaml").read_text()
    assert sorted(secret["data"]) == ["server.key", "server.key_secret"], sorted(secret["data"])
    for sts in (by_kind(docs, "StatefulSet", "zmqrl-head"), by_kind(docs, "StatefulSet", "zmqrl-hosts")):
        volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]  # the generated (hashed) names
        assert volumes["keys-secret"]["secret"]["secretName"] == secret["metadata"]["name"]


def test_manifests_agree_with_zmqrl(tmp_path: Path) -> None:
    docs = resources()
    head, hosts = by_kind(docs, "StatefulSet", "zmqrl-head"), by_kind(docs, "StatefulSet", "zmqrl-hosts")
    head_svc, hosts_svc = by_kind(docs, "Service", "zmqrl-head"), by_kind(docs, "Service", "zmqrl-hosts")
    cfg = config_mod.load(K8S / "config.yaml")

    # Headless Services governing the StatefulSets; the head's reachable on the config's ports.
    assert head_svc["spec"]["clusterIP"] == "None" and hosts_svc["spec"]["clusterIP"] == "None"
    assert head["spec"]["serviceName"] == "zmqrl-head" and hosts["spec"]["serviceName"] == "zmqrl-hosts"
    assert head["spec"]["replicas"] == 1
    ports = {"data": cfg.net.data_port, "model": cfg.net.model_port, "snapshot": cfg.net.snapshot_port}
    assert {p["name"]: p["port"] for p in head_svc["spec"]["ports"]} == ports
    assert {p["name"]: p["containerPort"] for p in container(head)["ports"]} == ports
    assert cfg.net.bind_host == "0.0.0.0" and cfg.net.security == "curve"

    # Actor ids: replicas x actors per host = actor.num_actors.
    per_host = int(env(container(hosts))["ZMQRL_ACTORS_PER_HOST"])
    assert hosts["spec"]["replicas"] * per_host == cfg.actor.num_actors, (hosts["spec"]["replicas"], per_host)

    # The containers' arguments are what zmqrl's command line takes (the host's with what the entrypoint adds).
    parser, _ = build_parser()
    head_args = parser.parse_args(container(head)["args"])
    assert head_args.command == "head" and head_args.auto_resume and head_args.run_dir.startswith(
        mounts(head)["runs"])
    host_args = parser.parse_args(container(hosts)["args"] + ["--actors", str(per_host), "--first-id", "2",
                                                              "--name", "zmqrl-hosts-1"])
    assert host_args.command == "host"
    assert host_args.learner == f"{head['metadata']['name']}-0.{head_svc['metadata']['name']}", host_args.learner
    assert head_args.config == host_args.config == f"{mounts(head)['config']}/config.yaml"
    assert head["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "runs"

    # Keys: the entrypoint copies the Secret's mount to the config's keys_dir.
    for sts in (head, hosts):
        assert mounts(sts)["keys"] == cfg.net.keys_dir, mounts(sts)
        assert env(container(sts))["ZMQRL_KEYS_SECRET"] == mounts(sts)["keys-secret"]
    assert {e["name"] for e in container(hosts)["env"]} >= {"POD_NAME"}


def test_dockerfile_installs_cpu_torch_first_then_zmqrl() -> None:
    lines = [line.strip() for line in (K8S / "Dockerfile").read_text().splitlines()]
    text = "\n".join(lines)
    torch_at = text.index('"torch==2.13.0"')
    assert "--index-url https://download.pytorch.org/whl/cpu" in text[text.rfind("RUN", 0, torch_at):torch_at]
    assert torch_at < text.index("RUN pip install --no-cache-dir --disable-pip-version-check . ")
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), f"Dockerfile copies {source}, which the checkout lacks"
    assert 'ENTRYPOINT ["tini", "--", "zmqrl-entrypoint"]' in text
    assert "launch/k8s/entrypoint.sh /usr/local/bin/zmqrl-entrypoint" in text


@pytest.mark.slow
def test_entrypoint_derives_ids_and_installs_keys(tmp_path: Path) -> None:
    """The real entrypoint, the real ``zmqrl host``: pod zmqrl-hosts-1 with 2 actors per host gets ids 2..3,
    which actor.num_actors=3 refuses (exit 2 before anything starts); the keys land with modes 0600/0644."""
    secret = tmp_path / "secret"
    keygen(secret, "server")
    for path in secret.iterdir():
        if path.is_file():
            path.chmod(0o440)  # as a Secret volume with defaultMode 0440 shows them
    keys = tmp_path / "keys"
    zmqrl = Path(sys.executable).with_name("zmqrl")
    base = {**os.environ, "ZMQRL_KEYS_SECRET": str(secret), "ZMQRL_KEYS_DIR": str(keys),
            "ZMQRL_ACTORS_PER_HOST": "2", **({"ZMQRL": str(zmqrl)} if zmqrl.exists() else {})}
    argv = ["sh", str(K8S / "entrypoint.sh"), "host", str(REPO / "configs" / "cartpole_dqn.yaml"), "--learner",
            "127.0.0.1", "--run-dir", str(tmp_path / "run"), "--set", "actor.num_actors=3"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**base, "POD_NAME": "zmqrl-hosts-1"})
    assert done.returncode == 2, done
    assert "actor ids 2..3 must be below actor.num_actors=3" in done.stderr, done.stderr
    assert stat.S_IMODE((keys / "server.key_secret").stat().st_mode) == 0o600
    assert stat.S_IMODE((keys / "server.key").stat().st_mode) == 0o644
    assert (keys / "server.key_secret").read_bytes() == (secret / "server.key_secret").read_bytes()

    bad = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**base, "POD_NAME": "zmqrl-hosts"})
    assert bad.returncode == 2 and "cannot read a StatefulSet ordinal" in bad.stderr, bad


def test_the_cluster_config_is_the_cartpole_config_with_a_cluster_net_section() -> None:
    """launch/k8s/config.yaml drifted from configs/cartpole_dqn.yaml once ([64, 64], lr 1e-3): every key but
    the ones a cluster needs must stay the shipped config's."""
    cluster, shipped = config_mod.to_dict(config_mod.load(K8S / "config.yaml")), \
        config_mod.to_dict(config_mod.load(REPO / "configs" / "cartpole_dqn.yaml"))
    for section in (cluster, shipped):
        section.pop("net")
        section["actor"].pop("num_actors")
    assert cluster == shipped
