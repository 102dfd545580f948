"""The scrape configuration the Prometheus Operator renders for our ServiceMonitors.

The Operator turns each ServiceMonitor endpoint into one scrape job of a Prometheus it runs:
Kubernetes service discovery over Endpoints, then a fixed list of relabelings that give every
target its own ``namespace``, ``service``, ``pod``, ``container``, ``job`` and ``endpoint``
labels (and ``node`` where the address is a Node), then the monitor's own relabelings, then
the sharding rules. ``honor_labels`` is false unless the endpoint says ``honorLabels: true``,
and with false Prometheus renames a scraped label that clashes with a target label to
``exported_<name>``: the agent's ``namespace``/``pod`` of a workload become
``exported_namespace``/``exported_pod``, and the series say the agent's own namespace. A
Prometheus whose spec says ``overrideHonorLabels: true`` writes ``honor_labels: false`` for
every monitor, whatever it says (its generator's AddHonorLabels; golden file
HonorLabelsOverriding.golden): only the relabelings then keep a target label from clashing.

``render`` derives that configuration from built manifests (``kubectl kustomize``) by the
Operator's rules, as its generator (pkg/prometheus/promcfg.go, generateServiceMonitorConfig)
writes them; tests/deploy/test_operator_config.py checks the rules against the Operator's own
golden files for the same shapes (tests/deploy/operator_golden.yaml cites each). Only what our
monitors use is derived; anything else (a PodMonitor, an authorization, a target port ...) is
refused by name, so a new monitor cannot silently differ from what the Operator would do.

``on_this_machine`` turns the rendered jobs into ones a Prometheus without a cluster runs:
each job's Kubernetes discovery becomes a static target carrying the ``__meta_kubernetes_*``
labels Kubernetes discovery gives an Endpoints target backed by a pod, so the Operator's
relabelings run unchanged in a real Prometheus (the composition test, tools/real-cluster).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
Secrets = Mapping[str, Mapping[str, bytes]]  # Secret name -> key -> value (one namespace)

#: where the Operator mounts the TLS assets it copies from Secrets into its Prometheus pod
TLS_ASSETS_DIR = "/etc/prometheus/certs"
# the endpoint fields the derivation follows; any other is refused by name
_ENDPOINT_FIELDS = frozenset({
    "port", "interval", "scrapeTimeout", "path", "scheme", "honorLabels", "tlsConfig",
    "basicAuth", "relabelings", "metricRelabelings",
})  # fmt: skip
_SPEC_FIELDS = frozenset({"jobLabel", "selector", "endpoints", "targetLabels", "podTargetLabels"})
_TLS_FIELDS = frozenset({"ca", "serverName", "insecureSkipVerify"})
# a relabeling's fields in the order the Operator writes them (generateRelabelConfig)
_RELABEL_FIELDS = (
    ("sourceLabels", "source_labels"),
    ("separator", "separator"),
    ("targetLabel", "target_label"),
    ("regex", "regex"),
    ("modulus", "modulus"),
    ("replacement", "replacement"),
    ("action", "action"),
)


class UnsupportedMonitorError(ValueError):
    """A monitor uses something this derivation does not follow."""


def sanitize(name: str) -> str:
    """A Kubernetes label name as a Prometheus label name suffix (the Operator's
    sanitizeLabelName: every character outside [a-zA-Z0-9_] becomes ``_``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def relabeling(spec: Obj) -> Obj:
    """One RelabelConfig of a monitor as the Operator writes it (``action`` lower-cased)."""
    unknown = set(spec) - {f for f, _ in _RELABEL_FIELDS}
    if unknown:
        raise UnsupportedMonitorError(f"relabeling fields {sorted(unknown)} are not derived")
    out: Obj = {}
    for ours, theirs in _RELABEL_FIELDS:
        if ours in spec and spec[ours] not in ("", None, []):
            out[theirs] = spec[ours].lower() if ours == "action" else spec[ours]
    return out


def _selector_relabelings(selector: Obj) -> list[Obj]:
    out: list[Obj] = []
    for key in sorted(selector.get("matchLabels", {})):
        value = selector["matchLabels"][key]
        out.append({
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_service_label_{sanitize(key)}",
                              f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"],
            "regex": f"({value});true",
        })  # fmt: skip
    for exp in selector.get("matchExpressions", []):
        label = f"__meta_kubernetes_service_label_{sanitize(exp['key'])}"
        present = f"__meta_kubernetes_service_labelpresent_{sanitize(exp['key'])}"
        op = exp["operator"]
        if op in ("In", "NotIn"):
            out.append({
                "action": "keep" if op == "In" else "drop",
                "source_labels": [label, present],
                "regex": f"({'|'.join(exp['values'])});true",
            })  # fmt: skip
        elif op in ("Exists", "DoesNotExist"):
            out.append({
                "action": "keep" if op == "Exists" else "drop",
                "source_labels": [present],
                "regex": "true",
            })  # fmt: skip
        else:
            raise UnsupportedMonitorError(f"selector operator {op!r}")
    return out


def _sharding(shards: int) -> list[Obj]:
    return [
        {"source_labels": ["__address__", "__tmp_hash"], "target_label": "__tmp_hash",
         "regex": "(.+);", "replacement": "$1", "action": "replace"},
        {"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": shards,
         "action": "hashmod"},
        {"source_labels": ["__tmp_hash", "__tmp_disable_sharding"],
         "regex": "$(SHARD);|.+;.+", "action": "keep"},
    ]  # fmt: skip


def _secret_key(secrets: Secrets, ref: Obj, what: str) -> bytes:
    try:
        return secrets[ref["name"]][ref["key"]]
    except KeyError:
        raise KeyError(f"{what}: no key {ref['key']!r} in Secret {ref['name']!r}") from None


@dataclass
class Rendered:
    """The Operator's output for some monitors: its scrape jobs and the TLS assets it copies
    from Secrets into ``TLS_ASSETS_DIR`` (file name -> content)."""

    scrape_configs: list[Obj] = field(default_factory=list)
    tls_assets: dict[str, bytes] = field(default_factory=dict)


def service_monitor_jobs(
    monitor: Obj,
    secrets: Secrets,
    rendered: Rendered,
    shards: int = 1,
    *,
    override_honor_labels: bool = False,
) -> None:
    """Append to ``rendered`` the jobs of one ServiceMonitor, as the Operator writes them
    (for a Prometheus whose spec says ``overrideHonorLabels`` when that is true)."""
    meta, spec = monitor["metadata"], monitor["spec"]
    namespace, name = meta["namespace"], meta["name"]
    unknown = set(spec) - _SPEC_FIELDS
    if unknown:
        raise UnsupportedMonitorError(
            f"ServiceMonitor {name}: fields {sorted(unknown)} not derived"
        )
    for i, ep in enumerate(spec["endpoints"]):
        unknown = set(ep) - _ENDPOINT_FIELDS
        if unknown or "port" not in ep:
            raise UnsupportedMonitorError(
                f"ServiceMonitor {name} endpoint {i}: {sorted(unknown) or 'no port'} not derived"
            )
        job: Obj = {
            "job_name": f"serviceMonitor/{namespace}/{name}/{i}",
            "honor_labels": bool(ep.get("honorLabels", False)) and not override_honor_labels,
            "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": [namespace]}}],
        }
        for ours, theirs in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout"),
                             ("path", "metrics_path"), ("scheme", "scheme")):  # fmt: skip
            if ep.get(ours):
                job[theirs] = ep[ours]
        tls = ep.get("tlsConfig")
        if tls is not None:
            if set(tls) - _TLS_FIELDS or set(tls.get("ca", {})) - {"secret"}:
                raise UnsupportedMonitorError(f"ServiceMonitor {name}: tlsConfig {tls} not derived")
            tls_config: Obj = {}
            if "insecureSkipVerify" in tls:
                tls_config["insecure_skip_verify"] = tls["insecureSkipVerify"]
            if "ca" in tls:
                ref = tls["ca"]["secret"]
                # the asset key: 0 (from a Secret; 1 is a ConfigMap), namespace, name, key
                asset = f"0_{namespace}_{ref['name']}_{ref['key']}"
                rendered.tls_assets[asset] = _secret_key(secrets, ref, f"{name} tlsConfig.ca")
                tls_config["ca_file"] = f"{TLS_ASSETS_DIR}/{asset}"
            if tls.get("serverName"):
                tls_config["server_name"] = tls["serverName"]
            job["tls_config"] = tls_config
        auth = ep.get("basicAuth")
        if auth is not None:  # inlined: the Operator's config Secret holds the values
            job["basic_auth"] = {
                part: _secret_key(secrets, auth[part], f"{name} basicAuth.{part}").decode()
                for part in ("username", "password")
            }
        job["relabel_configs"] = _relabelings(monitor, ep, shards)
        metric = [relabeling(r) for r in ep.get("metricRelabelings", [])]
        if metric:
            job["metric_relabel_configs"] = metric
        rendered.scrape_configs.append(job)


