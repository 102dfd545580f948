"""The cluster's name is one of the production example's settings and reaches every program
that names a cluster (issue 38): the controller and its ledger store it with every row, the
monthly report bills only it. Two clusters installed from the example into one database then
stay apart, each with its own name."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import yaml

from gpuquota.quota.cli import build_parser
from gpuquota.quota.controller.cli import ledger_settings
from gpuquota.quota.options import DEFAULT_CLUSTER, ENV_CLUSTER, ENV_PROMETHEUS_CLUSTER_LABEL
from gpuquota.quota.promscope import Scope
from tests.deploy.manifests import DEPLOY, built, expanded, find, needs_kubectl
from tests.deploy.test_deploy import pod_containers

SECRET = "from-a-secret"  # what a secretKeyRef resolves to here: no cluster name comes from one


def environment(container: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, str]:
    """The container's variables as the kubelet sets them: envFrom ConfigMaps, then env."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(find(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container.get("env", []):
        env[var["name"]] = var.get("value", SECRET)
    return env


def parsed(
    container: dict[str, Any], docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> argparse.Namespace:
    """The container's ``gpuquota`` command line as our CLI reads it in that environment."""
    env = environment(container, docs)
    monkeypatch.delenv(ENV_CLUSTER, raising=False)
    monkeypatch.delenv(ENV_PROMETHEUS_CLUSTER_LABEL, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = expanded([*container["command"][1:], *container.get("args", [])], env)
    return build_parser()[0].parse_args(argv)


@needs_kubectl
def test_the_production_example_names_its_cluster_and_every_program_uses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a setting of the example, not of the base: the base's name is the default
    example = yaml.safe_load((DEPLOY / "examples/production/kustomization.yaml").read_text())
    assert any(
        p["target"] == {"kind": "ConfigMap", "name": "gpuquota-controller"}
        and "/data/GPUQUOTA_CLUSTER" in p["patch"]
        for p in example["patches"]
    ), "the production example has no cluster name setting"
    docs = built("examples/production")
    cluster = find(docs, "ConfigMap", "gpuquota-controller")["data"][ENV_CLUSTER]
    assert cluster != DEFAULT_CLUSTER
    settings = find(docs, "ConfigMap", "gpuquota-controller")["data"]
    assert settings[ENV_PROMETHEUS_CLUSTER_LABEL] == ""  # off unless Prometheus holds several
    settings[ENV_PROMETHEUS_CLUSTER_LABEL] = "cluster"  # as an operator sets setting 5
    labels = {}
    named = {}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "CronJob", "DaemonSet"):
            continue
        for container in pod_containers(doc):
            if container["command"][0] != "gpuquota":
                continue
            args = parsed(container, docs, monkeypatch)
            if hasattr(args, "cluster"):  # every command that names a cluster
                named[(doc["metadata"]["name"], container["name"])] = args.cluster
            if hasattr(args, "prometheus_cluster_label"):
                labels[(doc["metadata"]["name"], container["name"])] = args.prometheus_cluster_label
            if hasattr(args, "ledger_prometheus_url"):  # the ledger's queries: this cluster's
                ledger = ledger_settings(args)
                assert ledger is not None and ledger.scope(args.cluster) == Scope(
                    "cluster", cluster
                )
    # the controller (its ledger runs in it, with its --cluster) and the monthly report
    assert named == {
        ("gpuquota-controller", "controller"): cluster,
        ("gpuquota-report", "report"): cluster,
    }
    # setting 5 reaches the ledger (and the report's --prometheus, were it given one)
    assert labels == {
        ("gpuquota-controller", "controller"): "cluster",
        ("gpuquota-report", "report"): "cluster",
    }
