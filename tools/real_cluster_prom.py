"""Prometheus's configuration for tools/real-cluster, kept current as pods come and go: the
scrape jobs the Prometheus Operator renders for the applied ServiceMonitors (issue 38).

The jobs come from ``gpuquota.sim.promoperator.render`` (the Operator's rules, checked against its golden
files in make test), with the Secrets they name read from the cluster as the Operator reads
them. Debian's Prometheus is built without Kubernetes service discovery, so this loop stands in
for it: every few seconds it lists the monitors' namespace's EndpointSlices and Pods, hands
every address to every job as the Kubernetes discovery would (``gpuquota.sim.promoperator.on_this_machine``:
static targets carrying the ``__meta_kubernetes_*`` labels), and, when that changed, rewrites
the configuration and asks Prometheus to reload it. The Operator's relabelings then select and
label the targets unchanged.

    python tools/real_cluster_prom.py --manifests applied.yaml --kubeconfig KC --out DIR \
        --reload http://127.0.0.1:19090/-/reload [--once]
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from gpuquota.sim import promoperator  # the repository's venv runs this (tools/real-cluster)


def secrets(core: client.CoreV1Api, namespace: str) -> dict[str, dict[str, bytes]]:
    import base64

    out: dict[str, dict[str, bytes]] = {}
    for secret in core.list_namespaced_secret(namespace).items:
        out[secret.metadata.name] = {
            key: base64.b64decode(value) for key, value in (secret.data or {}).items()
        }
    return out


def targets(core: client.CoreV1Api, namespace: str) -> list[promoperator.Target]:
    """Every pod-backed address of every Service in the namespace, as discovery gives them."""
    discovery = client.DiscoveryV1Api(core.api_client)
    services = {s.metadata.name: s for s in core.list_namespaced_service(namespace).items}
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
    out = []
    for eps in discovery.list_namespaced_endpoint_slice(namespace).items:
        name = (eps.metadata.labels or {}).get("kubernetes.io/service-name", "")
        service = services.get(name)
        if service is None:
            continue
        svc = {"metadata": {"namespace": namespace, "name": name,
                            "labels": dict(service.metadata.labels or {})}}  # fmt: skip
        for endpoint in eps.endpoints or []:
            ref = endpoint.target_ref
            pod = pods.get(ref.name) if ref is not None and ref.kind == "Pod" else None
            if pod is None:
                continue
            for port in eps.ports or []:
                container = next(
                    (c.name for c in pod.spec.containers
                     if any(p.container_port == port.port for p in c.ports or [])),
                    "",
                )  # fmt: skip
                for address in endpoint.addresses:
                    out.append(promoperator.Target(
                        address=f"{address}:{port.port}", service=svc, port_name=port.name or "",
                        pod=pod.metadata.name, container=container,
                        node=pod.spec.node_name or "", phase=pod.status.phase or "Pending",
                    ))  # fmt: skip
    return out


def render(manifests: list[dict[str, Any]], core: client.CoreV1Api, out: Path) -> str:
    namespaces = {d["metadata"]["namespace"] for d in manifests if d.get("kind") == "ServiceMonitor"}  # fmt: skip
    if len(namespaces) != 1:
        raise SystemExit(f"real_cluster_prom: monitors in {sorted(namespaces)}; one namespace expected")  # fmt: skip
    (namespace,) = namespaces
    rendered = promoperator.render(manifests, secrets(core, namespace))
    found = targets(core, namespace)
    jobs = promoperator.on_this_machine(
        rendered, {job["job_name"]: found for job in rendered.scrape_configs}, out / "certs"
    )
    config_doc = {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
                  "scrape_configs": jobs}  # fmt: skip
    return yaml.safe_dump(config_doc, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifests", type=Path, required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--out", type=Path, required=True, help="prometheus.yml and certs/ here")
    parser.add_argument("--reload", help="Prometheus's /-/reload URL, POSTed after a change")
    parser.add_argument("--once", action="store_true", help="write the configuration and exit")
    args = parser.parse_args(argv)
    manifests = [d for d in yaml.safe_load_all(args.manifests.read_text()) if d]
    core = client.CoreV1Api(config.new_client_from_config(args.kubeconfig))
    path = args.out / "prometheus.yml"
    args.out.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            text = render(manifests, core, args.out)
        except Exception as error:  # the API server restarting: keep the last configuration
            print(f"real_cluster_prom: {error}", file=sys.stderr, flush=True)
            text = None
        if text is not None and (not path.exists() or path.read_text() != text):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            if args.reload:
                try:
                    urllib.request.urlopen(urllib.request.Request(args.reload, method="POST"), timeout=5)  # fmt: skip
                except OSError as error:
                    print(f"real_cluster_prom: reload: {error}", file=sys.stderr, flush=True)
        if args.once:
            return 0 if text is not None else 1
        time.sleep(3)


if __name__ == "__main__":
    sys.exit(main())
