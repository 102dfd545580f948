"""`gpuquota controller` end to end: real client, real sockets, real SQLite and PostgreSQL.

Every test feeds a generated workload through the API server stand-in to a controller
subprocess and checks the GPU-seconds in the store against the generator's own truth, to the
second, whatever was done to the controller, the watches or the database on the way.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time

from sqlalchemy import text as sql

from gpuquota.sim.apiserver import Driver
from gpuquota.sim.harness import wait_for
from gpuquota.sim.workload import generate
from tests.controller.conftest import (
    FAST_LEASE,
    ROOT,
    ControllerProcess,
    assert_exact,
    caught_up,
    drive_through_cut_and_stall,
    free_port,
    metric,
    ready,
    start,
)

WL = generate(21, 1.0, pods_per_hour=40, observation_independent=True)


def test_live_totals_are_exact_and_metrics_match(apiserver, store, controllers):
    # the generator names node pools with `node-pool`, which no built-in label matches
    ctl = start(apiserver, store, controllers, "--node-pool-label", "node-pool")
    ready(store)
    Driver(apiserver, WL).run()
    wait_for(lambda: caught_up(store, apiserver), 20, "catch-up")
    text = ctl.metrics()
    assert metric(text, "gpuquota_controller_leader") == 1  # no lease asked: it is the writer
    for ns in ("team-a", "ml-research"):
        quota = apiserver.get("resourcequotas", "gpu-quota", ns)
        assert quota is not None
        for key, used in quota["status"]["used"].items():
            if "nvidia.com" in key:
                assert metric(
                    text, "gpuquota_namespace_gpu_quota_used", namespace=ns, resource=key
                ) == float(used)
                assert metric(
                    text, "gpuquota_namespace_gpu_quota_hard", namespace=ns, resource=key
                ) == float(quota["status"]["hard"][key])
    open_now: dict[tuple[str, str], int] = {}
    for iv in WL.truth.intervals:
        if iv.end is None:
            open_now[(iv.namespace, iv.resource)] = (
                open_now.get((iv.namespace, iv.resource), 0) + iv.units
            )
    for (ns, res), units in open_now.items():
        assert (
            metric(
                text, "gpuquota_namespace_gpus_allocated", namespace=ns, resource=res, kind="raw"
            )
            == units
        )
    assert metric(text, "gpuquota_controller_events_total", kind="Pod", type="DELETED") > 0
    assert metric(text, "gpuquota_controller_synced") == 1
    best_effort = best_effort_gpu_pods(apiserver)
    assert best_effort, "the workload should leave BestEffort GPU pods running"
    for ns, count in best_effort.items():
        assert metric(text, "gpuquota_namespace_best_effort_gpu_pods", namespace=ns) == count
    assert ctl.terminate() == 0
    assert_exact(store, WL)
    with store.engine.connect() as conn:
        pools = {
            row[0]: row[1]
            for row in conn.execute(
                # rows whose node was known when they started (its facts are recorded then)
                sql(
                    "SELECT node, node_pool FROM allocations"
                    " WHERE cluster = :c AND gpu_model IS NOT NULL"
                ),
                {"c": store.cluster},
            )
        }
    labelled = {
        n["metadata"]["name"]: n["metadata"]["labels"]["node-pool"]
        for n in (e.object for e in WL.events if e.object["kind"] == "Node")
    }
    wrong = {n: (p, labelled.get(n)) for n, p in pools.items() if n and p != labelled.get(n)}
    assert pools and not wrong, wrong


def best_effort_gpu_pods(apiserver) -> dict[str, int]:
    """Per namespace, the live non-terminal pods asking for GPUs with QoS BestEffort."""
    counts: dict[str, int] = {}
    with apiserver.state.lock:
        pods = list(apiserver.state.objects["pods"].values())
    for pod in pods:
        status = pod.get("status", {})
        if status.get("qosClass") != "BestEffort" or status.get("phase") in ("Succeeded", "Failed"):
            continue
        resources = [c.get("resources", {}) for c in pod["spec"].get("containers", [])]
        if any("nvidia.com/" in key for r in resources for part in r.values() for key in part):
            ns = pod["metadata"]["namespace"]
            counts[ns] = counts.get(ns, 0) + 1
    return counts


def test_cut_stalled_gone_watches_api_and_database_outages(apiserver, store, controllers):
    ctl = start(apiserver, store, controllers)
    ready(store)
    driver, marks = drive_through_cut_and_stall(apiserver, store, WL)
    apiserver.force_gone()  # every version is too old now: 410 and relist
    apiserver.refuse_for(0.7)
    time.sleep(1.0)
    driver.run(until=marks[3])
    wait_for(lambda: caught_up(store, apiserver), 20, "catch-up after 410")
    store.outage.begin()
    try:
        driver.run(until=marks[4])
        wait_for(
            lambda: metric(ctl.metrics(), "gpuquota_controller_database_errors_total") >= 2,
            20,
            "failed writes",
        )
        driver.run()
        time.sleep(0.5)
        assert ctl.proc is not None and ctl.proc.poll() is None, (
            "the controller must survive the outage"
        )
    finally:
        store.outage.end()
    wait_for(lambda: caught_up(store, apiserver), 30, "catch-up after the outage")
    text = ctl.metrics()
    assert metric(text, "gpuquota_controller_watch_restarts_total", reason="stalled") >= 1
    assert metric(text, "gpuquota_controller_relists_total") >= 1
    # the relist after 410 Gone recorded a gap: the GPUQuotaGapRecorded alert's counter
    assert metric(text, "gpuquota_controller_gaps_total", reason="gone") >= 1
    assert ctl.terminate() == 0
    assert "store is back" in ctl.log()
    assert_exact(store, WL)
    assert not [r for r in store.allocations() if r["estimated"]]


def test_sigkill_at_random_points(apiserver, store, controllers):
    rng = random.Random(store.cluster)
    ctl = start(apiserver, store, controllers)
    ready(store)
    driver = Driver(apiserver, WL, speed=None)
    cuts = sorted(rng.sample(range(WL.start + 60, WL.end - 600), 2))
    for cut in cuts:
        driver.start(until=cut)
        time.sleep(rng.uniform(0.05, 0.6))  # killed wherever it is: applying, flushing...
        ctl.kill()
        driver.wait()
        driver.run(until=cut + 300)  # the cluster moves on while it is down
        ctl = start(apiserver, store, controllers)
    driver.run()
    wait_for(lambda: caught_up(store, apiserver), 30, "catch-up after the restarts")
    assert ctl.terminate() == 0
    assert "resuming the watch from stored version" in ctl.log()
    assert_exact(store, WL)


def test_leader_election_standby_takes_over(apiserver, store, controllers):
    a = start(apiserver, store, controllers, *FAST_LEASE, identity="replica-a")
    ready(store)
    b = start(apiserver, store, controllers, *FAST_LEASE, identity="replica-b")
    driver = Driver(apiserver, WL)
    driver.run(until=WL.start + 1800)
    wait_for(lambda: caught_up(store, apiserver), 20, "catch-up")
    assert store.heartbeat()[0] == "replica-a"
    assert metric(a.metrics(), "gpuquota_controller_leader") == 1
    wait_for(lambda: _up(b), 20, "the standby's metrics")
    assert metric(b.metrics(), "gpuquota_controller_leader") == 0  # standby: does not write
    a.kill()
    driver.run()
    wait_for(
        lambda: (
            (apiserver.get("leases", "gpuquota", "kube-system") or {})
            .get("spec", {})
            .get("holderIdentity")
            == "replica-b"
        ),
        15,
        "the standby to take the lease",
    )
    wait_for(
        lambda: caught_up(store, apiserver) and store.heartbeat()[0] == "replica-b",
        20,
        "catch-up",
    )
    assert b.terminate() == 0
    assert_exact(store, WL)


def _up(ctl: ControllerProcess) -> bool:
    try:
        return bool(ctl.metrics())
    except OSError:
        return False


def test_bad_input_gives_one_clear_line(tmp_path, apiserver):
    db_url = f"sqlite:///{tmp_path / 'q.db'}"
    bad = tmp_path / "bad-kubeconfig"
    bad.write_text("clusters: [this is not: a kubeconfig\n")
    port = free_port()  # nothing listens there
    unreachable = tmp_path / "unreachable"
    unreachable.write_text(
        apiserver.write_kubeconfig(tmp_path / "k")
        .read_text()
        .replace(str(apiserver.port), str(port))
    )
    kc = apiserver.write_kubeconfig(tmp_path / "good")
    cases = {
        "kubeconfig": (["--kubeconfig", str(bad), "--db", db_url], rf"error: kubeconfig {bad}: "),
        "api": (
            [
                "--kubeconfig",
                str(unreachable),
                "--db",
                db_url,
                "--migrate",
                "--startup-timeout",
                "1",
            ],
            rf"error: cannot list Nodes from the Kubernetes API server at http://127.0.0.1:{port}: .*refused",
        ),
        "db": (
            [
                "--kubeconfig",
                str(kc),
                "--db",
                f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test",
            ],
            r"error: cannot connect to database .*refused",
        ),
        "standby": (
            [
                "--kubeconfig",
                str(unreachable),
                "--db",
                f"sqlite:///{tmp_path / 'standby.db'}",  # its own file: migrations run at once
                "--migrate",
                "--lease-name",
                "x",
                "--startup-timeout",
                "1",
            ],
            rf"error: cannot reach the Kubernetes API server at http://127.0.0.1:{port}: .*refused",
        ),
        "lease": (
            [
                "--kubeconfig",
                str(kc),
                "--lease-name",
                "x",
                "--lease-duration",
                "2",
                "--renew-deadline",
                "2",
            ],
            r"error: --lease-duration must be greater than --renew-deadline",
        ),
        "ledger-url": (
            ["--kubeconfig", str(kc), "--ledger-prometheus-url", "prometheus:9090"],
            r"error: --ledger-prometheus-url: 'prometheus:9090' is not an http\(s\) URL",
        ),
        "ledger-window": (
            [
                "--kubeconfig",
                str(kc),
                "--ledger-prometheus-url",
                "http://prometheus:9090",
                "--ledger-window",
                "7m",
            ],
            r"error: --ledger-window: 420s must divide a day",
        ),
        "ledger-rollup-after": (
            [
                "--kubeconfig",
                str(kc),
                "--ledger-prometheus-url",
                "http://prometheus:9090",
                "--ledger-rollup-after",
                "sometimes",
            ],
            r"error: argument --ledger-rollup-after: invalid duration 'sometimes'",
        ),
        "ledger-rollup-tz": (
            [
                "--kubeconfig",
                str(kc),
                "--ledger-prometheus-url",
                "http://prometheus:9090",
                "--ledger-rollup-tz",
                "Europe/Atlantis",
            ],
            r"error: --ledger-rollup-tz: unknown time zone 'Europe/Atlantis'",
        ),
    }
    # all at once: each is a fresh interpreter importing the kubernetes client
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuquota.quota.cli",
                "controller",
                "--metrics-port",
                "0",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for name, (args, _) in cases.items()
    }
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=60)
        # bad input exits 2; an API server or database that does not answer is the
        # environment, 1 (the command-line convention, docs/operations.md)
        expected = 1 if name in ("api", "db", "standby") else 2
        assert proc.returncode == expected, (name, err)
        last = err.strip().splitlines()[-1]
        assert re.search(cases[name][1], last), (name, err)
        if name in ("kubeconfig", "lease", "db"):
            assert len(err.strip().splitlines()) == 1, err


def test_leader_that_cannot_renew_stops_writing(apiserver, tmp_path, controllers):
    """API server unreachable past the renew deadline: the leader exits (1) instead of
    writing on without a Lease (the library alone would lose its renew thread)."""
    from gpuquota.quota.store import db
    from tests.controller.conftest import Store

    url = f"sqlite:///{tmp_path / 'q.db'}?timeout=0.5"
    db.upgrade(url)
    store = Store("sqlite", url, url, None)
    ctl = start(apiserver, store, controllers, *FAST_LEASE, identity="replica-a")
    ready(store)
    apiserver.refuse_for(6.0)
    assert ctl.proc is not None
    assert ctl.proc.wait(30) == 1
    assert "lost the lease kube-system/gpuquota" in ctl.log()
    store.engine.dispose()
