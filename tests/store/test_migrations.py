"""The migrations create exactly the schema of models.py, both ways, on both databases,
and ship inside the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

from gpuquota.quota import cli
from gpuquota.quota.store import db
from gpuquota.quota.store.models import Base
from tests.test_wheel import NOT_SOURCES

ROOT = Path(__file__).resolve().parents[2]
TABLES = {
    "allocations",
    "claim_allocations",
    "clusters",
    "gaps",
    "heartbeats",
    "ledger_progress",
    "namespace_labels",
    "node_capacity",
    "quota_samples",
    "usage_devices",
    "usage_series",
    "usage_windows",
    "gpu_boards",
    "gpu_observations",
    "gpu_events",
    "gpu_history_progress",
    "remediation_actions",
}
LEDGER = {"usage_series", "usage_windows", "ledger_progress"}  # migration 0008
DEVICES = {"usage_devices"}  # migration 0010
FLEET = {"gpu_boards", "gpu_observations", "gpu_events", "gpu_history_progress"}  # 0011
REMEDIATION = {"remediation_actions"}  # 0012


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_fleet_history_migration_steps_up_and_down(empty_db_url: str) -> None:
    db.upgrade(empty_db_url, "0010")
    assert not tables(empty_db_url) & FLEET
    db.upgrade(empty_db_url, "0011")
    assert tables(empty_db_url) >= FLEET
    db.downgrade(empty_db_url, "0010")
    assert not tables(empty_db_url) & FLEET
    assert tables(empty_db_url) >= DEVICES


def test_a_store_stamped_with_the_fleet_historys_first_name_reads_and_upgrades(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fleet history shipped as revision "i29_gpu_history" after "0010" (`db current` said
    "0010 (behind, latest is i29_gpu_history)"); it is "0011" now. A store stamped with the
    old name reads as 0011, opens, and its next upgrade restamps it and goes on."""
    db.upgrade(empty_db_url, "0011")
    engine = create_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = 'i29_gpu_history'"))
        assert db.current(empty_db_url) == "0011"
        code = cli.main(["db", "current", "--db", empty_db_url])
        out = capsys.readouterr().out
        assert out.startswith("0011 (") and "i29" not in out
        assert (code == 0) == (db.head_revision() == "0011")
        if db.head_revision() == "0011":
            db.open_store(empty_db_url, read_only=True).close()  # at the latest: it opens
        db.upgrade(empty_db_url)
        with engine.connect() as conn:
            stamp = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
        assert stamp == db.head_revision()
        assert tables(empty_db_url) == TABLES
        # a downgrade from the old name works too
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = 'i29_gpu_history'"))
        db.downgrade(empty_db_url, "0010")
        assert db.current(empty_db_url) == "0010" and not tables(empty_db_url) & FLEET
    finally:
        engine.dispose()


def test_remediation_migration_steps_up_and_down(empty_db_url: str) -> None:
    db.upgrade(empty_db_url, "0011")
    assert not tables(empty_db_url) & REMEDIATION
    db.upgrade(empty_db_url, "0012")
    assert tables(empty_db_url) >= REMEDIATION | FLEET
    db.downgrade(empty_db_url, "0011")
    assert tables(empty_db_url) == TABLES - REMEDIATION


def test_upgrade_from_empty_then_downgrade_to_base(empty_db_url: str) -> None:
    assert db.current(empty_db_url) is None
    assert tables(empty_db_url) == set()
    db.upgrade(empty_db_url)
    assert db.current(empty_db_url) == db.head_revision()
    assert tables(empty_db_url) == TABLES
    db.upgrade(empty_db_url)  # again: nothing to do
    db.downgrade(empty_db_url, "base")
    assert db.current(empty_db_url) is None
    assert tables(empty_db_url) == set()


def test_claim_allocations_migration_steps_up_and_down(empty_db_url: str) -> None:
    db.upgrade(empty_db_url, "0005")
    assert tables(empty_db_url) == (
        TABLES - FLEET - LEDGER - DEVICES - REMEDIATION - {"claim_allocations", "gaps"}
    )
    db.upgrade(empty_db_url, "0006")
    assert "claim_allocations" in tables(empty_db_url)
    db.downgrade(empty_db_url, "0005")
    assert db.current(empty_db_url) == "0005"
    assert tables(empty_db_url) == (
        TABLES - FLEET - LEDGER - DEVICES - REMEDIATION - {"claim_allocations", "gaps"}
    )


