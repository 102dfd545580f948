"""`gpuquota db` and `gpuquota replay` as users run them, against SQLite and PostgreSQL: the
installed console script in a subprocess for a good file, a bad file and a dead database, and
``gpuquota.quota.cli.main`` in-process for the rest (same code, without the interpreter start-up)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuquota.quota.cli import SUBCOMMANDS, build_parser, main
from gpuquota.quota.store import db
from gpuquota.sim.workload import generate, rfc3339
from tests.accounting.objects import namespace, node, pod, quota
from tests.store import rows

GPUQUOTA = str(Path(sys.executable).parent / "gpuquota")


def gpuquota(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUQUOTA, *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        env={**os.environ, **(env or {})},
    )


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``gpuquota ARGS`` in-process: (exit code, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def events() -> list[dict[str, Any]]:
    return [
        {"type": "ADDED", "object": node(created=10)},
        {"type": "ADDED", "object": namespace(labels={"team": "a"}, created=10)},
        {"type": "ADDED", "object": quota(hard=4, used=0, created=10)},
        {"type": "ADDED", "object": pod("p1", start=None, node=None, phase="Pending")},
        {"type": "MODIFIED", "object": pod("p1", start=1010)},
        {"type": "MODIFIED", "object": pod("p1", start=1010, phase="Succeeded", finished=2000)},
        {
            "type": "DELETED",
            "object": pod(
                "p1", start=1010, phase="Succeeded", finished=2000, deletion=2100, grace=0
            ),
        },
        {
            "type": "ADDED",
            "object": pod("p2", name="other", start=1500),
            "observedAt": "1970-01-01T00:25:00Z",
        },
        {
            "type": "BOOKMARK",
            "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "99"}},
        },
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "100"}}},
        {
            "type": "ADDED",
            "object": {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "x"}},
        },
    ]


def write_lines(path: Path, items: list[Any]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def test_replay_then_replay_again_changes_nothing(
    empty_db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = write_lines(tmp_path / "events.jsonl", events())
    done = gpuquota(
        "replay",
        str(stream),
        "--db",
        empty_db_url,
        "--migrate",
        "--cluster",
        "prod",
        "--flush-every",
        "2",
    )
    assert done.returncode == 0, done.stderr
    assert "replayed 8 events" in done.stdout
    assert "1 ConfigMap" in done.stdout
    with db.open_store(empty_db_url) as store:
        first = rows.everything(store, "prod")
        allocs = first["allocations"]
        assert {
            k: (r["started_at"], r["ended_at"], r["end_reason"]) for k, r in allocs.items()
        } == {
            ("p1", "nvidia.com/gpu"): (1010, 2000, "terminated"),
            ("p2", "nvidia.com/gpu"): (1500, None, None),
        }
        assert first["labels"][0]["labels"] == {"team": "a"}
        code, _, err = cli(capsys, "replay", str(stream), "--db", empty_db_url, "--cluster", "prod")
        assert code == 0, err
        assert rows.everything(store, "prod") == first


def test_replay_reads_kubectl_list_and_pretty_printed_watch_output(
    empty_db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listing = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [node(created=10), pod("p1", start=1010)],
    }
    pod_list = {
        "apiVersion": "v1",
        "kind": "PodList",
        "items": [{k: v for k, v in pod("p2", start=1020).items() if k != "kind"}],
    }
    pretty = json.dumps(listing, indent=4) + "\n" + json.dumps(pod_list, indent=4) + "\n"
    pretty += (
        json.dumps(
            {"type": "MODIFIED", "object": pod("p1", start=1010, phase="Failed", finished=1400)},
            indent=4,
        )
        + "\n"
    )
    stream = tmp_path / "watch.json"
    stream.write_text(pretty)
    code, _, err = cli(
        capsys, "replay", str(stream), "--db", empty_db_url, "--migrate", "--cluster", "k"
    )
    assert code == 0, err
    with db.open_store(empty_db_url) as store:
        allocs = rows.allocations(store, "k")
    assert {k[0]: (r["started_at"], r["ended_at"]) for k, r in allocs.items()} == {
        "p1": (1010, 1400),
        "p2": (1020, None),
    }


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        ('{"type": "ADDED", "object": ', "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"type": "UPSERTED", "object": {}}', "unknown event type 'UPSERTED'"),
        ('{"type": "ADDED", "object": {"metadata": {"name": "x"}}}', "object has no kind"),
        (
            '{"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "x"}}}',
            r"Pod: metadata\.uid: missing",
        ),
        (
            '{"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "x", "uid": "u"}, "status": {"startTime": "noon"}}}',
            "status.startTime",
        ),
        ('{"type": "ADDED", "object": {}, "observedAt": "soon"}', "observedAt"),
        ('{"hello": "world"}', "neither a watch event"),
        # issue 18 (each accepted, or an unexpected OverflowError without a line, on 6c36c52):
        # a time the recording cannot have seen would move its end and every open allocation
        (
            json.dumps({"type": "ADDED", "object": node(), "observedAt": "9999-12-31T23:59:59Z"}),
            r"observedAt 9999-12-31T23:59:59Z is in the future \(now is 20\d\d-",
        ),
        (
            json.dumps({"type": "ADDED", "object": pod("u9", start=253402300799)}),
            r"status\.startTime 9999-12-31T23:59:59Z is later than now \(20\d\d-.*clock skew",
        ),
        (
            json.dumps({"type": "ADDED", "object": pod("u9", start=7200), "observedAt": 3600}),
            r"status\.startTime 1970-01-01T02:00:00Z is later than its observedAt "
            r"\(1970-01-01T01:00:00Z\) by more than the 300 s",
        ),
        (
            '{"type": "ADDED", "object": {}, "observedAt": 1e300}',
            r"observedAt: 1e\+300 is out of range",
        ),
        (
            json.dumps({"type": "ADDED", "object": pod("u9", gpus=10**23)}),
            r"Pod: spec\.containers\[0\]\.resources\..*'nvidia.com/gpu'\]: quantity "
            r"'10{23}' is out of range \(at most 2\^63-1\)",
        ),
        (
            json.dumps({"type": "ADDED", "object": pod("u9", gpus=2_000_000)}),
            r"'2000000' is out of range \(at most 1000000 units\)",
        ),
        (
            json.dumps(
                {
                    "type": "ADDED",
                    "object": quota(hard=4, used=0, created=10)
                    | {"status": {"hard": {"requests.nvidia.com/gpu": "1e99999"}}},
                }
            ),
            r"ResourceQuota: .*out of range",
        ),
    ],
)
def test_malformed_line_names_line_and_cause_and_writes_nothing(
    tmp_path: Path, line: str, cause: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [json.dumps(e) for e in events()[:3]]
    stream = tmp_path / "bad.jsonl"
    stream.write_text("\n".join([*good, line, *good]) + "\n")
    target = tmp_path / "never.db"
    code, out, err = cli(capsys, "replay", str(stream), "--db", f"sqlite:///{target}")
    assert code == 2
    assert out == ""
    message = err.strip()
    assert "\n" not in message
    assert message.startswith(f"gpuquota replay: error: {stream}:4: ")
    assert re.search(cause, message), message
    assert not target.exists()  # checked before the database was touched


def test_bad_file_through_the_console_script(tmp_path: Path) -> None:
    stream = tmp_path / "cut.json"
    stream.write_text(json.dumps(events()[0]) + '\n{\n  "type": "ADDED",\n')
    target = tmp_path / "x.db"
    done = gpuquota("replay", str(stream), "--db", f"sqlite:///{target}")
    assert done.returncode == 2
    assert (
        done.stderr
        == f"gpuquota replay: error: {stream}:2: JSON object starting here is never closed\n"
    )
    assert not target.exists()


def test_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "replay", str(tmp_path / "nope.jsonl"))
    assert code == 2
    assert (
        err
        == f"gpuquota replay: error: {tmp_path / 'nope.jsonl'}: cannot read: No such file or directory\n"
    )


def test_unreachable_database_is_one_line_through_the_console_script(tmp_path: Path) -> None:
    stream = write_lines(tmp_path / "ok.jsonl", events())
    done = gpuquota(
        "replay", str(stream), env={"GPUQUOTA_DB": "postgresql+psycopg://u:secret@127.0.0.1:1/db"}
    )
    assert done.returncode == 1  # the environment, not the input
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "gpuquota: error: cannot connect to database postgresql+psycopg://u:***@127.0.0.1:1/db"
    )
    assert "secret" not in done.stderr


def test_replay_from_stdin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    text = "".join(json.dumps(e) + "\n" for e in events())
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    code, _, err = cli(capsys, "replay", "-", "--db", url, "--migrate")
    assert code == 0, err
    with db.open_store(url) as store:
        assert len(rows.allocations(store, "default")) == 2


def test_db_upgrade_and_current(
    empty_db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = cli(capsys, "db", "current", "--db", empty_db_url)
    assert code == 1
    assert "empty" in out
    monkeypatch.setenv("GPUQUOTA_DB", empty_db_url)
    code, _, err = cli(capsys, "db", "upgrade")
    assert code == 0, err
    code, out, _ = cli(capsys, "db", "current", "--db", empty_db_url)
    assert (code, out.strip()) == (0, f"{db.head_revision()} (latest)")
    code, _, err = cli(capsys, "db", "downgrade", "base", "--db", empty_db_url)
    assert code == 0, err
    assert db.current(empty_db_url) is None


def test_every_subcommand_module_follows_the_frame() -> None:
    parser, modules = build_parser()
    assert [name for name, _, _ in SUBCOMMANDS] == list(modules)
    for module in modules.values():
        assert callable(module.add_arguments) and callable(module.run)
    assert parser.parse_args(["replay", "f", "--db", "sqlite://"]).command == "replay"


def test_replay_killed_mid_way_then_rerun_matches_a_clean_run(
    backend: str, empty_db_url: str, tmp_path: Path
) -> None:
    # long enough that the replay is still writing when the poll below sees 5 rows: 3 h was
    # replayed whole before the first poll once on a loaded machine (PostgreSQL)
    workload = generate(5, 12.0, pods_per_hour=120)
    stream = tmp_path / "w.jsonl"
    stream.write_text("".join(line + "\n" for line in workload.lines()))
    replay = [GPUQUOTA, "replay", str(stream), "--db", empty_db_url, "--migrate"]
    replay += ["--flush-every", "20"]
    victim = subprocess.Popen(
        [*replay, "--cluster", "k"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        written = 0
        while victim.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(db.StoreError):
                if db.current(empty_db_url) is not None:
                    with db.open_store(empty_db_url) as store:
                        written = len(rows.allocations(store, "k"))
            if written >= 5:
                break
            time.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
    finally:
        victim.wait()
    assert victim.returncode == -signal.SIGKILL, "replay finished before it could be killed"
    assert written >= 5
    assert gpuquota(*replay[1:], "--cluster", "k").returncode == 0
    assert gpuquota(*replay[1:], "--cluster", "clean").returncode == 0
    with db.open_store(empty_db_url) as store:
        killed = rows.everything(store, "k", without_updated_at=True)
        assert killed == rows.everything(store, "clean", without_updated_at=True)
        assert len(killed["allocations"]) == len(workload.truth.intervals)


def test_replay_refuses_an_unmigrated_store_like_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    stream = write_lines(tmp_path / "ok.jsonl", events())
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    code, out, err = cli(capsys, "replay", str(stream), "--db", f"sqlite:///{empty}")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "empty database" in err and "gpuquota db upgrade" in err
    missing = tmp_path / "missing.db"
    code, _, err = cli(capsys, "replay", str(stream), "--db", f"sqlite:///{missing}")
    assert code == 2 and "does not exist" in err
    assert not missing.exists()
    code, _, err = cli(capsys, "replay", str(stream), "--db", f"sqlite:///{missing}", "--migrate")
    assert code == 0, err


def test_read_only_commands_create_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.db"
    url = f"sqlite:///{missing}"
    code, out, _ = cli(capsys, "db", "current", "--db", url)
    assert code == 1 and "empty" in out
    code, _, err = cli(capsys, "report", "--db", url)
    assert code == 2 and "does not exist" in err
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    done = gpuquota(
        "controller", "--kubeconfig", str(kubeconfig), "--db", url, "--metrics-port", "0"
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "does not exist" in done.stderr and "gpuquota db upgrade" in done.stderr
    code, _, err = cli(capsys, "db", "upgrade", "9999", "--db", url)
    assert code == 2 and "revision '9999'" in err and "known: head, base, 0001" in err
    assert not missing.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "x.jsonl", "--cluster", ""],
        ["controller", "--metrics-port", "99999"],
        ["replay", "x.jsonl", "--node-pool-label", "a b"],
    ],
    ids=["empty-cluster", "port-out-of-range", "bad-label"],
)
def test_bad_flags_are_one_line(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "x.jsonl").write_text(json.dumps(events()[0]) + "\n")
    argv = [str(tmp_path / a) if a == "x.jsonl" else a for a in argv]
    try:
        code = main([*argv, "--db", f"sqlite:///{tmp_path / 'none.db'}"])
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "error:" in err and "Traceback" not in err


def test_node_pool_label_is_configurable_for_replay_and_report(
    db_url: str,
    cluster: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workload = generate(4, 1.0)
    stream = tmp_path / "w.jsonl"
    stream.write_text("".join(line + "\n" for line in workload.lines()))
    pools = {
        n["metadata"]["labels"]["node-pool"]
        for n in (e.object for e in workload.events if e.object["kind"] == "Node")
    }

    def pools_reported(name: str) -> set[str | None]:
        code, out, err = cli(
            capsys,
            "report",
            "--db",
            db_url,
            "--cluster",
            name,
            "--by",
            "pool",
            "--json",
            "--from",
            rfc3339(workload.start),
            "--to",
            rfc3339(workload.end),
            "--now",
            rfc3339(workload.end),
        )
        assert code == 0, err
        return {r["group"]["pool"] for r in json.loads(out)["rows"]}

    # the generator names pools with `node-pool`, which no built-in label matches
    assert cli(capsys, "replay", str(stream), "--db", db_url, "--cluster", cluster)[0] == 0
    assert pools_reported(cluster) == {None}
    assert (
        cli(
            capsys,
            "replay",
            str(stream),
            "--db",
            db_url,
            "--cluster",
            f"{cluster}-f",
            "--node-pool-label",
            "other,node-pool",
        )[0]
        == 0
    )
    named = pools_reported(f"{cluster}-f")
    assert None not in named and len(named) >= 2 and named <= pools
    monkeypatch.setenv("GPUQUOTA_NODE_POOL_LABELS", "node-pool")
    assert cli(capsys, "replay", str(stream), "--db", db_url, "--cluster", f"{cluster}-e")[0] == 0
    assert pools_reported(f"{cluster}-e") == named


def test_node_pool_labels_in_order_before_the_built_in_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuquota.quota.accounting import DEFAULT_NODE_POOL_LABELS
    from gpuquota.quota.options import node_pool_labels

    assert node_pool_labels(None) == DEFAULT_NODE_POOL_LABELS
    assert node_pool_labels(["b,a", "c"])[:3] == ("b", "a", "c")
    monkeypatch.setenv("GPUQUOTA_NODE_POOL_LABELS", "x/pool, y")
    assert node_pool_labels(None)[:2] == ("x/pool", "y")
    assert node_pool_labels(["z"])[0] == "z"  # the flag wins over the environment
    with pytest.raises(ValueError, match="not a label key"):
        node_pool_labels(["a b"])


def test_replay_logs_progress_without_a_terminal(
    db_url: str,
    cluster: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuquota.quota import replay

    monkeypatch.setattr(replay, "PROGRESS_MIN_BYTES", 1)
    monkeypatch.setattr(replay, "PROGRESS_LOG_SECONDS", 0.0)
    stream = write_lines(tmp_path / "ok.jsonl", events())
    with caplog.at_level("INFO", logger="gpuquota.quota.replay"):
        code, _, err = cli(capsys, "replay", str(stream), "--db", db_url, "--cluster", cluster)
    assert code == 0, err
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuquota.quota.replay"]
    assert any(m.startswith("check: ") and "%" in m for m in lines), lines  # validation
    assert any(m.startswith("replay: ") and "%" in m for m in lines), lines


def test_replay_accepts_dra_kinds_and_matches_the_generator_truth(
    empty_db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = generate(9, 1.0, dra=True)
    stream = tmp_path / "dra.jsonl"
    stream.write_text("".join(line + "\n" for line in workload.lines()))
    code, out, err = cli(
        capsys, "replay", str(stream), "--db", empty_db_url, "--migrate", "--cluster", "dra"
    )
    assert code == 0, err
    assert "ResourceClaim" in out and "ResourceSlice" in out and "DeviceClass" in out
    assert "skipped objects of kinds not accounted" not in out  # ResourceClaimTemplate: none
    with db.open_store(empty_db_url) as store:
        got: dict[tuple[str, str], int] = {}
        for r in rows.claim_allocations(store, "dra"):
            end = workload.end if r["ended_at"] is None else r["ended_at"]
            key = (r["namespace"], r["resource_name"])
            got[key] = got.get(key, 0) + r["raw_units"] * max(0, end - r["started_at"])
    assert {k: v for k, v in got.items() if v} == workload.truth.dra_gpu_seconds()


def test_malformed_claim_is_rejected_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = {
        "kind": "ResourceClaim",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {"name": "c", "namespace": "a", "uid": "u"},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": 3}]}}},
    }
    stream = write_lines(
        tmp_path / "bad.jsonl", [*events()[:3], {"type": "ADDED", "object": claim}]
    )
    target = tmp_path / "never.db"
    code, out, err = cli(capsys, "replay", str(stream), "--db", f"sqlite:///{target}")
    assert code == 2 and out == ""
    assert err.strip().startswith(f"gpuquota replay: error: {stream}:4: ResourceClaim: ")
    assert "results[0].driver" in err
    assert not target.exists()


def test_dra_drivers_flag_decides_what_is_a_gpu(
    empty_db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = generate(9, 1.0, dra=True)
    stream = tmp_path / "dra.jsonl"
    stream.write_text("".join(line + "\n" for line in workload.lines()))
    args = ["replay", str(stream), "--db", empty_db_url, "--migrate", "--cluster", "fpga"]
    code, _, err = cli(capsys, *args, "--dra-drivers", "gpu.nvidia.com, fpga.example.com")
    assert code == 0, err
    with db.open_store(empty_db_url) as store:
        charged = {
            r["claim_name"]
            for r in rows.claim_allocations(store, "fpga")
            if r["ended_at"] != r["started_at"]
        }
    assert "fpga-0" in charged and "shared-gpu" in charged
    for bad in ("", " , ", "Not_A_Driver"):
        code, out, err = cli(capsys, *args, "--dra-drivers", bad)
        assert code == 2 and out == ""
        assert err.startswith("gpuquota replay: error: --dra-drivers: ") and err.count("\n") == 1


def test_verbose_after_the_subcommand_and_version_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 18 (fails on 6c36c52): the error message says "run with -v", and a user adds it
    at the end; `gpuquota report --version` was refused although the README promises it."""
    parser, _ = build_parser()
    args = parser.parse_args(["replay", "x.jsonl", "-v"])
    assert args.verbose is True
    assert parser.parse_args(["-v", "replay", "x.jsonl"]).verbose is True
    assert parser.parse_args(["replay", "x.jsonl"]).verbose is False
    for argv in (["report"], ["db", "upgrade"], ["controller"], ["replay"], ["db"]):
        with pytest.raises(SystemExit) as info:
            parser.parse_args([*argv, "--version"])
        assert info.value.code == 0
        assert capsys.readouterr().out.startswith(f"gpuquota {' '.join(argv)} ")


