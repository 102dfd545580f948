"""Hardened manifests: every workload of every overlay checked against the Kubernetes Pod
Security Standards' "restricted" profile, with exactly the exceptions deploy/README.md lists
and justifies, plus what the profile does not check (read-only root filesystem, read-only host
folders, a NetworkPolicy in front of every metrics port)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import (
    COMPONENTS,
    DEPLOY,
    OVERLAYS,
    built,
    components_of,
    needs_kubectl,
)

README = DEPLOY / "README.md"

# Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards/)
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}  # fmt: skip
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                         "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                         "SYS_CHROOT"}  # fmt: skip
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def restricted_violations(pod: dict[str, Any]) -> set[str]:
    """The names of the restricted profile's checks (baseline's included) a pod spec fails."""
    spec = pod["spec"]
    psc = spec.get("securityContext") or {}
    containers = [*spec.get("initContainers", []), *spec["containers"]]
    failed: set[str] = set()

    def every(field: str, ok: Any) -> bool:
        return all(ok((c.get("securityContext") or {}).get(field)) for c in containers)

    # baseline
    if any(spec.get(h) for h in ("hostNetwork", "hostPID", "hostIPC")):
        failed.add("hostNamespaces")
    if not every("privileged", lambda v: not v):
        failed.add("privileged")
    if any("hostPath" in v for v in spec.get("volumes", [])):
        failed.add("hostPathVolumes")
    if any(p.get("hostPort") for c in containers for p in c.get("ports", [])):
        failed.add("hostPorts")
    if not every("procMount", lambda v: v in (None, "Default")):
        failed.add("procMount")
    if any(s["name"] not in SAFE_SYSCTLS for s in psc.get("sysctls", [])):
        failed.add("sysctls")
    for context in [psc, *(c.get("securityContext") or {} for c in containers)]:
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            failed.add("hostProcess")
        se = context.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            failed.add("seLinux")
        if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
            failed.add("appArmor")
    # restricted
    if any(not (set(v) - {"name"}) <= RESTRICTED_VOLUMES for v in spec.get("volumes", [])):
        failed.add("volumeTypes")
    if not every("allowPrivilegeEscalation", lambda v: v is False):
        failed.add("allowPrivilegeEscalation")
    pod_non_root = psc.get("runAsNonRoot") is True
    if not all(
        (c.get("securityContext") or {}).get("runAsNonRoot", pod_non_root) is True
        for c in containers
    ):
        failed.add("runAsNonRoot")
    if psc.get("runAsUser") == 0 or not every("runAsUser", lambda v: v != 0):
        failed.add("runAsUser")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for c in containers:
        kind = ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
        if (kind or pod_seccomp) not in ("RuntimeDefault", "Localhost"):
            failed.add("seccompProfile")
    for c in containers:
        caps = (c.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in caps.get("drop", []) or not set(caps.get("add", [])) <= {
            "NET_BIND_SERVICE"
        }:
            failed.add("capabilities")
        if not set(caps.get("add", [])) <= BASELINE_CAPABILITIES:
            failed.add("capabilities")
    return failed


def documented_exceptions() -> dict[tuple[str, str], set[str]]:
    """(workload, overlay folder) -> the checks deploy/README.md lets it fail."""
    section = README.read_text().split("## Pod Security exceptions", 1)[1].split("\n## ", 1)[0]
    out: dict[tuple[str, str], set[str]] = {}
    rows = re.findall(r"^\| `(\w+)` \| `([\w-]+)` \| ([^|]+) \| [^|]+ \|$", section, re.M)
    assert rows, "deploy/README.md has no Pod Security exceptions table"
    for check, workload, where in rows:
        where = where.strip()
        if where.startswith("all but "):
            excluded = {n.strip(" `") for n in where[8:].split(",")}
            folders = [f for f in OVERLAYS if not excluded & set(components_of(f))]
        else:
            named = {n.strip(" `") for n in where.split(",")}
            assert named <= {"base", *COMPONENTS}, f"README names an unknown component {named}"
            folders = [
                f for f in OVERLAYS if named & {*components_of(f), "base" if f == "base" else ""}
            ]
        for folder in folders:
            out.setdefault((workload, folder), set()).add(check)
    return out


def workloads(folder: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (
            d["metadata"]["name"],
            d["spec"]["jobTemplate"]["spec"]["template"]
            if d["kind"] == "CronJob"
            else d["spec"]["template"],
        )
        for d in built(folder)
        if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job", "CronJob")
    ]


def test_the_checker_catches_what_the_profile_forbids() -> None:
    good = {
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
        }
    }  # fmt: skip
    assert restricted_violations(good) == set()
    bad = {
        "spec": {
            "hostPID": True,
            "securityContext": {"runAsUser": 0},
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
            "containers": [{"name": "c", "ports": [{"containerPort": 1, "hostPort": 1}],
                            "securityContext": {"privileged": True,
                                                "capabilities": {"add": ["SYS_ADMIN"]}}}],
        }
    }  # fmt: skip
    assert restricted_violations(bad) == {
        "hostNamespaces", "privileged", "hostPathVolumes", "hostPorts", "volumeTypes",
        "allowPrivilegeEscalation", "runAsNonRoot", "runAsUser", "seccompProfile", "capabilities",
    }  # fmt: skip


@needs_kubectl
@pytest.mark.parametrize("folder", OVERLAYS)
def test_workloads_meet_the_restricted_profile_but_for_the_documented_exceptions(
    folder: str,
) -> None:
    allowed = documented_exceptions()
    for name, pod in workloads(folder):
        assert restricted_violations(pod) == allowed.get((name, folder), set()), (
            f"{folder}: {name} fails {sorted(restricted_violations(pod))}; deploy/README.md "
            f"allows {sorted(allowed.get((name, folder), set()))}"
        )


@needs_kubectl
def test_the_restricted_overlay_has_no_exception_and_enforces_the_profile() -> None:
    assert all(not restricted_violations(pod) for _n, pod in workloads("components/restricted"))
    namespace = next(d for d in built("components/restricted") if d["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    exporter = dict(workloads("components/restricted"))["gpu-exporter"]
    args = exporter["spec"]["containers"][0]["args"]
    assert "--pod-resources-socket=" in args  # attribution off: the socket is root-only
    from gpuquota.exporter.cli import build_parser

    assert build_parser().parse_args(args).pod_resources_socket == ""


@needs_kubectl
@pytest.mark.parametrize("folder", OVERLAYS)
def test_beyond_the_profile_read_only_roots_and_host_folders(folder: str) -> None:
    for name, pod in workloads(folder):
        spec = pod["spec"]
        assert (spec.get("securityContext") or {}).get("seccompProfile") == {
            "type": "RuntimeDefault"
        }, name
        host = {
            v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v
        }
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, (folder, name)
            assert context["capabilities"] == {"drop": ["ALL"]}, (folder, name)
            assert context.get("privileged", False) is False
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in host:
                    continue
                # writable only where the device plugin creates its sockets (pod-usage reads
                # the kubelet's device checkpoint in the same folder, read-only)
                writable = mount["name"] == "device-plugins"
                if writable:
                    assert "device-plugin" in components_of(folder), (folder, mount)
                    assert host[mount["name"]] == "/var/lib/kubelet/device-plugins"
                assert mount.get("readOnly", False) is not writable, (folder, mount)
        paths = set(host.values())
        if not {"device-plugin", "pod-usage"} & set(components_of(folder)):
            assert "/var/lib/kubelet/device-plugins" not in paths, folder
        assert paths <= {"/var/lib/kubelet/pod-resources", "/var/lib/kubelet/device-plugins"}


@needs_kubectl
@pytest.mark.parametrize("folder", OVERLAYS)
def test_only_prometheus_reaches_the_metrics_ports(folder: str) -> None:
    docs = built(folder)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for name, pod in workloads(folder):
        labels = pod["metadata"]["labels"]
        selecting = [
            p for p in policies
            if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        ]  # fmt: skip
        assert len(selecting) == 1, f"{folder}: {name} has no NetworkPolicy"
        spec = selecting[0]["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for rule in spec["ingress"]:
            assert [p["port"] for p in rule["ports"]] == ["metrics"] and "metrics" in ports
            assert rule["from"] == [
                {"namespaceSelector": {},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
            ]  # fmt: skip


@needs_kubectl
def test_tls_auth_overlay_serves_from_the_secrets_the_operator_creates(tmp_path: Path) -> None:
    """Issue 28: the build refers to Secrets (nothing generated into the tree, so a fresh
    clone builds); the mounted files are the keys generate.py writes, and they make a web
    config the exporter accepts."""
    import subprocess
    import sys

    from gpuquota.exporter.expose.webconfig import load
    from tests.deploy.manifests import DEPLOY

    docs = built("components/tls-auth")
    assert not [d for d in docs if d["kind"] == "Secret"]
    pod = dict(workloads("components/tls-auth"))["gpu-exporter"]
    container = pod["spec"]["containers"][0]
    flag = next(a for a in container["args"] if a.startswith("--web.config.file="))
    mount = next(m for m in container["volumeMounts"] if m["name"] == "web")
    assert flag.split("=", 1)[1].startswith(mount["mountPath"] + "/") and mount["readOnly"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "web")
    mounted = {
        source["secret"]["name"]: {i["key"]: i["path"] for i in source["secret"]["items"]}
        for source in volume["projected"]["sources"]
    }
    assert mounted == {
        "gpu-exporter-tls": {"tls.crt": "tls.crt", "tls.key": "tls.key"},
        "gpu-exporter-basic-auth": {"web-config.yml": "web-config.yml"},  # not the password
    }
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    # what generate.py writes is a web config the exporter accepts: TLS and a bcrypt user
    out = tmp_path / "secrets"
    made = subprocess.run(
        [sys.executable, str(DEPLOY / "components/tls-auth/generate.py"), "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert {p.name for p in out.iterdir()} == {"tls.crt", "tls.key", "ca.crt", "username",
                                               "password", "web-config.yml"}  # fmt: skip
    assert "create secret generic gpu-exporter-tls" in made.stdout
    config = load(out / "web-config.yml")
    assert config.ssl_context is not None and list(config.users) == ["prometheus"]
    assert config.users["prometheus"].startswith(b"$2b$12$")