def test_usage_ledger_migration_steps_up_and_down(empty_db_url: str) -> None:
    db.upgrade(empty_db_url, "0007")
    assert tables(empty_db_url) == TABLES - REMEDIATION - FLEET - LEDGER - DEVICES
    db.upgrade(empty_db_url, "0008")
    assert tables(empty_db_url) == TABLES - REMEDIATION - FLEET - DEVICES
    db.downgrade(empty_db_url, "0007")
    assert tables(empty_db_url) == TABLES - REMEDIATION - FLEET - LEDGER - DEVICES


def test_ledger_rollup_migration_keeps_progress_both_ways(empty_db_url: str) -> None:
    db.upgrade(empty_db_url, "0008")
    engine = create_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO ledger_progress (cluster, window_seconds, ingested_until,"
                    " updated_at) VALUES ('c', 3600, 7200, 7300)"
                )
            )
        db.upgrade(empty_db_url, "0009")
        with engine.connect() as conn:
            row = conn.execute(text("SELECT ingested_until, rolled_until FROM ledger_progress"))
            assert row.all() == [(7200, None)]  # nothing rolled up yet
        db.downgrade(empty_db_url, "0008")
        with engine.connect() as conn:
            row = conn.execute(text("SELECT cluster, ingested_until FROM ledger_progress"))
            assert row.all() == [("c", 7200)]
            columns = {c["name"] for c in inspect(conn).get_columns("ledger_progress")}
            assert "rolled_until" not in columns
    finally:
        engine.dispose()


SERIES_0009 = text(
    "INSERT INTO usage_series (id, cluster, device_uuid, holder_kind, holder_uid, namespace,"
    " holder_name, node, gpu_model, mig_profile, activity) VALUES (:id, :cluster, :device,"
    " :kind, :uid, :ns, :name, :node, :model, :mig, :activity)"
)
GPU_A = "GPU-2b5b9a54-7c5e-4f0e-9d36-0d6f3c1f7a01"
MIG_B = "MIG-6e1d0c6a-3f3b-5a8e-b1f1-7f5d2a9c4e02"


def _series(id: int, cluster: str, device: str, uid: str, **labels: str | None) -> dict:
    row = {"id": id, "cluster": cluster, "device": device, "uid": uid, "kind": "pod"}
    row.update(ns="ns", name=f"pod-{id}", node=None, model=None, mig=None, activity=None)
    if not uid:
        row.update(kind="unallocated", ns="", name="")
    row.update(labels)
    return row


