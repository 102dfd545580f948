"""A simulated cluster for the central remediation's tests: the kube-apiserver stand-in over a
real socket, Nodes whose verdicts are published by the node agent's own code (its health
tracker and NodeStatusUpdater, as `gpu-exporter --node-condition --node-taint` does), pods
whose ``allocatedResourcesStatus`` reads as a 1.36 kubelet writes it, and a store."""

from __future__ import annotations

import time
import uuid as uuidlib
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, select

from gpuquota.exporter.health.config import parse_config
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.nodestatus.status import wanted_status
from gpuquota.exporter.nodestatus.updater import NodeStatusUpdater
from gpuquota.kube.client import Kube
from gpuquota.kube.rest import load
from gpuquota.quota.remediation.metrics import RemediationMetrics
from gpuquota.quota.remediation.record import Ledger
from gpuquota.quota.remediation.remediator import Remediator, Settings
from gpuquota.quota.remediation.rules import Breaker
from gpuquota.quota.store import db
from gpuquota.quota.store.db import Store
from gpuquota.quota.store.models import RemediationAction
from gpuquota.sim.apiserver import ApiServer
from tests.health.factory import gpus, node

Obj = dict[str, Any]
# the agent dates its Node condition by the wall clock: the tests' clocks start there
T0 = float(int(time.time()))


def uuid_of(node_name: str, index: int) -> str:
    """GPU UUIDs unique across the simulated nodes."""
    return f"GPU-{node_name}-{index:04d}"


class Agent:
    """One node's agent: its health tracker on a fake clock and its node-status writer."""

    def __init__(self, kube: Kube, name: str, count: int) -> None:
        self.name = name
        self.tracker = DeviceTracker(parse_config(None, quiet_period_s=100_000))
        self.count = count
        # the condition's times on the same fake clock as the verdicts: a wall clock would
        # date a fence minutes after T0 once the suite is loaded, and --evict-after would wait
        self.now = T0
        self.updater = NodeStatusUpdater(
            kube, name, taint=True, condition=True, clock=lambda: self.now
        )
        self.health: NodeHealth = self.tracker.observe_snapshot(node(*self._devices()), T0)
        self.publish()

    def _devices(self) -> tuple[Any, ...]:
        return tuple(replace(d, uuid=uuid_of(self.name, d.index)) for d in gpus(self.count))

    def xid(self, index: int, xid: int, at: float = T0 + 1) -> None:
        self.now = at
        self.health = self.tracker.observe_xid(uuid_of(self.name, index), xid, at=at)
        self.publish()

    def nvml_fails(self, at: float = T0 + 1) -> None:
        """NVML stops answering (a driver upgrade): every GPU nvml_unavailable, reboot_node."""
        self.now = at
        self.health = self.tracker.observe_snapshot(node(ok=False, at=at), at)
        self.publish()

    def recover(self, at: float) -> None:
        self.now = at
        self.health = self.tracker.observe_snapshot(node(*self._devices(), at=at), at)
        self.health = self.tracker.expire(at)
        self.publish()

    def publish(self) -> None:
        self.updater.apply(wanted_status(self.health))


@dataclass
class Cluster:
    server: ApiServer
    kube: Kube
    db_url: str
    agents: dict[str, Agent] = field(default_factory=dict)
    stores: list[Store] = field(default_factory=list)

    def add_node(self, name: str, count: int = 2) -> Agent:
        self.server.apply("ADDED", {
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "uid": f"uid-{name}"}, "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": str(count)},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        })  # fmt: skip
        agent = Agent(self.kube, name, count)
        self.agents[name] = agent
        return agent

    def add_pod(
        self,
        namespace: str,
        name: str,
        node_name: str,
        devices: dict[str, str],
        uid: str | None = None,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        **meta: Any,
    ) -> Obj:
        """A running pod as the kubelet reports it: ``devices`` device ID -> health."""
        pod = {
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace,
                         "uid": uid or str(uuidlib.uuid4()),
                         "annotations": annotations or {}, "labels": labels or {}, **meta},
            "spec": {"nodeName": node_name, "containers": [{"name": "main"}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{
                    "name": "main", "ready": True, "started": True,
                    "allocatedResourcesStatus": [{
                        "name": "nvidia.com/gpu",
                        "resources": [{"resourceID": d, "health": h} for d, h in devices.items()],
                    }],
                }],
            },
        }  # fmt: skip
        self.server.apply("ADDED", pod)
        return pod

    def delete_pod(self, namespace: str, name: str) -> None:
        from gpuquota.sim.apiserver import RESOURCES

        self.server.delete(RESOURCES["pods"], namespace, name)

    def remediator(self, clock: list[float], cluster: str = "test", **config: Any) -> Remediator:
        """A fresh remediator (a restart: nothing kept but the store)."""
        config.setdefault("breaker", Breaker(Fraction(1, 5), 2))
        config.setdefault("instance", "remediate-test")
        store = db.open_store(self.db_url)
        self.stores.append(store)
        return Remediator(
            self.kube, Ledger(store, cluster), Settings(**config), RemediationMetrics(),
            clock=lambda: clock[0],
        )  # fmt: skip

    def close(self) -> None:
        for store in self.stores:
            store.close()


def make_cluster(server: ApiServer, tmp_path: Path) -> Cluster:
    kube = Kube(load(str(server.write_kubeconfig(tmp_path / "kubeconfig"))))
    url = f"sqlite:///{tmp_path / 'gq.db'}"
    db.upgrade(url)
    return Cluster(server, kube, url)


def conditions(server: ApiServer, namespace: str, name: str) -> dict[str, str]:
    pod = server.get("pods", name, namespace) or {}
    return {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}


def events(server: ApiServer, namespace: str) -> list[Obj]:
    return [e for (ns, _), e in server.state.objects["events"].items() if ns == namespace]


def rows(c: Cluster) -> list[tuple[str, str, str]]:
    """The store's remediation rows, (action, result, pod), in the order they were written."""
    engine = create_engine(c.db_url)
    t = RemediationAction.__table__
    try:
        with engine.connect() as conn:
            return [
                (r.action, r.result, r.pod)
                for r in conn.execute(select(t).order_by(t.c.id))  # type: ignore[arg-type]
            ]
    finally:
        engine.dispose()