def test_db_upgrade_refuses_a_foreign_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 18 (fails on 6c36c52, which added its tables beside the foreign ones)."""
    path = tmp_path / "finance.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
        conn.commit()
    code, out, err = cli(capsys, "db", "upgrade", "--db", f"sqlite:///{path}")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "is not a gpuquota store" in err and "invoices" in err
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert tables == ["invoices"]
    # a reading command says the same, not "an empty database, run gpuquota db upgrade"
    code, out, err = cli(capsys, "report", "--db", f"sqlite:///{path}")
    assert code == 2 and "is not a gpuquota store" in err and "nothing to read" in err


def test_db_check_finds_dangling_ledger_rows(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ledger rows that refer to rows that are gone drop out of every report (it joins through
    them); `gpuquota db check` counts them, says what the bills lose, and exits 1."""
    from sqlalchemy import insert

    from gpuquota.quota.store.models import UsageDevice, UsageSeries, UsageWindow

    db.upgrade(empty_db_url)
    code, out, _ = cli(capsys, "db", "check", "--db", empty_db_url)
    assert (code, out.splitlines()[-1]) == (0, f"{db.safe_url(empty_db_url)}: no dangling rows")

    def series(sid: int, device: int, cluster: str = "a") -> dict[str, Any]:
        return {
            "id": sid, "device_id": device, "cluster": cluster, "holder_kind": "pod",
            "holder_uid": f"u{sid}", "namespace": "ns", "holder_name": f"p{sid}",
        }  # fmt: skip

    def window(sid: int, used: float) -> dict[str, Any]:
        return {
            "series_id": sid, "window_start": 3600, "window_seconds": 3600,
            "used_gpu_seconds": used, "energy_joules": 1.8e6, "sampled_seconds": 3600.0,
            "end_used": used, "end_energy": 1.8e6,
        }  # fmt: skip

    store = db.open_store(empty_db_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(insert(UsageDevice), [{"id": 1, "cluster": "a", "device_uuid": "GPU-1"}])
            conn.execute(
                insert(UsageSeries),
                # whole; a device that is gone; a device of another cluster
                [series(1, 1), series(2, 99), series(3, 1, cluster="b")],
            )
            # whole; two of a series that is gone (2 GPU-h, 1 kWh)
            conn.execute(insert(UsageWindow), [window(1, 10.0), window(7, 3600.0)])
            conn.execute(insert(UsageWindow), [{**window(7, 3600.0), "window_start": 7200}])
    finally:
        store.close()
    code, out, _ = cli(capsys, "db", "check", "--db", empty_db_url)
    assert code == 1
    assert out.splitlines() == [
        "        2 usage_windows referring to a missing usage_series row (series_id): 2.000 "
        "used "
        "GPU-h and 1.000 kWh that no report shows",
        "        1 usage_series referring to a missing usage_devices row (device_id)",
        "        1 usage_series referring to a usage_devices row of another cluster (device_id)",
        f"{db.safe_url(empty_db_url)}: 4 dangling rows (docs/operations.md, db check)",
    ]