def test_usage_devices_migration_moves_device_labels_and_back(empty_db_url: str) -> None:
    db.upgrade(empty_db_url, "0009")
    engine = create_engine(empty_db_url)
    series = [
        # GPU_A in c1: its node changed (the latest non-null wins), a model only on an older
        # series, no MIG profile
        _series(1, "c1", GPU_A, "", node="node-1", model="NVIDIA H100 80GB HBM3"),
        _series(2, "c1", GPU_A, "u2", node="node-1", activity="sm_active"),
        _series(3, "c1", GPU_A, "u3", node="node-9", activity="utilization"),
        _series(4, "c1", GPU_A, "u4"),
        # a MIG device in c1, and the same UUID in another cluster: two devices
        _series(5, "c1", MIG_B, "u2", node="node-2", model="NVIDIA A100", mig="3g.40gb"),
        _series(6, "c2", MIG_B, "u6", node="node-7"),
    ]
    windows = text(
        "INSERT INTO usage_windows (series_id, window_start, window_seconds, used_gpu_seconds,"
        " energy_joules, sampled_seconds) VALUES (:id, 3600, 3600, 1.0, 2.0, 3600.0)"
    )
    try:
        with engine.begin() as conn:
            conn.execute(SERIES_0009, series)
            conn.execute(windows, [{"id": s["id"]} for s in series])
        db.upgrade(empty_db_url, "0010")
        with engine.begin() as conn:
            devices = {
                (r.cluster, r.device_uuid): (r.id, r.node, r.gpu_model, r.mig_profile)
                for r in conn.execute(text("SELECT * FROM usage_devices"))
            }
            assert {k: v[1:] for k, v in devices.items()} == {
                ("c1", GPU_A): ("node-9", "NVIDIA H100 80GB HBM3", None),
                ("c1", MIG_B): ("node-2", "NVIDIA A100", "3g.40gb"),
                ("c2", MIG_B): ("node-7", None, None),
            }
            got = conn.execute(
                text(
                    "SELECT id, device_id, cluster, holder_kind, holder_uid, namespace,"
                    " holder_name, activity FROM usage_series ORDER BY id"
                )
            ).all()
            device_of = {1: ("c1", GPU_A), 2: ("c1", GPU_A), 3: ("c1", GPU_A)}
            device_of.update({4: ("c1", GPU_A), 5: ("c1", MIG_B), 6: ("c2", MIG_B)})
            assert [tuple(r) for r in got] == [
                (s["id"], devices[device_of[s["id"]]][0], s["cluster"], s["kind"], s["uid"], *rest)
                for s in series
                for rest in [(s["ns"], s["name"], s["activity"])]
            ]
            columns = {c["name"] for c in inspect(conn).get_columns("usage_series")}
            assert not columns & {"device_uuid", "node", "gpu_model", "mig_profile"}
            # the new key: a holder once per device; new series go on after the kept ids
            with pytest.raises(IntegrityError), conn.begin_nested():
                conn.execute(
                    text(
                        "INSERT INTO usage_series (device_id, cluster, holder_kind, holder_uid,"
                        " namespace, holder_name) VALUES (:d, 'c1', 'pod', 'u2', 'ns', 'x')"
                    ),
                    {"d": devices[("c1", GPU_A)][0]},
                )
            new = conn.execute(
                text(
                    "INSERT INTO usage_series (device_id, cluster, holder_kind, holder_uid,"
                    " namespace, holder_name) VALUES (:d, 'c2', 'pod', 'u7', 'ns', 'pod-7')"
                    " RETURNING id"
                ),
                {"d": devices[("c2", MIG_B)][0]},
            ).scalar_one()
            assert new > len(series)  # (PostgreSQL: the refused insert took a number)
            n = conn.execute(text("SELECT count(*) FROM usage_windows")).scalar_one()
            assert n == len(series)  # the windows keep their series ids
        db.downgrade(empty_db_url, "0009")
        assert "usage_devices" not in tables(empty_db_url)
        with engine.begin() as conn:
            got = conn.execute(
                text(
                    "SELECT id, cluster, device_uuid, holder_kind, holder_uid, namespace,"
                    " holder_name, node, gpu_model, mig_profile, activity FROM usage_series"
                    " ORDER BY id"
                )
            ).all()
            # each series has its device's labels back (those of its device, one per device)
            back = {
                ("c1", GPU_A): ("node-9", "NVIDIA H100 80GB HBM3", None),
                ("c1", MIG_B): ("node-2", "NVIDIA A100", "3g.40gb"),
                ("c2", MIG_B): ("node-7", None, None),
            }
            want = [
                (s["id"], s["cluster"], s["device"], s["kind"], s["uid"], s["ns"], s["name"])
                + back[(s["cluster"], s["device"])]
                + (s["activity"],)
                for s in series
            ]
            want.append((new, "c2", MIG_B, "pod", "u7", "ns", "pod-7", "node-7", None, None, None))
            assert [tuple(r) for r in got] == want
            # the old key again, and ids go on
            with pytest.raises(IntegrityError), conn.begin_nested():
                conn.execute(SERIES_0009, _series(99, "c1", GPU_A, "u2"))
            added = conn.execute(
                text(
                    "INSERT INTO usage_series (cluster, device_uuid, holder_kind, holder_uid,"
                    " namespace, holder_name) VALUES ('c1', :d, 'pod', 'u9', 'ns', 'p')"
                    " RETURNING id"
                ),
                {"d": GPU_A},
            ).scalar_one()
            assert added > new
    finally:
        engine.dispose()


def test_gaps_and_quota_seq_migration_keeps_samples_both_ways(empty_db_url: str) -> None:
    db.upgrade(empty_db_url, "0006")
    engine = create_engine(empty_db_url)
    insert = text(
        "INSERT INTO quota_samples (cluster, namespace, quota_name, resource_name, hard, used,"
        " scopes, observed_at) VALUES ('c', 'ns', 'q', 'requests.nvidia.com/gpu', 2, :used,"
        " '[]', :at)"
    )
    select = text("SELECT observed_at, seq, used FROM quota_samples ORDER BY observed_at, seq")
    try:
        with engine.begin() as conn:
            conn.execute(insert, [{"used": 1, "at": 100}, {"used": 2, "at": 101}])
        db.upgrade(empty_db_url, "0007")
        assert "gaps" in tables(empty_db_url)
        with engine.begin() as conn:
            # an old row is the only one of its second: seq 0; a second change of that second
            # is a new row now, where the old key refused it
            assert [tuple(r) for r in conn.execute(select)] == [(100, 0, 1), (101, 0, 2)]
            conn.execute(
                text(
                    "INSERT INTO quota_samples (cluster, namespace, quota_name, resource_name,"
                    " hard, used, scopes, observed_at, seq) VALUES ('c', 'ns', 'q',"
                    " 'requests.nvidia.com/gpu', 2, 1, '[]', 101, 1)"
                )
            )
        db.downgrade(empty_db_url, "0006")
        # the old key holds one sample a second: the last one of each stays
        with engine.begin() as conn:
            rows = conn.execute(
                text("SELECT observed_at, used FROM quota_samples ORDER BY observed_at")
            )
            assert [tuple(r) for r in rows] == [(100, 1), (101, 1)]
        assert "gaps" not in tables(empty_db_url)
    finally:
        engine.dispose()


