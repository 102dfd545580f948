"""Leader election through a coordination.k8s.io/v1 Lease (kubernetes.leaderelection).

Only the replica holding the Lease acts (the controller's writer, the acting ``gpuquota
remediate``; each component has a Lease of its own); the others wait. A leader that cannot renew within the renew deadline stops and exits, so it never
writes beside a new leader; a standby takes the Lease once it has not been renewed for the
lease duration.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    name: str
    namespace: str
    identity: str
    duration: int = 15
    renew_deadline: int = 10
    retry_period: int = 2


class _Lock(LeaseLock):
    """LeaseLock that treats any failure to reach the API server as a failed attempt.

    The library catches only ApiException; a refused or reset connection (urllib3 errors)
    would escape and kill its renew thread without calling ``onstopped_leading``, leaving a
    leader that writes without a Lease."""

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        try:
            return cast(tuple[bool, Any], super().get(name, namespace))  # type: ignore[no-untyped-call]
        except Exception as exc:
            log.warning("lease %s/%s: %s", namespace, name, exc)
            # the library reads .reason and .body of what a failed get returns: an ApiException
            # has them (a bare urllib3 error has no .reason, and its AttributeError would end
            # the election thread: a standby never retries, a leader never stops)
            return False, ApiException(status=0, reason=f"{type(exc).__name__}: {exc}")

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        try:
            return bool(super().create(name, namespace, election_record))  # type: ignore[no-untyped-call]
        except Exception as exc:
            log.warning("lease %s/%s: %s", namespace, name, exc)
            return False

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        try:
            return bool(super().update(name, namespace, updated_record))  # type: ignore[no-untyped-call]
        except Exception as exc:
            log.warning("lease %s/%s: %s", namespace, name, exc)
            return False


def check(settings: LeaseSettings) -> str | None:
    """What is wrong with the timings (the library would sys.exit on it), or None."""
    if settings.duration <= settings.renew_deadline:
        return "--lease-duration must be greater than --renew-deadline"
    if settings.renew_deadline <= 1.2 * settings.retry_period:
        return "--renew-deadline must be greater than 1.2 x --retry-period"
    if settings.retry_period < 1:
        return "--retry-period must be at least 1 second"
    return None


def elect(
    settings: LeaseSettings, on_started: Callable[[], None], on_stopped: Callable[[], None]
) -> threading.Thread:
    """Run the election in a daemon thread: ``on_started`` (in its own thread) when this
    replica takes the Lease, ``on_stopped`` when it fails to renew it."""
    logging.getLogger("leaderelection").setLevel(logging.WARNING)  # it logs every retry
    lock = _Lock(settings.name, settings.namespace, settings.identity)  # type: ignore[no-untyped-call]
    config = electionconfig.Config(  # type: ignore[no-untyped-call]
        lock,
        lease_duration=settings.duration,
        renew_deadline=settings.renew_deadline,
        retry_period=settings.retry_period,
        onstarted_leading=on_started,
        onstopped_leading=on_stopped,
    )
    election = leaderelection.LeaderElection(config)  # type: ignore[no-untyped-call]
    thread = threading.Thread(target=election.run, name="leader-election", daemon=True)
    thread.start()
    log.info(
        "waiting for the lease %s/%s as %s", settings.namespace, settings.name, settings.identity
    )
    return thread
