"""One round of central pod remediation: read the verdicts, decide, act, record (docs/health.md).

Each round (``gpuquota remediate`` runs one every ``--interval``):

1. lists the Nodes and this cluster's agents' DeviceTaintRules, and reads every agent's fences
   from them (quota/remediation/verdicts.py);
2. asks the circuit breaker: while it is tripped nothing else happens (no condition, no
   eviction, no clearing), and its opening and closing are one log line and one stored row
   each, the metric ``gpuquota_remediation_breaker_open`` says 1 and the alert
   ``GPURemediationBreakerOpen`` fires;
3. lists the pods of the reporting nodes only (field selector ``spec.nodeName``) and the
   DRA claims they name, and finds the pods in trouble (quota/remediation/rules.py);
4. ``--condition``: writes the pod condition ``GPUUnhealthy`` (strategic merge patch of
   ``pods/status`` carrying the pod's ``metadata.uid`` and ``resourceVersion``: a pod
   recreated or changed since it was read is a 409 or 422, never written), and sets it
   "False" on the pods the store says it marked once their fence lifts;
5. ``--evict``: pods in trouble for ``--evict-after``, oldest first, each read again just
   before (same UID, same node, still holding the fenced device, not static, terminating or
   opted out), one place of the fleet-wide budget reserved in the store, then evicted through
   the Eviction API (policy/v1) with ``deleteOptions.preconditions.uid``: a 429 is a
   PodDisruptionBudget saying "not now" (the place is given back, asked again next round), a
   409 a pod recreated meanwhile;
6. records every act: a row in ``remediation_actions`` and an Event (events.k8s.io/v1) on the
   pod.

``--dry-run`` asks the API server instead of acting: the condition patch and the Eviction are
sent with ``dryRun=All``, so the server runs its checks (admission policies, the UID and
resourceVersion preconditions, PodDisruptionBudgets: a 429) and persists nothing; what it
answered is recorded as a ``dry_run`` (or, a budget refusing, ``dry_run_blocked``) row and a
log line, and no Event is written. Its eviction budget is its own (quota/remediation/record.py),
so it never spends the real one's.

What was already done for a pod (evicted, found gone, refused, a PodDisruptionBudget's refusal
said, a dry run's row written) is read from the store each round (record.Done), so neither a
restart nor a takeover records anything twice.

With replicas (``--lease-name``), only the one holding the Lease acts: ``may_act`` says
whether it still does, and is asked before every write; when it says no, the round stops
(:class:`NotLeadingError`).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from gpuquota.exporter.dra.taintrules import GROUP, MANAGED_BY, MANAGER, VERSIONS
from gpuquota.kube.client import STRATEGIC_MERGE_PATCH, ApiStatusError, Kube
from gpuquota.quota.remediation.metrics import RemediationMetrics
from gpuquota.quota.remediation.record import (
    Act,
    Done,
    Ledger,
    StoredAct,
    eviction_results,
    fence_of,
)
from gpuquota.quota.remediation.rules import (
    Breaker,
    PodTrouble,
    claims_wanted,
    due_for_eviction,
    our_condition,
    pod_condition,
    still_the_one,
    trouble_of,
    untouchable,
)
from gpuquota.quota.remediation.verdicts import FleetVerdicts, read_verdicts

log = logging.getLogger(__name__)

Obj = dict[str, Any]
REPORTING_CONTROLLER = "gpuquota.io/remediate"
DRY_RUN = [("dryRun", "All")]  # the only value the API server takes: every stage, none stored
EVENT_REASONS = {"evict": "GPUEvicted", "condition": "GPUUnhealthy", "cleared": "GPUHealthy"}


class NotLeadingError(Exception):
    """This replica no longer holds the Lease: the round stops before its next write."""


@dataclass(frozen=True, slots=True)
class Settings:
    condition: bool = False
    evict: bool = False
    dry_run: bool = False
    max_evictions: int = 1
    window_s: float = 600.0
    after_s: float = 60.0
    breaker: Breaker = field(default_factory=lambda: Breaker(Fraction(1, 5), 2))
    instance: str = field(default_factory=socket.gethostname)


def rfc3339(t: float, micro: bool = False) -> str:
    spec = "microseconds" if micro else "seconds"
    return datetime.fromtimestamp(t, UTC).isoformat(timespec=spec).replace("+00:00", "Z")


class Remediator:
    def __init__(
        self,
        kube: Kube,
        ledger: Ledger,
        settings: Settings,
        metrics: RemediationMetrics | None = None,
        clock: Callable[[], float] = time.time,
        may_act: Callable[[], bool] = lambda: True,
    ) -> None:
        self.kube = kube
        self.may_act = may_act
        self.ledger = ledger
        self.settings = settings
        self.metrics = metrics or RemediationMetrics()
        self.clock = clock
        self._rule_version: str | None = None
        self._rules_refused = False
        self._breaker_open = ledger.breaker_open()  # as the last run left it: said once
        self._said_budget = False  # a log line only: said once per process
        self._done = Done()  # what the store says was done for this round's pods

    def _leading(self) -> None:
        """Raises NotLeadingError unless this replica may still write (it holds the Lease)."""
        if not self.may_act():
            raise NotLeadingError("the Lease is no longer held: not acting")

    # -- reading ------------------------------------------------------------------------

    def _taint_rules(self) -> list[Obj]:
        """This cluster's agents' DeviceTaintRules, in the newest version served; none where
        DeviceTaintRules are not served."""
        versions = [self._rule_version] if self._rule_version else list(VERSIONS)
        for version in versions:
            path = f"/apis/{GROUP}/{version}/devicetaintrules"
            try:
                answer = self.kube.call("GET", path, [("labelSelector", f"{MANAGED_BY}={MANAGER}")])
            except ApiStatusError as exc:
                if exc.status == 404:
                    continue
                if exc.status == 403:
                    if not self._rules_refused:
                        log.warning("cannot list DeviceTaintRules (%s): DRA fences not seen", exc)
                        self._rules_refused = True
                    return []
                raise
            self._rule_version = version
            return [r for r in answer.get("items") or [] if isinstance(r, dict)]
        self._rule_version = None  # found again next round (the cluster may be upgraded)
        return []

    def _pods_on(self, node: str) -> list[Obj]:
        answer = self.kube.call("GET", "/api/v1/pods", [("fieldSelector", f"spec.nodeName={node}")])
        return [p for p in answer.get("items") or [] if isinstance(p, dict)]

    def _claims(self, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], Obj]:
        found = {}
        for namespace, name in sorted(wanted):
            for version in ("v1", "v1beta2"):
                path = f"/apis/{GROUP}/{version}/namespaces/{namespace}/resourceclaims/{name}"
                try:
                    found[(namespace, name)] = self.kube.call("GET", path)
                    break
                except ApiStatusError as exc:
                    if exc.status != 404:
                        raise
        return found

    def _pod(self, namespace: str, name: str) -> Obj | None:
        try:
            return self.kube.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiStatusError as exc:
            if exc.status == 404:
                return None
            raise

    # -- one round ----------------------------------------------------------------------

    def round(self) -> FleetVerdicts:
        """One pass; raises on API or store failures (the caller retries next round)."""
        nodes, _ = self.kube.list("Node")
        verdicts = read_verdicts(nodes, self._taint_rules())
        self.metrics.gpu_nodes.set(len(verdicts.gpu_nodes))
        self.metrics.reporting_nodes.set(len(verdicts.reporting))
        if not self._breaker(verdicts):
            return verdicts
        pods = [p for node in sorted(verdicts.reporting) for p in self._pods_on(node)]
        claims = self._claims(claims_wanted(pods, verdicts))
        found = [(t, untouchable(p)) for p in pods if (t := trouble_of(p, verdicts, claims))]
        marked = self.ledger.marked() if self.settings.condition else {}
        uids = {t.uid for t, _ in found} | {a.pod_uid for a in marked.values()}
        self._done = Done.of(self.ledger.acts_of(uids), self.settings.dry_run)
        troubles: dict[str, PodTrouble] = {}
        for trouble, why in found:
            if why is not None:
                self._refuse(trouble, why)
            else:
                troubles[trouble.uid] = trouble
        if self.settings.condition:
            self._conditions(troubles, claims, marked)
        if self.settings.evict:
            self._evictions(troubles, claims)
        return verdicts

    def _breaker(self, verdicts: FleetVerdicts) -> bool:
        """False while the breaker stops every action."""
        why = self.settings.breaker.tripped(verdicts)
        self.metrics.breaker_open.set(1 if why else 0)
        if (why is not None) != self._breaker_open:
            self._leading()
        if why and not self._breaker_open:
            log.error("circuit breaker open, every pod action stopped: %s", why)
            self.ledger.record(Act("breaker", "open", message=why), self.clock())
        elif not why and self._breaker_open:
            log.warning("circuit breaker closed: %d GPU node(s) report", len(verdicts.reporting))
            self.ledger.record(
                Act("breaker", "closed", message=f"{len(verdicts.reporting)} reporting"),
                self.clock(),
            )
        self._breaker_open = why is not None
        return why is None

    def _refuse(self, trouble: PodTrouble, why: str) -> None:
        """One row per pod and fence, ever: the store says whether it was written."""
        if trouble.uid in self._done.finished or fence_of(trouble.uid, trouble.uuids()) in (
            self._done.refused
        ):
            return
        log.warning("not acting on %s/%s on a fenced GPU: %s", *trouble.key, why)
        self._record("evict" if self.settings.evict else "condition", "refused", trouble, why)

    # -- the condition ------------------------------------------------------------------

    def _conditions(
        self,
        troubles: dict[str, PodTrouble],
        claims: dict[Any, Obj],
        marked: dict[tuple[str, str], StoredAct],
    ) -> None:
        for trouble in sorted(troubles.values(), key=lambda t: t.key):
            previous = marked.get(trouble.key)
            if (
                previous is not None
                and previous.pod_uid == trouble.uid
                and previous.message == trouble.message()
            ):
                continue  # already says so
            self._mark(trouble, claims)
        in_trouble = {t.key for t in troubles.values()}
        for key, act in sorted(marked.items()):
            if key not in in_trouble or troubles_uid(troubles, key) != act.pod_uid:
                self._clear(act)

    def _mark(self, trouble: PodTrouble, claims: dict[Any, Obj]) -> None:
        pod = self._pod(*trouble.key)
        if pod is None:
            return
        why = still_the_one(pod, trouble, claims) or untouchable(pod)
        if why is not None:
            log.info("not marking %s/%s: %s", *trouble.key, why)
            return
        condition = pod_condition(trouble, our_condition(pod), rfc3339(self.clock()))
        if condition is None:  # the pod says so already (a store restored from a backup)
            if not self.settings.dry_run:  # noted, so that it is cleared when the fence lifts
                self._record("condition", "marked", trouble, trouble.message())
            return
        if self.settings.dry_run and (trouble.uid, trouble.message()) in self._done.said:
            return
        if not self._patch_condition(pod, condition):
            return
        self._record("condition", "dry_run" if self.settings.dry_run else "marked", trouble,
                   trouble.message(), event=not self.settings.dry_run)  # fmt: skip

    def _clear(self, act: StoredAct) -> None:
        pod = self._pod(act.namespace, act.pod)
        result = "cleared"
        message = "the fence lifted"
        if pod is not None and (pod.get("metadata") or {}).get("uid") == act.pod_uid:
            condition = pod_condition(None, our_condition(pod), rfc3339(self.clock()))
            if self.settings.dry_run:
                # a dry run's row must not read as cleared: the real run still has to clear it
                result, message = "dry_run", "would clear: the fence lifted"
                if (act.pod_uid, message) in self._done.said:
                    return
            if condition is not None and not self._patch_condition(pod, condition):
                return
        elif self.settings.dry_run:
            return  # the real run notes it gone
        else:
            result, message = "gone", "the pod is gone"  # the pod we marked is no more
        self._leading()
        self.ledger.record(
            Act("condition", result, act.node, act.namespace, act.pod, act.pod_uid, act.devices,
                message),
            self.clock(),
        )  # fmt: skip
        self.metrics.actions.labels("condition", result).inc()
        log.info("pod %s/%s: condition GPUUnhealthy=False (%s)", act.namespace, act.pod, result)

    def _patch_condition(self, pod: Obj, condition: Obj) -> bool:
        """Writes ``condition`` on exactly this pod object (a dry run: asks the server whether
        it would); False when it changed meanwhile."""
        meta = pod.get("metadata") or {}
        self._leading()
        body = {
            "metadata": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
            "status": {"conditions": [condition]},
        }
        path = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}/status"
        dry = self.settings.dry_run
        try:
            self.kube.call("PATCH", path, DRY_RUN if dry else None, body=body,
                           content_type=STRATEGIC_MERGE_PATCH)  # fmt: skip
        except ApiStatusError as exc:
            if exc.status in (404, 409, 422):  # gone, changed or recreated: next round decides
                log.info("pod %s/%s changed before its condition was written: %s",
                         meta.get("namespace"), meta.get("name"), exc)  # fmt: skip
                return False
            raise
        if dry:
            log.warning("dry run: the API server would set GPUUnhealthy=%s on %s/%s",
                        condition["status"], meta.get("namespace"), meta.get("name"))  # fmt: skip
        return True

    # -- eviction -----------------------------------------------------------------------

    def _evictions(self, troubles: dict[str, PodTrouble], claims: dict[Any, Obj]) -> None:
        now = self.clock()
        s = self.settings
        for trouble in due_for_eviction(troubles.values(), now, s.after_s):
            if trouble.uid in self._done.finished:
                continue  # evicted (a dry run: would be) or gone; a refusal is checked anew
            pod = self._pod(*trouble.key)
            why = "deleted" if pod is None else still_the_one(pod, trouble, claims)
            if why is not None:
                log.info("not evicting %s/%s: %s", *trouble.key, why)
                continue  # the next round decides from the pod as it is then
            refusal = untouchable(pod) if pod is not None else None
            if refusal is not None:
                self._refuse(trouble, refusal)
                continue
            result = "dry_run" if s.dry_run else "evicting"
            act = Act("evict", result, trouble.node, trouble.namespace, trouble.pod, trouble.uid,
                      trouble.uuids(), trouble.message())  # fmt: skip
            self._leading()
            row = self.ledger.reserve(act, now, s.max_evictions, s.window_s, s.dry_run)
            if row is None:
                if not self._said_budget:
                    log.warning("eviction budget spent (%d per %.0fs, fleet-wide): %s/%s waits",
                                s.max_evictions, s.window_s, *trouble.key)  # fmt: skip
                    self._said_budget = True
                break
            self._said_budget = False
            self._evict(trouble, row)
        self.metrics.budget_left.set(
            max(self.ledger.left(self.clock(), s.max_evictions, s.window_s, s.dry_run), 0)
        )

    def _evict(self, trouble: PodTrouble, row: int) -> None:
        """Evicts the pod (a dry run: asks the server whether it would) and finishes its row."""
        dry = self.settings.dry_run
        evicted, blocked, failed = eviction_results(dry)
        path = f"/api/v1/namespaces/{trouble.namespace}/pods/{trouble.pod}/eviction"
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": trouble.pod, "namespace": trouble.namespace},
            "deleteOptions": {"preconditions": {"uid": trouble.uid}},
        }
        what = f"{trouble.namespace}/{trouble.pod} ({trouble.message()})"
        try:
            self.kube.call("POST", path, DRY_RUN if dry else None, body=body)
        except ApiStatusError as exc:
            if exc.status == 429:  # a PodDisruptionBudget says not now: the place goes back
                if fence_of(trouble.uid, trouble.uuids()) in self._done.blocked:
                    self.ledger.discard(row)  # one row says it waits; the others would repeat it
                    return
                log.info("%seviction of %s waits for its disruption budget",
                         "dry run: " if dry else "", what)  # fmt: skip
                self.ledger.finish(row, blocked, f"{trouble.message()}: {exc}")
                self.metrics.actions.labels("evict", blocked).inc()
                self._event(trouble, "evict", f"eviction waits for a PodDisruptionBudget: {exc}",
                            reason="GPUEvictionBlocked")  # fmt: skip
                return
            if exc.status in (404, 409):  # gone, or recreated under its name (UID precondition)
                self.ledger.finish(row, "gone", f"{trouble.message()}: {exc}")
                self.metrics.actions.labels("evict", "gone").inc()
                log.info("not evicted %s: %s", what, exc)
                return
            self.ledger.finish(row, failed, f"{trouble.message()}: {exc}")
            self.metrics.actions.labels("evict", failed).inc()
            raise
        if dry:  # the row says dry_run already
            self.metrics.actions.labels("evict", evicted).inc()
            log.warning("dry run: the API server would evict %s", what)
            return
        self.ledger.finish(row, evicted)
        self.metrics.actions.labels("evict", evicted).inc()
        log.warning("evicted %s", what)
        self._event(trouble, "evict", f"evicted: its GPU needs {trouble.action.label}: "
                    f"{trouble.message()}")  # fmt: skip

    # -- records ------------------------------------------------------------------------

    def _record(
        self, action: str, result: str, trouble: PodTrouble, message: str, event: bool = False
    ) -> None:
        self._leading()
        self.ledger.record(
            Act(action, result, trouble.node, trouble.namespace, trouble.pod, trouble.uid,
                trouble.uuids(), message),
            self.clock(),
        )  # fmt: skip
        self.metrics.actions.labels(action, result).inc()
        if result == "marked":
            log.info("pod %s/%s: condition GPUUnhealthy=True (%s)", *trouble.key, message)
        if event:
            self._event(trouble, action, message)

    def _event(
        self, trouble: PodTrouble, action: str, note: str, reason: str | None = None
    ) -> None:
        """An Event on the pod (events.k8s.io/v1); a failure is a log line, never the act's:
        the stored row is the record that must not be lost."""
        if self.settings.dry_run:
            return
        now = self.clock()
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": f"{trouble.pod}.{int(now * 1e9):x}"[:253],
                "namespace": trouble.namespace,
            },
            "eventTime": rfc3339(now, micro=True),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.settings.instance[:128],
            "action": "Evict" if action == "evict" else "MarkUnhealthy",
            "reason": reason or EVENT_REASONS.get(action, "GPUUnhealthy"),
            "regarding": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": trouble.namespace,
                "name": trouble.pod,
                "uid": trouble.uid,
            },
            "note": note[:1024],
            "type": "Warning",
        }
        try:
            self.kube.call(
                "POST", f"/apis/events.k8s.io/v1/namespaces/{trouble.namespace}/events", body=body
            )
        except ApiStatusError as exc:
            log.warning("no Event on %s/%s: %s", *trouble.key, exc)


def troubles_uid(troubles: dict[str, PodTrouble], key: tuple[str, str]) -> str | None:
    return next((t.uid for t in troubles.values() if t.key == key), None)