def _relabelings(monitor: Obj, ep: Obj, shards: int) -> list[Obj]:
    spec = monitor["spec"]
    target = ["__meta_kubernetes_endpoint_address_target_kind",
              "__meta_kubernetes_endpoint_address_target_name"]  # fmt: skip
    out: list[Obj] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    out += _selector_relabelings(spec.get("selector", {}))
    out += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
         "regex": ep["port"]},
        {"source_labels": target, "separator": ";", "regex": "Node;(.*)",
         "replacement": "${1}", "target_label": "node"},
        {"source_labels": target, "separator": ";", "regex": "Pod;(.*)",
         "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        # filterRunning defaults to true
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
         "regex": "(Failed|Succeeded)"},
    ]  # fmt: skip
    for kind, labels in (("service", spec.get("targetLabels", [])),
                         ("pod", spec.get("podTargetLabels", []))):  # fmt: skip
        for label in labels:
            out.append({
                "source_labels": [f"__meta_kubernetes_{kind}_label_{sanitize(label)}"],
                "target_label": sanitize(label), "regex": "(.+)", "replacement": "${1}",
            })  # fmt: skip
    # the job: the Service's name, then the value of the Service label jobLabel names
    out.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
                "replacement": "${1}"})  # fmt: skip
    if spec.get("jobLabel"):
        out.append({
            "source_labels": [f"__meta_kubernetes_service_label_{sanitize(spec['jobLabel'])}"],
            "target_label": "job", "regex": "(.+)", "replacement": "${1}",
        })  # fmt: skip
    out.append({"target_label": "endpoint", "replacement": ep["port"]})
    out += [relabeling(r) for r in ep.get("relabelings", [])]
    return out + _sharding(shards)


