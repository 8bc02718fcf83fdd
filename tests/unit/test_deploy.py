"""deploy/ (issue 14, item 9) checked offline: the Kubernetes manifests against the API's
schemas (kubernetes-validate, strict), the systemd units with systemd-analyze, the haproxy
sample with haproxy -c, and every AENV_* variable they set is one aenv reads."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from aenv import config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.31.0"
KNOWN_ENV = {config.ENV_PREFIX + k for k in (*config._SIMPLE_ENV, *config._CLUSTER_ENV)} | {
    "AENV_ETCD_ENDPOINTS", "AENV_CONFIG"}  # fmt: skip


def _docs() -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    out = []
    for f in sorted((DEPLOY / "k8s").glob("*.yaml")):
        out += [(f.name, d) for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def test_the_manifests_are_valid_kubernetes_objects() -> None:
    docs = _docs()
    assert docs
    for _, doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in docs}
    assert {("DaemonSet", "aenv-node"), ("Deployment", "aenv-gateway"),
            ("Service", "aenv-gateway"), ("StatefulSet", "aenv-etcd"),
            ("PersistentVolumeClaim", "aenv-volumes")} <= kinds


def test_the_node_runs_privileged_on_the_host_network_with_kvm_and_gateways_are_many() -> None:
    by = {(d["kind"], d["metadata"]["name"]): d for _, d in _docs()}
    node = by[("DaemonSet", "aenv-node")]["spec"]["template"]["spec"]
    assert node["hostNetwork"] is True
    [c] = node["containers"]
    assert c["securityContext"]["privileged"] is True
    assert "/dev/kvm" in {m["mountPath"] for m in c["volumeMounts"]}
    assert c["command"][-1] == "server"
    gw = by[("Deployment", "aenv-gateway")]["spec"]
    assert gw["replicas"] >= 2
    assert gw["template"]["spec"]["containers"][0]["command"][-1] == "gateway"
    assert by[("StatefulSet", "aenv-etcd")]["spec"]["replicas"] == 3


def _env_names() -> set[str]:
    names: set[str] = set()
    for f in DEPLOY.rglob("*"):
        if f.is_file():
            names |= set(re.findall(r"\b(AENV_[A-Z0-9_]+)\b", f.read_text()))
    return names


def test_every_aenv_variable_they_set_is_one_aenv_reads() -> None:
    names = _env_names()
    assert {"AENV_ETCD_ENDPOINTS", "AENV_CLUSTER_TOKEN", "AENV_TLS_CERT_FILE"} <= names
    assert names <= KNOWN_ENV, sorted(names - KNOWN_ENV)


# Skips only off CI: scripts/install-host-deps.sh installs both (systemd, haproxy), and a
# skip on CI fails (docs/testing.md, "Skips").
@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="no systemd-analyze (scripts/install-host-deps.sh: systemd)")
def test_the_systemd_units_verify(tmp_path: Path) -> None:
    aenv = Path(sys.executable).with_name("aenv")
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert {u.name for u in units} >= {"aenv-node.service", "aenv-gateway.service"}
    for u in units:  # where this checkout's aenv is, not /opt/aenv
        (tmp_path / u.name).write_text(u.read_text().replace("/opt/aenv/.venv/bin/aenv", str(aenv)))
    r = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / u.name) for u in units)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    for u in units:
        m = re.search(r"^ExecStart=/opt/aenv/\.venv/bin/aenv (\w+)", u.read_text(), re.M)
        if m:  # an aenv command that exists
            assert subprocess.run([str(aenv), m.group(1), "--help"], capture_output=True,
                                  timeout=60).returncode == 0  # fmt: skip


@pytest.mark.skipif(shutil.which("haproxy") is None,
                    reason="no haproxy (scripts/install-host-deps.sh)")
def test_the_haproxy_sample_parses() -> None:
    r = subprocess.run(["haproxy", "-c", "-f", str(DEPLOY / "systemd" / "haproxy.cfg.example")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
