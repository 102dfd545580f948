"""Prometheus's configuration for tools/real-cluster: one scrape job per ServiceMonitor endpoint
in the applied manifests, rendered by the Prometheus Operator's rules (issue 38).

Debian's Prometheus is built without Kubernetes service discovery, so ``sd`` stands in for it:
it lists the EndpointSlices, Services and Pods every few seconds and writes file_sd targets
carrying the same ``__meta_kubernetes_*`` labels Prometheus's ``role: endpointslice`` gives;
the Operator's relabelings then run on them unchanged.

The Operator is not run here; its rendering is (the facts come from its generator's golden
files, ``pkg/prometheus/testdata/*ServiceMonitor*.golden``): EndpointSlice discovery in the
monitor's namespace; keep by the Service's label selector and the endpoint's port name; the
target labels ``namespace``, ``service``, ``pod``, ``container``, ``endpoint`` and ``job`` (the
Service's name, or the ``jobLabel``'s value); ``honor_labels`` only when the endpoint says
``honorLabels: true``; the endpoint's own relabelings after those; TLS and basic auth from the
Secrets it names. With ``honor_labels: false`` a scraped ``namespace`` or ``pod`` label becomes
``exported_namespace`` / ``exported_pod``: what issue 38 item 1 is about, and what the checks see.

    python tools/real_cluster_prom.py config --manifests applied.yaml --secrets DIR --sd-dir D
    python tools/real_cluster_prom.py sd --kubeconfig KC --sd-dir D --namespace gpuquota
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml


def label_name(key: str) -> str:
    """A Kubernetes label key as Prometheus's meta label suffix."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def endpoint_job(monitor: dict[str, Any], index: int, endpoint: dict[str, Any], secrets: Path, sd_dir: Path) -> dict[str, Any]:  # fmt: skip
    meta, spec = monitor["metadata"], monitor["spec"]
    namespace = meta["namespace"]
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
    ]
    for key, value in sorted(spec.get("selector", {}).get("matchLabels", {}).items()):
        name = label_name(key)
        relabel.append({
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_service_label_{name}",
                              f"__meta_kubernetes_service_labelpresent_{name}"],
            "regex": f"({value});true",
        })  # fmt: skip
    relabel.append({
        "action": "keep",
        "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
        "regex": endpoint["port"],
    })  # fmt: skip
    for kind, target in (("Node", "node"), ("Pod", "pod")):
        relabel.append({
            "source_labels": ["__meta_kubernetes_endpointslice_address_target_kind",
                              "__meta_kubernetes_endpointslice_address_target_name"],
            "separator": ";", "regex": f"{kind};(.*)", "replacement": "${1}",
            "target_label": target,
        })  # fmt: skip
    relabel += [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
         "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
         "replacement": "${1}"},
    ]  # fmt: skip
    if spec.get("jobLabel"):
        relabel.append({
            "source_labels": [f"__meta_kubernetes_service_label_{label_name(spec['jobLabel'])}"],
            "target_label": "job", "regex": "(.+)", "replacement": "${1}",
        })  # fmt: skip
    relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    for rule in endpoint.get("relabelings", []):
        relabel.append(
            {
                {"sourceLabels": "source_labels", "targetLabel": "target_label"}.get(k, k): v
                for k, v in rule.items()
            }
        )
    job: dict[str, Any] = {
        "job_name": f"serviceMonitor/{namespace}/{meta['name']}/{index}",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        # kubernetes_sd_configs: [{role: endpointslice, namespaces: {names: [namespace]}}]
        "file_sd_configs": [
            {"files": [str(sd_dir / f"{namespace}.json")], "refresh_interval": "5s"}
        ],
        "scrape_interval": endpoint.get("interval", "30s"),
        "scheme": endpoint.get("scheme", "http"),
        "relabel_configs": relabel,
    }
    tls = endpoint.get("tlsConfig")
    if tls:
        job["tls_config"] = {"server_name": tls.get("serverName", "")}
        if "ca" in tls:
            job["tls_config"]["ca_file"] = str(secrets / tls["ca"]["secret"]["key"])
    auth = endpoint.get("basicAuth")
    if auth:
        job["basic_auth"] = {
            "username": (secrets / auth["username"]["key"]).read_text().strip(),
            "password_file": str(secrets / auth["password"]["key"]),
        }
    return job


