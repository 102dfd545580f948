"""Utilisation from Prometheus: the PromQL query, the HTTP error paths against a local HTTP
server returning canned Prometheus API JSON, and a real Prometheus loaded with backfilled
exporter series (promtool tsdb create-blocks-from openmetrics)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.quota.report.prometheus import busy_query, step_for
from tests.report.conftest import Store, ts
from tests.report.helpers import Canned, assert_refused, closed_port, vector

OCT = ts("2026-10-01T00:00:00")
H = 3600


def test_query_joins_utilisation_with_pod_attribution() -> None:
    pods = "max by (uuid, namespace, pod) (gpu_pod_info)"
    even = (
        "(max by (uuid) (gpu_utilization_ratio)"
        f" * on (uuid) group_right {pods}) / on (uuid) group_left count by (uuid) ({pods})"
    )
    own = 'sum by (uuid, namespace, pod) (gpu_pod_sm_utilization_ratio{owner="pod",pod!=""})'
    # each pod's own SM use where the exporter measures it, else an even split of the GPU
    assert busy_query(86400, 9) == (
        f"sum by (namespace) (sum_over_time(({own} or ({even} unless on (uuid) {own}))"
        "[86400s:9s])) * 9"
    )
    measured = even.replace(
        "max by (uuid) (gpu_utilization_ratio)", "(max by (uuid) (gpu_utilization_ratio) * 0 + 1)"
    )
    assert busy_query(600, 1, measured=True, by=("namespace", "pod")) == (
        f"sum by (namespace, pod) (sum_over_time(({measured})[600s:1s])) * 1"
    )
    assert step_for(31 * 86400) == 268
    assert step_for(600) == 1


@pytest.fixture
def canned() -> Iterator[Canned]:
    server = Canned()
    yield server
    server.close()


def test_utilisation_columns_from_canned_answer(
    canned: Canned, sqlite_store: Store, report: Any
) -> None:
    sqlite_store.clear()
    sqlite_store.alloc("ml", OCT, OCT + 2 * H, units=2)  # 4 GPU-hours
    sqlite_store.alloc("web", OCT, OCT + H)
    canned.bodies = {
        busy_query(86400, step_for(86400)): vector({"ml": 3 * H, "web": 0.0, "other": 5.0}),
        busy_query(86400, step_for(86400), measured=True): vector(
            {"ml": 4 * H, "web": H, "other": 5.0}
        ),
    }
    result = report(
        "--from",
        "2026-10-01",
        "--to",
        "2026-10-02",
        "--prometheus",
        canned.url,
        "--json",
        "--now",
        "2026-11-01T00:00:00Z",
        db=sqlite_store,
    )
    assert result.rc == 0, result.err
    doc = json.loads(result.out)
    rows = {r["group"]["namespace"]: r for r in doc["rows"]}
    assert rows["ml"]["utilisation_pct"] == 75.0
    assert rows["ml"]["used_gpu_hours"] == 3.0
    assert rows["ml"]["idle_while_allocated_gpu_hours"] == 1.0
    assert rows["web"]["utilisation_pct"] == 0.0
    assert doc["total"]["utilisation_pct"] == 60.0
    params, sampled = canned.requests
    assert params["time"] == sampled["time"] == [str(OCT + 86400)]
    assert params["query"] == [busy_query(86400, step_for(86400))]
    assert sampled["query"] == [busy_query(86400, step_for(86400), measured=True)]
    assert rows["ml"]["measured_pct"] == 100.0


@pytest.mark.parametrize(
    ("status", "body", "needle"),
    [
        (
            400,
            b'{"status":"error","errorType":"bad_data","error":"parse error at char 5"}',
            "bad_data: parse error",
        ),
        (503, b"Service Unavailable", "HTTP 503"),
        (200, b"<html>not prometheus</html>", "not JSON"),
        (
            200,
            b'{"status":"success","data":{"resultType":"matrix","result":[]}}',
            "expected a vector",
        ),
    ],
)
def test_prometheus_errors_refuse_the_report(
    canned: Canned, sqlite_store: Store, report: Any, status: int, body: bytes, needle: str
) -> None:
    canned.status, canned.body = status, body
    result = report("--last", "1d", "--prometheus", canned.url, db=sqlite_store)
    # a Prometheus that answers 5xx is the environment (1); a wrong answer is bad input (2)
    assert_refused(result, needle, status=1 if status >= 500 else 2)


def _openmetrics(start: int, end: int) -> str:
    lines = ["# TYPE gpu_utilization_ratio gauge"]
    times = range(start, end, 15)
    for uuid, util in (("GPU-a", 0.5), ("GPU-b", 1.0)):
        lines += [f'gpu_utilization_ratio{{gpu="0",uuid="{uuid}"}} {util} {t}' for t in times]
    lines.append("# TYPE gpu_pod_info gauge")
    # GPU-a held by one pod of ml; GPU-b time-sliced between a pod of ml and one of web
    for uuid, ns, pod in (("GPU-a", "ml", "a"), ("GPU-b", "ml", "b"), ("GPU-b", "web", "c")):
        lines += [
            f'gpu_pod_info{{uuid="{uuid}",namespace="{ns}",pod="{pod}"}} 1 {t}' for t in times
        ]
    return "\n".join([*lines, "# EOF", ""])


@contextlib.contextmanager
def real_prometheus(openmetrics: str) -> Iterator[str]:
    """A real Prometheus serving `openmetrics` backfilled with promtool; yields its URL."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        pytest.skip("prometheus/promtool not installed (apt-get install -y prometheus)")
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="rprom"))
    try:
        (work / "data.om").write_text(openmetrics)
        subprocess.run(
            [
                promtool,
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                str(work / "data.om"),
                str(work / "tsdb"),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        (work / "prometheus.yml").write_text("global: {}\nscrape_configs: []\n")
        port = closed_port()
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "prometheus did not become ready"
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.prometheus
@pytest.mark.slow
def test_against_real_prometheus(sqlite_store: Store, report: Any) -> None:
    w0 = (int(time.time()) // H - 3) * H
    w1 = w0 + H
    with real_prometheus(_openmetrics(w0 - 600, w1 + 600)) as url:
        sqlite_store.clear()
        sqlite_store.alloc("ml", w0 - 600, None)  # GPU-a, whole GPU
        sqlite_store.alloc("ml", w0 - 600, None, physical=0.5, replicas=2)  # half of GPU-b
        sqlite_store.alloc("web", w0 - 600, None, physical=0.5, replicas=2)  # the other half
        result = report(
            "--from", _iso(w0), "--to", _iso(w1), "--prometheus", url, "--json", db=sqlite_store
        )
        assert result.rc == 0, result.err
        rows = {r["group"]["namespace"]: r for r in json.loads(result.out)["rows"]}
        # ml: GPU-a busy half the hour + its half of GPU-b fully busy = 1.0 busy of 1.5 held
        # JSON is exact; Prometheus' answers are sampled, so within a few seconds
        assert rows["ml"]["used_gpu_hours"] == pytest.approx(1.0, abs=0.005)
        assert rows["ml"]["utilisation_pct"] == pytest.approx(66.7, abs=0.05)
        assert rows["web"]["used_gpu_hours"] == pytest.approx(0.5, abs=0.005)
        assert rows["web"]["utilisation_pct"] == pytest.approx(100.0, abs=0.05)


def _openmetrics_per_pod(start: int, end: int) -> str:
    """GPU-a (util 0.5) held by ml/a alone, no per-pod series; GPU-b (util 0.6) time-sliced
    between ml/b and web/c, whose exporter runs --pod-usage: ml/b uses 0.4, web/c 0.2."""
    times = range(start, end, 15)
    lines = ["# TYPE gpu_utilization_ratio gauge"]
    for uuid, util in (("GPU-a", 0.5), ("GPU-b", 0.6)):
        lines += [f'gpu_utilization_ratio{{gpu="0",uuid="{uuid}"}} {util} {t}' for t in times]
    lines.append("# TYPE gpu_pod_info gauge")
    for uuid, ns, pod in (("GPU-a", "ml", "a"), ("GPU-b", "ml", "b"), ("GPU-b", "web", "c")):
        lines += [
            f'gpu_pod_info{{uuid="{uuid}",namespace="{ns}",pod="{pod}",container="main"}} 1 {t}'
            for t in times
        ]
    lines.append("# TYPE gpu_pod_sm_utilization_ratio gauge")
    for ns, pod, container, owner, sm in (
        ("ml", "b", "main", "pod", 0.3),
        ("ml", "b", "sidecar", "pod", 0.1),  # a pod's containers add up
        ("web", "c", "main", "pod", 0.2),
        ("", "", "", "host", 0.3),
    ):
        labels = (
            f'uuid="GPU-b",namespace="{ns}",pod="{pod}",container="{container}",owner="{owner}"'
        )
        lines += [f"gpu_pod_sm_utilization_ratio{{{labels}}} {sm} {t}" for t in times]
    # a process on GPU-a of a pod that holds no GPU through the kubelet: named by UID alone
    # (issue 35); ml/a's share of GPU-a stays the device's utilisation
    labels = 'uuid="GPU-a",namespace="",pod="",container="",owner="pod",pod_uid="u-1"'
    lines += [f"gpu_pod_sm_utilization_ratio{{{labels}}} 0.1 {t}" for t in times]
    return "\n".join([*lines, "# EOF", ""])


@pytest.mark.prometheus
@pytest.mark.slow
def test_utilisation_weighted_by_every_key(sqlite_store: Store, report: Any) -> None:
    w0 = (int(time.time()) // H - 3) * H
    w1 = w0 + H
    with real_prometheus(_openmetrics_per_pod(w0 - 600, w1 + 600)) as url:
        sqlite_store.clear()
        sqlite_store.alloc("ml", w0 - 600, None, pod="a", owner=("Job", "solo"), node="n1")
        for ns, pod in (("ml", "b"), ("web", "c")):
            sqlite_store.alloc(ns, w0 - 600, None, physical=0.5, replicas=2, pod=pod,
                               owner=("Job", "shared"), node="n2")  # fmt: skip
        sqlite_store.labels("ml", {"team": "research"}, w0 - 3600, None)
        sqlite_store.labels("web", {"team": "product"}, w0 - 3600, None)

        def rows(*by: str) -> dict[tuple[Any, ...], dict[str, Any]]:
            result = report("--from", _iso(w0), "--to", _iso(w1), "--prometheus", url,
                            "--json", *by, db=sqlite_store)  # fmt: skip
            assert result.rc == 0, result.err
            doc = json.loads(result.out)
            return {tuple(r["group"].values()): r for r in doc["rows"]}

        def check(got: dict[str, Any], used: float, pct: float) -> None:
            # JSON is exact (docs/report.md, "Rounding"): to the table's places
            shown = (round(got["used_gpu_hours"], 2), round(got["utilisation_pct"], 1))
            assert shown == (used, pct), got

        # each pod charged its own SM use (0.4 and 0.2), not an even 0.3 each; the host
        # process's 0.3 is no pod's; GPU-a without per-pod series splits evenly (one pod)
        by_ns = rows()
        check(by_ns[("ml",)], 0.9, 60.0)
        check(by_ns[("web",)], 0.2, 40.0)
        by_pod = rows("--by", "pod")
        check(by_pod[("ml/a",)], 0.5, 50.0)
        check(by_pod[("ml/b",)], 0.4, 80.0)
        check(by_pod[("web/c",)], 0.2, 40.0)
        by_owner = rows("--by", "owner")
        check(by_owner[("ml/Job/solo",)], 0.5, 50.0)
        # one Job name in two namespaces: two owners (issue #27)
        check(by_owner[("ml/Job/shared",)], 0.4, 80.0)
        check(by_owner[("web/Job/shared",)], 0.2, 40.0)
        by_node = rows("--by", "node,namespace")
        check(by_node[("n2", "ml")], 0.4, 80.0)
        check(by_node[("n1", "ml")], 0.5, 50.0)
        by_team = rows("--by", "label:team")
        check(by_team[("research",)], 0.9, 60.0)
        check(by_team[("product",)], 0.2, 40.0)
        by_model = rows("--by", "model")
        (only,) = by_model.values()
        check(only, 1.1, 55.0)


def _iso(t: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat()


def test_query_uses_the_exporters_metric_names() -> None:
    """The PromQL joins what the exporter's metric table (the one source of names) exposes."""
    from gpuquota.exporter.expose import metrics
    from gpuquota.quota.report.prometheus import (
        DEVICE_LABEL,
        JOIN_METRIC,
        POD_UTIL_METRIC,
        UTIL_METRIC,
    )

    rows = {m.name: m for m in metrics.METRICS if m.compat is None}
    assert rows[UTIL_METRIC].unit == "ratio"
    assert rows[POD_UTIL_METRIC].unit == "ratio"
    assert {"uuid", "namespace", "pod", "owner"} <= {
        *metrics.DEVICE_LABELS,
        *rows[POD_UTIL_METRIC].labels,
    }
    assert DEVICE_LABEL in metrics.DEVICE_LABELS
    assert {"namespace", "pod"} <= set(rows[JOIN_METRIC].labels)


def _two_clusters(start: int, end: int) -> str:
    """``_openmetrics`` as cluster c1's, beside cluster c2's agents (another GPU, fully busy,
    held by a pod of the same namespace and name), in one Prometheus that tells them apart
    by a ``cluster`` label (Thanos, Mimir, a shared Prometheus)."""
    families: dict[str, list[str]] = {}
    for cluster, text in (
        ("c1", _openmetrics(start, end)),
        ("c2", _openmetrics(start, end).replace('"GPU-a"} 0.5', '"GPU-a"} 1.0')),
    ):
        family = ""
        for line in text.splitlines():
            if line.startswith("# TYPE"):
                family = line
            elif line and line != "# EOF":
                labelled = line.replace("{", f'{{cluster="{cluster}",', 1)
                families.setdefault(family, []).append(labelled.replace("GPU-", f"GPU-{cluster}"))
    lines = [x for family, samples in families.items() for x in (family, *samples)]
    return "\n".join([*lines, "# EOF", ""])


@pytest.mark.prometheus
@pytest.mark.slow
def test_one_cluster_of_a_shared_prometheus(sqlite_store: Store, report: Any) -> None:
    """--prometheus-cluster-label: c1's report reads c1's series only, the figures of
    test_against_real_prometheus; without it, c2's pod of the same name counts for c1."""
    w0 = (int(time.time()) // H - 3) * H
    w1 = w0 + H
    with real_prometheus(_two_clusters(w0 - 600, w1 + 600)) as url:
        sqlite_store.clear()
        sqlite_store.alloc("ml", w0 - 600, None)
        sqlite_store.alloc("ml", w0 - 600, None, physical=0.5, replicas=2)
        sqlite_store.alloc("web", w0 - 600, None, physical=0.5, replicas=2)
        asked = ("--from", _iso(w0), "--to", _iso(w1), "--prometheus", url, "--json")
        used = {}
        for label in ("cluster", ""):
            result = report(
                *asked, "--cluster", "c1", "--prometheus-cluster-label", label, db=sqlite_store
            )
            assert result.rc == 0, result.err
            rows = {r["group"]["namespace"]: r for r in json.loads(result.out)["rows"]}
            used[label] = {ns: r["used_gpu_hours"] for ns, r in rows.items()}
        assert used["cluster"] == pytest.approx({"ml": 1.0, "web": 0.5}, abs=0.005)
        assert used[""]["ml"] == pytest.approx(1.5, abs=0.005)  # capped by what ml held
