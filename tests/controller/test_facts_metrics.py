"""The controller's quota, allocation and DRA metrics are read from the Accountant when the
registry is scraped (issue 20): a quota or a pod that goes away leaves no series behind, with
no set of series kept anywhere to remove it from. A real Accountant on an in-memory store."""

from __future__ import annotations

import threading

from prometheus_client import generate_latest
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from gpuquota.quota.accounting.accountant import Accountant
from gpuquota.quota.controller.metrics import METRICS, AccountantFacts, ControllerMetrics
from gpuquota.quota.store.db import Store
from gpuquota.quota.store.models import Base
from tests.accounting.objects import node, pod, quota


def _accountant() -> Accountant:
    engine = create_engine(
        "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
    )
    Base.metadata.create_all(engine)
    return Accountant(Store("sqlite://", engine), "c1")


def _series(metrics: ControllerMetrics) -> set[str]:
    text = generate_latest(metrics.registry).decode()
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith("gpuquota_")}


def test_facts_are_read_at_scrape_time_and_gone_facts_have_no_series() -> None:
    acct = _accountant()
    metrics = ControllerMetrics()
    lock = threading.Lock()
    metrics.facts.read_from(acct, lock)
    hard = (
        "gpuquota_namespace_gpu_quota_hard"
        '{namespace="team-a",quota="gpu",resource="requests.nvidia.com/gpu"}'
    )
    held = (
        'gpuquota_namespace_gpus_allocated{kind="raw",namespace="team-a",resource="nvidia.com/gpu"}'
    )
    assert hard not in _series(metrics)
    acct.apply("ADDED", node(), 1000)
    acct.apply("ADDED", quota(hard=4, used=2), 1000)
    acct.apply("ADDED", pod(gpus=2), 1010)
    scraped = _series(metrics)
    assert hard in scraped and held in scraped  # no flush needed: the facts as they are
    acct.apply("DELETED", quota(hard=4, used=2), 1020)
    acct.apply("DELETED", pod(gpus=2, deletion=1020, finished=1020, phase="Succeeded"), 1020)
    scraped = _series(metrics)
    assert hard not in scraped and held not in scraped
    # every scraped row is exposed, with or without samples
    names = {s.name for s in METRICS if s.scraped}
    text = generate_latest(metrics.registry).decode()
    assert all(f"# HELP {n}" in text for n in names)


def test_a_scrape_waits_for_the_controller_thread_then_answers_the_last_facts() -> None:
    acct = _accountant()
    facts = AccountantFacts()
    facts.LOCK_WAIT_S = 0.05
    lock = threading.Lock()
    facts.read_from(acct, lock)
    acct.apply("ADDED", quota(hard=4, used=2), 1000)
    first = {m.name: m.samples for m in facts.collect()}
    assert first["gpuquota_namespace_gpu_quota_used"][0].value == 2
    with lock:  # the controller thread is in the middle of a change (a slow store write)
        acct.apply("MODIFIED", quota(hard=4, used=3), 1010)
        during = {m.name: m.samples for m in facts.collect()}
    assert during == first  # the previous scrape's facts, not a hang or a gap
    after = {m.name: m.samples for m in facts.collect()}
    assert after["gpuquota_namespace_gpu_quota_used"][0].value == 3
