"""`gpuquota remediate` on the command line: flags that would do nothing, or cannot be right,
are refused with exit 2 and one line; a restart keeps the fleet budget (the store holds it);
`gpuquota gpus --serial S` shows which pods a board's fences evicted, and when."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, insert

from gpuquota.quota import cli
from gpuquota.quota.store.models import GpuBoard, GpuObservation
from tests.remediation.cluster import Cluster, uuid_of


def remediate(cluster: Cluster, tmp_path: Path, *args: str) -> int:
    return cli.main(
        ["remediate", f"--kubeconfig={tmp_path / 'kubeconfig'}", f"--db={cluster.db_url}",
         "--cluster=test", "--metrics-port=0", "--once", *args]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "nothing to do: give --condition"),
        (["--dry-run"], "nothing to do"),
        (["--condition", "--evict-max", "5"], "--evict-max only make(s) sense with --evict"),
        (["--condition", "--evict-window", "1h"], "--evict-window only make(s) sense with --evict"),
        (["--condition", "--evict-after", "5m"], "--evict-after only make(s) sense with --evict"),
        (["--evict", "--evict-max", "99999999999999999999"], "give 1 to 10000"),
        (["--evict", "--evict-max", "0"], "give 1 to 10000"),
        (["--evict", "--evict-window", "99999999999999999999d"], "too long"),
        # db prune keeps a week of eviction rows: a longer window would lose rows it counts
        (["--evict", "--evict-window", "8d"], "--evict-window: at most 1w"),
        (
            [
                "--condition",
                "--lease-name",
                "r",
                "--lease-duration",
                "5s",
                "--renew-deadline",
                "10s",
            ],
            "--lease-duration must be greater than --renew-deadline",
        ),
        # a dry run's Lease is the name given plus -dry-run: a real instance never takes one
        (
            ["--condition", "--lease-name", "gpuquota-remediate-dry-run"],
            "a name ending in -dry-run is a dry run's Lease",
        ),
        (["--evict", "--breaker-share", "0"], "--breaker-share"),
        (["--evict", "--breaker-share", "150%"], "--breaker-share"),
        (["--evict", "--breaker-min-nodes", "0"], "give 1 to"),
    ],
)
def test_flags_that_do_nothing_or_cannot_hold_are_refused(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.main(["remediate", "--db", f"sqlite:///{tmp_path / 'none.db'}", *args])
    except SystemExit as exc:  # values argparse refuses itself
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.count("error:") == 1
    assert not (tmp_path / "none.db").exists()  # refused before anything was opened


def test_a_restarted_remediate_keeps_the_fleet_budget(cluster: Cluster, tmp_path: Path) -> None:
    for name in ("node-a", "node-b", "node-c"):
        cluster.add_node(name)
    cluster.add_pod("ml", "one", "node-a", {uuid_of("node-a", 0): "Unhealthy"})
    cluster.add_pod("ml", "two", "node-a", {uuid_of("node-a", 1): "Unhealthy"})
    cluster.agents["node-a"].xid(0, 79)
    cluster.agents["node-a"].xid(1, 79)
    flags = ("--evict", "--evict-max=1", "--evict-window=1h", "--evict-after=100ms")
    assert remediate(cluster, tmp_path, *flags) == 0
    assert cluster.server.count("pods") == 1
    for _ in range(2):  # each run a new process's worth of state: only the store remembers
        assert remediate(cluster, tmp_path, *flags) == 0
    assert cluster.server.count("pods") == 1


def test_gpus_serial_shows_the_pods_its_fences_evicted(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add_node("node-a")
    cluster.add_node("node-b")
    bad = uuid_of("node-a", 0)
    cluster.add_pod("ml", "train", "node-a", {bad: "Unhealthy"}, uid="uid-train")
    cluster.add_pod("ml", "other", "node-a", {uuid_of("node-a", 1): "Healthy"})
    cluster.agents["node-a"].xid(0, 79)
    assert remediate(cluster, tmp_path, "--condition", "--evict", "--evict-after=100ms") == 0
    assert cluster.server.get("pods", "train", "ml") is None
    # the fleet history knows the board by its serial (as the controller's ingestion writes it)
    engine = create_engine(cluster.db_url)
    now = int(time.time())
    with engine.begin() as conn:
        board = conn.execute(
            insert(GpuBoard.__table__).values(  # type: ignore[arg-type]
                cluster="test", serial="1654922005863", first_seen=now - 3600, last_seen=now
            )
        ).inserted_primary_key[0]  # type: ignore[index]
        stretch = {
            "board_id": board, "window_start": now - 3600, "started_at": now - 3600,
            "ended_at": now, "cluster": "test", "uuid": bad, "node": "node-a",
            "pci_bus_id": None, "model": "L4", "driver_version": None, "vbios_version": None,
            "state": "unhealthy", "lost": False,
        }  # fmt: skip
        conn.execute(insert(GpuObservation.__table__).values(**stretch))  # type: ignore[arg-type]
    engine.dispose()
    capsys.readouterr()
    later = datetime.fromtimestamp(now + 60, UTC).isoformat()  # the acts' second is in the past
    base = ["gpus", "--db", cluster.db_url, "--last", "1d", "--now", later,
            "--serial", "1654922005863"]  # fmt: skip
    assert cli.main(base) == 0
    out = capsys.readouterr().out
    assert "pods acted on for its fences" in out
    assert "condition marked" in " ".join(out.split()) and "ml/train (uid uid-train)" in out
    assert "evict evicted" in " ".join(out.split())
    assert "ml/other" not in out
    assert cli.main([*base, "--json"]) == 0
    [gpu] = json.loads(capsys.readouterr().out)["gpus"]
    evicted = [a for a in gpu["pod_actions"] if a["action"] == "evict"]
    assert [(a["result"], a["pod"], a["pod_uid"], a["devices"]) for a in evicted] == [
        ("evicted", "train", "uid-train", [bad])
    ]
