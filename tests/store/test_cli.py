"""`gpuquota db` and `gpuquota replay` as users run them, against SQLite and PostgreSQL: the
installed console script in a subprocess for a good file, a bad file and a dead database, and
``quota.cli.main`` in-process for the rest (same code, without the interpreter start-up)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from quota.cli import SUBCOMMANDS, build_parser, main
from quota.store import db
from sim.workload import generate
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
    assert done.returncode == 2
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
    workload = generate(5, 3.0, pods_per_hour=120)
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