# SQLite cannot reflect expression indexes (ix_allocations_duration): they are compared on
# PostgreSQL only
@pytest.mark.filterwarnings("ignore:.*expression-based index")
def test_models_match_migrations(empty_db_url: str) -> None:
    db.upgrade(empty_db_url)
    engine = create_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diffs = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diffs == []


def test_open_store_refuses_an_unmigrated_database(empty_db_url: str) -> None:
    with pytest.raises(db.StoreError, match="gpuquota db upgrade"):
        db.open_store(empty_db_url)
    with db.open_store(empty_db_url, migrate=True) as store:
        assert store.load("any").heartbeat is None


def test_unreachable_database_is_one_clear_error() -> None:
    with pytest.raises(
        db.StoreError,
        match=r"cannot connect to database postgresql\+psycopg://x:\*\*\*@127\.0\.0\.1:1/",
    ):
        db.current("postgresql+psycopg://x:secret@127.0.0.1:1/nothing")
    with pytest.raises(db.StoreError, match="invalid database URL"):
        db.current("not a url")


def test_source_checkout_finds_the_repository_migrations() -> None:
    assert db.migrations_path() == ROOT / "alembic"
    assert not (ROOT / "alembic" / "__init__.py").exists()  # never shadows the library


@pytest.mark.slow
def test_wheel_ships_migrations_as_quota_migrations(tmp_path: Path) -> None:
    # built from a copy of the sources, as tests/test_wheel.py does: a build in the checkout
    # regenerates modules that tests running beside this one import
    sources = tmp_path / "src"
    shutil.copytree(ROOT, sources, symlinks=True, ignore=NOT_SOURCES)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(sources),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        # the build runs protoc plugins installed next to this interpreter
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        },
    )
    (wheel,) = tmp_path.glob("gpuquota-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpuquota/quota/migrations/env.py" in names
    assert "gpuquota/quota/migrations/versions/0001_initial.py" in names
    assert "gpuquota/quota/migrations/script.py.mako" in names
    assert not any(n.startswith("alembic/") for n in names)
    assert not any("__pycache__" in n for n in names)

    # installed from the wheel, the runtime finds and runs its packaged migrations
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    probe = (
        "import sys; from gpuquota.quota.store import db; "
        "db.upgrade(sys.argv[1]); print(db.migrations_path()); print(db.current(sys.argv[1]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, f"sqlite:///{tmp_path / 'w.db'}"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    where, revision = done.stdout.split()
    assert where == str(target / "gpuquota" / "quota" / "migrations")
    assert revision == db.head_revision()


def test_exact_share_migration_fills_old_rows_and_goes_back(empty_db_url: str) -> None:
    db.upgrade(empty_db_url, "0004")
    engine = create_engine(empty_db_url)
    alloc = (
        "INSERT INTO allocations (cluster, pod_uid, namespace, pod_name, resource_name,"
        " raw_units, physical_gpus, started_at, estimated, updated_at)"
        " VALUES ('c', :uid, 'ns', 'p', 'nvidia.com/mig-3g.40gb', :units, :physical, 0, false, 0)"
    )
    cap = (
        "INSERT INTO node_capacity (cluster, node, resource_name, allocatable_units,"
        " physical_gpus, labels, started_at)"
        " VALUES ('c', 'n', 'nvidia.com/gpu', 4, 1.0, '{}', 0)"
    )
    try:
        with engine.begin() as conn:
            conn.execute(text(alloc), {"uid": "mig", "units": 2, "physical": 2 * 3 / 7})
            conn.execute(text(alloc), {"uid": "whole", "units": 3, "physical": 3.0})
            conn.execute(text(cap))  # four time-sliced replicas of one GPU
        db.upgrade(empty_db_url)
        with engine.connect() as conn:
            shares: dict[str, str] = dict(
                conn.execute(
                    text(
                        "SELECT pod_uid, share_numerator || '/' || share_denominator"
                        " FROM allocations"
                    )
                ).all()
            )
            capacity = conn.execute(
                text("SELECT share_numerator, share_denominator, physical_gpus FROM node_capacity")
            ).one()
        assert shares == {"mig": "3/7", "whole": "1/1"}
        assert tuple(capacity) == (1, 4, 1.0)
        db.downgrade(empty_db_url, "0004")
        columns = {c["name"] for c in inspect(engine).get_columns("allocations")}
        assert "share_numerator" not in columns and "physical_gpus" in columns
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM allocations")).scalar() == 2
    finally:
        engine.dispose()