def targets(namespace: str, kubeconfig: str) -> list[dict[str, Any]]:
    """What Prometheus's endpointslice discovery gives for one namespace."""
    from kubernetes import client, config

    api = client.ApiClient(config.new_client_from_config(kubeconfig).configuration)
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    services = {s.metadata.name: s for s in core.list_namespaced_service(namespace).items}
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
    out = []
    for eps in discovery.list_namespaced_endpoint_slice(namespace).items:
        service = services.get((eps.metadata.labels or {}).get("kubernetes.io/service-name", ""))
        if service is None:
            continue
        common = {"__meta_kubernetes_namespace": namespace,
                  "__meta_kubernetes_service_name": service.metadata.name}  # fmt: skip
        for key, value in (service.metadata.labels or {}).items():
            common[f"__meta_kubernetes_service_label_{label_name(key)}"] = value
            common[f"__meta_kubernetes_service_labelpresent_{label_name(key)}"] = "true"
        for endpoint in eps.endpoints or []:
            ref = endpoint.target_ref
            for port in eps.ports or []:
                labels = dict(common)
                labels["__meta_kubernetes_endpointslice_port_name"] = port.name or ""
                labels["__meta_kubernetes_endpointslice_endpoint_conditions_ready"] = str(
                    bool(endpoint.conditions and endpoint.conditions.ready)
                ).lower()
                if ref is not None:
                    labels["__meta_kubernetes_endpointslice_address_target_kind"] = ref.kind
                    labels["__meta_kubernetes_endpointslice_address_target_name"] = ref.name
                    pod = pods.get(ref.name) if ref.kind == "Pod" else None
                    if pod is not None:
                        labels["__meta_kubernetes_pod_name"] = pod.metadata.name
                        labels["__meta_kubernetes_pod_node_name"] = pod.spec.node_name or ""
                        labels["__meta_kubernetes_pod_phase"] = pod.status.phase or ""
                        for container in pod.spec.containers:
                            if any(p.container_port == port.port for p in container.ports or []):
                                labels["__meta_kubernetes_pod_container_name"] = container.name
                for address in endpoint.addresses:
                    out.append({"targets": [f"{address}:{port.port}"], "labels": labels})
    return out


def sd_loop(kubeconfig: str, sd_dir: Path, namespaces: list[str]) -> None:
    sd_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for namespace in namespaces:
            try:
                found = targets(namespace, kubeconfig)
            except Exception as error:  # the API server restarting: keep the last file
                print(f"sd: {namespace}: {error}", file=sys.stderr, flush=True)
                continue
            tmp = sd_dir / f".{namespace}.json.tmp"
            tmp.write_text(json.dumps(found, indent=1, sort_keys=True))
            tmp.replace(sd_dir / f"{namespace}.json")
        time.sleep(3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("config", "sd"))
    parser.add_argument("--manifests", type=Path)
    parser.add_argument("--secrets", type=Path, help="the Secrets' files")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--sd-dir", type=Path, required=True)
    parser.add_argument("--namespace", action="append", default=[])
    args = parser.parse_args(argv)
    if args.action == "sd":
        sd_loop(args.kubeconfig, args.sd_dir, args.namespace or ["gpuquota"])
        return 0
    jobs = []
    for doc in yaml.safe_load_all(args.manifests.read_text()):
        if doc and doc.get("kind") == "ServiceMonitor":
            for index, endpoint in enumerate(doc["spec"].get("endpoints", [])):
                jobs.append(endpoint_job(doc, index, endpoint, args.secrets, args.sd_dir))
    if not jobs:
        print("real_cluster_prom: no ServiceMonitor in the manifests", file=sys.stderr)
        return 1
    config = {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
              "scrape_configs": jobs}  # fmt: skip
    yaml.safe_dump(config, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
