"""Acts on pods that hold a GPU needing a reset or a reboot (opt-in; docs/health.md).

A health listener on a thread of its own, like the node-status updater: woken by every new
verdict and every ``tick_s`` (pod attribution changes without a new verdict), it takes the
verdict and pod attribution's mapping, asks exporter/remediation/rules.py what to do, and
does it through the Kubernetes API:

* ``--pod-condition``: a strategic merge patch of ``pods/<name>/status`` with the condition
  ``GPUUnhealthy`` (by type: the kubelet keeps conditions it does not own), "True" while the
  pod holds a device needing a reset or reboot, "False" once they recovered. At start every pod
  holding a GPU is read once, so a condition a previous run left "True" is cleared;
* ``--evict-pods``: the Eviction API (``POST pods/<name>/eviction``), so PodDisruptionBudgets
  are honoured: a 429 is a budget saying "not now" and is retried at the next tick without
  spending the rate limit. With ``--evict-dry-run`` it logs and counts what it would evict.

Every write that fails is one log line and counted in ``gpuquota_exporter_api_write_*{writer=
"pod-remediation"}``; evictions by result in :attr:`PodRemediator.evictions`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.exporter.listener_thread import ListenerThread
from gpuquota.exporter.remediation.rules import (
    EvictionBudget,
    PodTrouble,
    due_for_eviction,
    eviction_refusal,
    our_condition,
    pod_condition,
    pods_in_trouble,
)
from gpuquota.exporter.snapshot import PodRef

log = logging.getLogger(__name__)

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
EVICTION_RESULTS = ("evicted", "dry_run", "blocked_by_budget", "refused", "gone", "failed")


@dataclass(frozen=True, slots=True)
class RemediationConfig:
    condition: bool = False
    evict: bool = False
    dry_run: bool = False
    max_evictions: int = 1
    window_s: float = 600.0
    after_s: float = 60.0


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class PodRemediator(ListenerThread):
    def __init__(
        self,
        kube: Any,
        holders: Callable[[], Mapping[str, Sequence[PodRef]]],
        verdict: Callable[[], NodeHealth | None],
        config: RemediationConfig,
        tick_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        max_backoff_s: float = 30.0,
    ) -> None:
        super().__init__("pod-remediation", max_backoff_s=max_backoff_s)
        self.kube = kube
        self.holders = holders
        self.verdict = verdict
        self.config = config
        self.tick_s = tick_s
        self.clock = clock
        self.budget = EvictionBudget(config.max_evictions, config.window_s)
        self.evictions: dict[str, int] = dict.fromkeys(EVICTION_RESULTS, 0)
        # pod -> the trouble its condition says ("": checked, none), so each pod is read once
        # at start and then only when its trouble changes
        self._conditions: dict[tuple[str, str], str] = {}
        self._handled: set[tuple[str, str]] = set()  # evicted, refused or gone: not again
        self._said_limit = False
        self._woken = False

    def __call__(self, before: NodeHealth, after: NodeHealth) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._woken, timeout=self.tick_s)
                if self._stopping:
                    return
                self._woken = False
            try:
                self.round()
            except Exception as exc:  # the API server is down or refuses: try again later
                self._pause(self._failed("cannot act on pods on failed GPUs", exc))
                continue
            self._succeeded()

    def round(self) -> None:
        """One pass: conditions first (cheap, every pod), then evictions within the budget."""
        health = self.verdict()
        if health is None:
            return  # no verdict yet: nothing is known to be broken
        holders = self.holders()
        troubles = pods_in_trouble(health, holders)
        if self.config.condition:
            pods = {(r.namespace, r.pod) for refs in holders.values() for r in refs}
            marked = {key for key, message in self._conditions.items() if message}
            for key in [k for k in self._conditions if k not in pods | marked]:
                del self._conditions[key]  # gone from the node, and we left it unmarked
            for key in sorted(pods | marked):
                self._condition(key, troubles.get(key))
        if self.config.evict:
            self._handled &= set(troubles)  # recovered pods may be handled again next time
            now = self.clock()
            for trouble in due_for_eviction(
                troubles.values(), now, self.config.after_s, self._handled
            ):
                if self.budget.left(now) < 1:
                    if not self._said_limit:
                        log.warning(
                            "eviction limit reached (%d per %.0fs): %s/%s waits",
                            self.config.max_evictions,
                            self.config.window_s,
                            trouble.namespace,
                            trouble.pod,
                        )
                        self._said_limit = True
                    break
                self._said_limit = False
                self._evict(trouble, now)

    def _path(self, namespace: str, pod: str) -> str:
        return f"/api/v1/namespaces/{namespace}/pods/{pod}"

    def _condition(self, key: tuple[str, str], trouble: PodTrouble | None) -> None:
        written = trouble.message() if trouble is not None else ""
        if self._conditions.get(key) == written:
            return
        from gpuquota.kube.client import ApiStatusError

        try:
            pod = self.kube.call("GET", self._path(*key))
        except ApiStatusError as exc:
            if exc.status == 404:  # gone: nothing to mark
                self._conditions[key] = written
                return
            raise
        condition = pod_condition(trouble, our_condition(pod), rfc3339(self.clock()))
        if condition is not None:
            self.kube.call(
                "PATCH",
                self._path(*key) + "/status",
                body={"status": {"conditions": [condition]}},
                content_type=STRATEGIC_MERGE_PATCH,
            )
            log.info(
                "pod %s/%s: condition GPUUnhealthy=%s (%s)",
                *key,
                condition["status"],
                condition["message"],
            )
        self._conditions[key] = written

    def _evict(self, trouble: PodTrouble, now: float) -> None:
        from gpuquota.kube.client import ApiStatusError

        key, path = trouble.key, self._path(*trouble.key)
        try:
            pod = self.kube.call("GET", path)
        except ApiStatusError as exc:
            if exc.status != 404:
                raise
            self._record(key, "gone")
            return
        refusal = eviction_refusal(pod)
        if refusal is not None:
            log.warning("not evicting %s/%s from a failed GPU: %s", *key, refusal)
            self._record(key, "refused")
            return
        what = f"{trouble.namespace}/{trouble.pod} ({trouble.message()})"
        if self.config.dry_run:
            log.warning("dry run: would evict %s", what)
            self.budget.spend(now)
            self._record(key, "dry_run")
            return
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": trouble.pod, "namespace": trouble.namespace},
        }
        try:
            self.kube.call("POST", path + "/eviction", body=body)
        except ApiStatusError as exc:
            if exc.status == 429:  # a PodDisruptionBudget says not now: ask again next tick
                log.info("eviction of %s waits for its disruption budget", what)
                self.evictions["blocked_by_budget"] += 1
                return
            if exc.status == 404:
                self._record(key, "gone")
                return
            self.evictions["failed"] += 1
            raise
        self.budget.spend(now)
        log.warning("evicted %s", what)
        self._record(key, "evicted")

    def _record(self, key: tuple[str, str], result: str) -> None:
        self.evictions[result] += 1
        self._handled.add(key)
