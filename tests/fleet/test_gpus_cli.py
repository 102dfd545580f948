"""`gpuquota gpus` on the scenario's history (tests/fleet/scenario.py) ingested from a real
Prometheus into a store of either kind: per GPU worst first, failure rates per group over
observed time, the RMA evidence file, and no data as exit 2 with one line."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuquota.quota import cli
from gpuquota.quota.accounting.rows import AllocationRow, Batch
from gpuquota.quota.ledger.ingest import Ingester
from gpuquota.quota.store.db import open_store
from tests.fleet.scenario import END, MODEL, PODS, WINDOW, A, B, D
from tests.fleet.test_history import TURNS, settings
from tests.prometheus import Prometheus


def allocation(namespace: str, pod: str, uid: str, start: int, stop: int) -> AllocationRow:
    ended = None if stop >= END else stop
    return AllocationRow(
        pod_uid=uid, resource_name="nvidia.com/gpu", namespace=namespace, pod_name=pod,
        owner_kind=None, owner_name=None, node="node-1", node_pool=None, gpu_model=MODEL,
        raw_units=1, physical_gpus=1.0, replicas=None, sharing_strategy=None, mig_profile=None,
        started_at=start, ended_at=ended, end_reason="deleted" if ended else None,
        estimated=False, qos_class=None, updated_at=stop, share_numerator=1, share_denominator=1,
    )  # fmt: skip


def iso(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def gpus(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["gpus", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_gpus_per_board_rates_and_evidence(
    fleet_prometheus: Prometheus,
    db_url: str,
    cluster: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the controller's ledger process: the usage ledger's windows, then the fleet history's
    ingester = Ingester(
        db_url, cluster, settings(fleet_prometheus.url), clock=lambda: D + 300, turns=TURNS
    )
    ingester.run_once()
    ingester.stop()
    with open_store(db_url) as store:  # the pods' allocations, as the controller wrote them
        store.write(
            cluster,
            Batch(allocations=[allocation(*pod) for pod in PODS], observed_at=END),
        )
    period = ["--db", db_url, "--cluster", cluster, "--from", iso(A), "--to", iso(D)]

    code, out, err = gpus(capsys, *period, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    worst, moved, new = doc["gpus"]
    assert [worst["serial"], moved["serial"], new["serial"]] == ["S1", "S2", "S3"]
    assert worst["fences"] == [
        iso(A + 600).replace("Z", "+00:00"),
        iso(B + 300).replace("Z", "+00:00"),
    ]
    assert worst["fenced_hours"] == 0.5
    assert worst["xids"] == {"13": 1, "79": 2}
    first, second = worst["recoveries"]
    assert (first["held_hours"], first["relapse"], first["holding"]) == (2100 / 3600, True, False)
    assert (second["held_hours"], second["relapse"], second["holding"]) == (
        6300 / 3600,
        False,
        True,
    )
    assert worst["relapses"] == 1
    # moved: both nodes, the gap unknown (not healthy), its remapped rows' increase
    assert moved["nodes"] == ["node-1", "node-2"]
    assert moved["uuids"] == ["GPU-b1", "GPU-b2"]
    assert moved["unknown_hours"] == 1215 / 3600
    assert moved["observed_hours"] == (3 * WINDOW - 1215) / 3600
    assert moved["memory_increase"] == {"gpu_remapped_rows_total:correctable": 3.0}
    assert moved["gaps"] == 1
    assert new["state"] == "degraded" and new["fences"] == []

    # the table and CSV show the same, worst first
    code, out, _ = gpus(capsys, *period)
    lines = out.splitlines()
    assert code == 0 and lines[1].split()[0] == "SERIAL"
    assert lines[2].startswith("S1 ") and "79x2" in lines[2] and "relapse" in lines[2]
    assert "node-1 -> node-2" in lines[3]
    code, out, _ = gpus(capsys, *period, "--format", "csv")
    assert out.splitlines()[0].startswith("serial,model,where,observed_h,fenced_h")

    # failure rates per node over observed GPU-days: S1's two fences were on node-1; a few
    # GPU-hours are under the floor (10 GPU-days): no rate, and a note that says why
    code, out, _ = gpus(capsys, *period, "--by", "node", "--json")
    doc = json.loads(out)
    assert doc["rate_floor_gpu_days"] == 10
    groups = {g["group"]: g for g in doc["groups"]}
    assert groups["node-1"]["fences"] == 2 and groups["node-1"]["fences_per_1000_gpu_days"] is None
    assert "under 10 observed GPU-days" in groups["node-1"]["note"]
    code, out, _ = gpus(capsys, *period, "--by", "node", "--format", "csv")
    rows = {r["group"]: r for r in csv.DictReader(io.StringIO(out))}
    assert rows["node-1"]["fences_per_1000_gpu_days"] == "" and rows["node-1"]["note"]
    assert float(rows["node-1"]["observed_gpu_days"]) == (3 * WINDOW + 2985) / 86400  # exact
    code, out, _ = gpus(capsys, *period, "--by", "node")
    assert " -  " in out.splitlines()[2] and "too few for a rate" in out.splitlines()[-1]
    code, out, _ = gpus(capsys, *period, "--by", "node", "--json", "--min-gpu-days", "0")
    groups = {g["group"]: g for g in json.loads(out)["groups"]}
    node1, node2 = groups["node-1"], groups["node-2"]
    observed1 = (3 * WINDOW + 2985) / 86400
    assert node1["observed_gpu_days"] == pytest.approx(observed1)
    assert node1["fences_per_1000_gpu_days"] == pytest.approx(2 / observed1 * 1000)
    assert (node1["gpus"], node1["relapses"], node1["xids"]) == (2, 1, 3)
    assert node2["fences"] == 0 and node2["fences_per_1000_gpu_days"] == 0
    assert node2["observed_gpu_days"] == pytest.approx((2 * 3000 + WINDOW * 2) / 86400)

    # what the fences cost: train-0 lost 300 s (fence at A+600, the pod ended at A+900),
    # eval-0 the whole second fence (600 s)
    code, out, _ = gpus(capsys, *period, "--cost", "--json")
    lost = {n["namespace"]: n for n in json.loads(out)["namespaces"]}
    assert lost["team-a"]["gpu_hours_lost"] == 300 / 3600
    assert lost["team-b"]["gpu_hours_lost"] == 600 / 3600
    assert (lost["team-a"]["pods"], lost["team-b"]["pods"]) == (["train-0"], ["eval-0"])
    assert list(lost) == ["team-b", "team-a"]  # most first

    # the RMA evidence file: identity and whole timeline
    base = tmp_path / "rma-s2"
    code, out, err = gpus(
        capsys, "--db", db_url, "--cluster", cluster, "--serial", "S2", "--evidence", str(base)
    )
    assert (code, out) == (0, "") and "wrote" in err
    evidence = json.loads(base.with_suffix(".json").read_text())
    assert evidence["board"]["serial"] == "S2"
    assert [p["identity"]["node"] for p in evidence["placements"]] == ["node-1", "node-2"]
    kinds = [e["kind"] for e in evidence["timeline"]]
    assert "gap" in kinds and kinds.count("identity") == 2
    text = base.with_suffix(".txt").read_text()
    assert "RMA evidence for GPU serial S2" in text and "not seen for" in text

    # no data: exit 2 and one line, nothing on stdout
    code, out, err = gpus(
        capsys, "--db", db_url, "--cluster", cluster, "--from", "2001-01-01", "--to", "2001-02-01"
    )
    assert (code, out) == (2, "") and err.count("\n") == 1 and "no GPU history" in err
    assert f"ingested up to {iso(D).replace('Z', '+00:00')}" in err  # the period is too early
    # a store (or cluster) without any fleet history: which store has it, and the flag's name
    code, out, err = gpus(capsys, "--db", db_url, "--cluster", cluster + "-none", "--last", "7d")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "--ledger-prometheus-url" in err and "give that store with --db" in err
    code, out, err = gpus(
        capsys, "--db", db_url, "--cluster", cluster, "--serial", "nope", "--evidence"
    )
    assert (code, out) == (2, "") and "no GPU with serial 'nope'" in err
