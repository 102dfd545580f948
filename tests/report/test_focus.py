"""`gpuquota report --format focus`: a FinOps FOCUS 1.0 CSV, checked by the FinOps Foundation's
own validator (PyPI focus-validator 1.0.0, with multimethod<1.11 beside it to import).

The validator pins numpy 1.x, pandas and pandera versions our environment does not take (it
would downgrade numpy), so the test makes it its own virtual environment, once, cached in
build/focus-validator (delete the folder to rebuild it). Parallel test workers (pytest-xdist)
and concurrent runs share that folder: a file lock lets one of them install it and the others
wait, and a marker written last tells a complete install from one cut short."""

from __future__ import annotations

import csv
import fcntl
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.report.conftest import Store
from tests.report.helpers import NOW, T0, WINDOW, H, assert_refused, ledger, uid

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "build" / "focus-validator"
LOCK = ROOT / "build" / "focus-validator.lock"
REQUIREMENTS = ("focus-validator==1.0.0", "multimethod<1.11")
# focus-validator 1.0.0's rule SkuPriceId_Nullable queries ChargeType, a FOCUS 0.5 column that
# 1.0 renamed (ChargeCategory): on any FOCUS 1.0 file it fails with KeyError('ChargeType')
OVERRIDES = ("SkuPriceId_Nullable",)


def validator() -> Path:
    """The validator's executable, installing it into its own venv the first time."""
    exe = VENV / "bin" / "focus-validator"
    installed = VENV / ".installed"  # written once pip has finished
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer; the others wait for it
        if installed.is_file() and installed.read_text() == "\n".join(REQUIREMENTS):
            return exe
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run(
            [str(VENV / "bin" / "pip"), "install", "--quiet", *REQUIREMENTS],
            check=True,
            timeout=900,
        )
        installed.write_text("\n".join(REQUIREMENTS))
    return exe


def validate(tmp_path: Path, text: str) -> str:
    data = tmp_path / "focus.csv"
    data.write_text(text)
    override = tmp_path / "override.yaml"
    override.write_text("overrides:\n" + "".join(f"  - {rule}\n" for rule in OVERRIDES))
    exe = validator()
    # it reads its ISO 4217 list from a path relative to its package's parent folder
    packages = next((VENV / "lib").glob("python3*/site-packages"))
    done = subprocess.run(
        [
            str(exe),
            "--data-file",
            str(data),
            "--validate-version",
            "1.0",
            "--override-file",
            str(override),
        ],
        cwd=packages,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_focus_export_passes_the_finops_validator(
    store: Store, report: Any, tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text("currency: EUR\ndefault_rate: 2\nenergy_price_per_kwh: 0.3\n")
    # ml: one GPU for 30 h from 10:00 on day one, with ledger energy; web: 2 GPUs for an hour
    store.alloc("ml", T0, T0 + 30 * H)
    ledger(store, uid(store), [(T0 + i * H, 1800, 3_600_000, H) for i in range(30)])
    store.alloc("web", T0, T0 + H, units=2)
    result = report(
        "--from",
        "2026-10-05",
        "--to",
        "2026-10-08",
        *NOW,
        "--rate-card",
        str(card),
        "--format",
        "focus",
        db=store,
    )
    assert result.rc == 0, result.err
    rows = list(csv.DictReader(io.StringIO(result.out)))
    # day 1: ml GPU + energy, web GPU; day 2: ml GPU + energy; day 3: nothing to charge
    assert [(r["ChargePeriodStart"][:10], r["SubAccountId"], r["ConsumedUnit"]) for r in rows] == [
        ("2026-10-05", "ml", "GPU-Hours"),
        ("2026-10-05", "ml", "kWh"),
        ("2026-10-05", "web", "GPU-Hours"),
        ("2026-10-06", "ml", "GPU-Hours"),
        ("2026-10-06", "ml", "kWh"),
    ]
    first = rows[0]
    assert first["ConsumedQuantity"] == "14.000000" and first["BilledCost"] == "28.000000"
    assert rows[1]["ConsumedQuantity"] == "14.000000" and rows[1]["BilledCost"] == "4.200000"
    assert rows[3]["ConsumedQuantity"] == "16.000000"
    assert first["BillingPeriodStart"] == "2026-10-05T00:00:00Z"
    assert first["ChargePeriodEnd"] == "2026-10-06T00:00:00Z"
    out = validate(tmp_path, result.out)
    assert "Validation succeeded." in out, out


@pytest.mark.timeout(1200)  # it may wait for the validator's install (see validator())
def test_the_validator_catches_a_broken_export(tmp_path: Path) -> None:
    """The check can fail: a row without its BilledCost is refused."""
    text = "BilledCost,BillingCurrency\n,EUR\n"  # most required columns missing too
    out = validate(tmp_path, text)
    assert "Validation failed!" in out and "BilledCost_NotNull" in out, out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--by", "owner"), "--format focus: one row per charge period and namespace"),
        ((), "--format focus: needs --rate-card"),
        (("--top", "3", "--rate-card", "x.yaml"), "--top does not apply"),
        (("--rate-card", "dollars.yaml"), "currency 'dollars' is no ISO 4217 code"),
    ],
)
def test_focus_refuses_what_it_cannot_express(
    report: Any, sqlite_store: Store, argv: tuple[str, ...], needle: str, tmp_path: Path
) -> None:
    (tmp_path / "x.yaml").write_text("default_rate: 1\n")
    (tmp_path / "dollars.yaml").write_text("default_rate: 1\ncurrency: dollars\n")
    argv = tuple(str(tmp_path / a) if a.endswith(".yaml") else a for a in argv)
    assert_refused(report(*WINDOW, *argv, "--format", "focus", db=sqlite_store), needle)
