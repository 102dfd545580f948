"""`gpuquota gpus` refuses bad input and empty stores with one line and exit 2, printing
nothing on stdout."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuquota.quota import cli
from gpuquota.quota.store import db


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--evidence"], "--evidence: give the board with --serial S"),
        (["--serial", "S", "--evidence", "--by", "model"], "not with --by"),
        (["--cost", "--by", "node"], "--cost: a view of its own"),
        (["--top", "0"], "--top: 0: give at least 1"),
        (["--month", "2026-13"], "--month: '2026-13' is not a month"),
        (["--cluster", " "], "--cluster: the cluster name is empty"),
        ([], "no GPU history"),
        (["--serial", "nope", "--evidence"], "no GPU with serial 'nope'"),
    ],
)
def test_bad_input_and_no_data_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    db.upgrade(url)
    code = cli.main(["gpus", "--db", url, *args])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("gpuquota gpus: error: ") and message in err