def render(
    docs: Sequence[Obj], secrets: Secrets, shards: int = 1, *, override_honor_labels: bool = False
) -> Rendered:
    """The Operator's scrape jobs for every ServiceMonitor in ``docs`` (in document order).
    ``secrets``: the Secrets of the monitors' namespace that they reference;
    ``override_honor_labels``: the Prometheus' ``spec.overrideHonorLabels``."""
    rendered = Rendered()
    for doc in docs:
        if doc.get("kind") == "PodMonitor":
            raise UnsupportedMonitorError(f"PodMonitor {doc['metadata']['name']}: not derived")
        if doc.get("kind") == "ServiceMonitor":
            service_monitor_jobs(
                doc, secrets, rendered, shards, override_honor_labels=override_honor_labels
            )
    return rendered


def shard_config(jobs: list[Obj], shard: int = 0) -> list[Obj]:
    """``jobs`` as the Operator's config reloader hands them to the Prometheus of ``shard``:
    ``$(SHARD)`` expanded from the pod's environment."""

    def expand(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("$(SHARD)", str(shard))
        if isinstance(value, list):
            return [expand(v) for v in value]
        if isinstance(value, dict):
            return {k: expand(v) for k, v in value.items()}
        return value

    return [expand(job) for job in jobs]


@dataclass(frozen=True)
class Target:
    """One Endpoints address backed by a pod, as Kubernetes discovery sees it."""

    address: str  # host:port where it listens (its pod IP and port in a cluster)
    service: Obj  # the Service (its namespace, name and labels)
    port_name: str  # the Service port's name (the Endpoints port carries it)
    pod: str
    container: str  # the container whose port the Service's targetPort names
    node: str
    phase: str = "Running"

    def meta_labels(self) -> dict[str, str]:
        """The ``__meta_kubernetes_*`` labels of the Endpoints role for this address
        (Prometheus's kubernetes_sd_config documentation, role endpoints)."""
        svc = self.service["metadata"]
        labels = {
            "__meta_kubernetes_namespace": svc["namespace"],
            "__meta_kubernetes_service_name": svc["name"],
            "__meta_kubernetes_endpoints_name": svc["name"],
            "__meta_kubernetes_endpoint_port_name": self.port_name,
            "__meta_kubernetes_endpoint_port_protocol": "TCP",
            "__meta_kubernetes_endpoint_ready": "true",
            "__meta_kubernetes_endpoint_address_target_kind": "Pod",
            "__meta_kubernetes_endpoint_address_target_name": self.pod,
            "__meta_kubernetes_endpoint_node_name": self.node,
            "__meta_kubernetes_pod_name": self.pod,
            "__meta_kubernetes_pod_container_name": self.container,
            "__meta_kubernetes_pod_node_name": self.node,
            "__meta_kubernetes_pod_phase": self.phase,
            "__meta_kubernetes_pod_ready": "true",
        }
        for key, value in svc.get("labels", {}).items():
            labels[f"__meta_kubernetes_service_label_{sanitize(key)}"] = value
            labels[f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"] = "true"
        return labels


def on_this_machine(
    rendered: Rendered,
    targets: Mapping[str, Sequence[Target]],
    certs: Path,
    scrape_interval: str | None = None,
) -> list[Obj]:
    """The rendered jobs for a Prometheus with no cluster: each job's Kubernetes discovery
    replaced by ``targets[job_name]`` as static targets with their discovery labels, the TLS
    assets written under ``certs`` (and ``ca_file`` pointing there), ``$(SHARD)`` expanded for
    shard 0, and, if given, every job's interval (and timeout) set to ``scrape_interval``.
    Every relabeling, ``honor_labels`` and the credentials stay as the Operator wrote them."""
    certs.mkdir(parents=True, exist_ok=True)
    for asset, data in rendered.tls_assets.items():
        (certs / asset).write_bytes(data)
    jobs = []
    for job in shard_config(rendered.scrape_configs):
        job = dict(job)
        del job["kubernetes_sd_configs"]
        job["static_configs"] = [
            {"targets": [t.address], "labels": t.meta_labels()} for t in targets[job["job_name"]]
        ]
        if "ca_file" in job.get("tls_config", {}):
            asset = Path(job["tls_config"]["ca_file"]).name
            job["tls_config"] = {**job["tls_config"], "ca_file": str(certs / asset)}
        if scrape_interval is not None:
            job["scrape_interval"] = job["scrape_timeout"] = scrape_interval
        jobs.append(job)
    return jobs
