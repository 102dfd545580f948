"""The Lease lock (gpuquota/kube/leader.py) turns any failure to reach the API server into a
failed attempt, even one that carries no HTTP answer: the election library reads ``.reason``
of what a failed get returns, and an AttributeError there ends its thread (a standby that
never retries; a leader that never learns it lost the Lease)."""

from __future__ import annotations

from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection

from gpuquota.kube.leader import _Lock


def test_a_lease_lock_failure_without_an_http_answer_is_a_failed_attempt() -> None:
    saved = client.Configuration.get_default_copy()
    nowhere = client.Configuration()
    nowhere.host = ""  # urllib3 refuses before any request: LocationValueError, no .reason
    client.Configuration.set_default(nowhere)
    try:
        config = electionconfig.Config(  # type: ignore[no-untyped-call]
            _Lock("lease", "ns", "me"),  # type: ignore[no-untyped-call]
            lease_duration=15,
            renew_deadline=10,
            retry_period=2,
            onstarted_leading=lambda: None,
            onstopped_leading=lambda: None,
        )
        election = leaderelection.LeaderElection(config)  # type: ignore[no-untyped-call]
        assert election.try_acquire_or_renew() is False
    finally:
        client.Configuration.set_default(saved)
