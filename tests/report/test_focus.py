"""`gpuquota report --format focus`: a FinOps FOCUS 1.2 CSV, checked by the FinOps Foundation's
own validator (PyPI focus-validator 2.2.1, against the FOCUS 1.2 rules it bundles).

The validator needs Python >= 3.12 and pins numpy 1.x, pandas, polars and duckdb versions our
environment does not take, so the test makes it its own virtual environment, once, with a
Python >= 3.12 the machine has (3.12 first: numpy 1.x has wheels up to 3.12), cached in
build/focus-validator (delete the folder to rebuild it). Parallel test workers (pytest-xdist) and concurrent runs share that folder: a file
lock lets one of them install it and the others wait, and a marker written last tells a
complete install from one cut short. A machine without such a Python fails the test: the
export is not checked, so it does not pass."""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import re
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tests.report.conftest import A100, H100, Store, ts
from tests.report.helpers import NOW, T0, WINDOW, H, assert_refused, ledger, uid

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "build" / "focus-validator"
LOCK = ROOT / "build" / "focus-validator.lock"
# pyarrow is unpinned there, and pyarrow 22 on needs numpy 2, which the validator refuses
REQUIREMENTS = ("focus-validator==2.2.1", "pyarrow<22")
BINARY = ("--only-binary", "numpy,pandas,pyarrow,polars,duckdb")
# what our export is: the applicability criteria of the rules that apply to it (the rest are
# features it does not have: availability zones, commitments, capacity reservations, regions,
# several account types or currencies); the test validates with none and with these
CRITERIA = (
    "ACCOUNT_NAMING_SUPPORTED",
    "SUB_ACCOUNT_SUPPORTED",
    "TAGGING_SUPPORTED",
    "USAGE_MEASUREMENT_SUPPORTED",
    "UNIT_PRICING_SUPPORTED",
    "PUBLIC_PRICE_LIST_SUPPORTED",
    "BILLING_BASED_ON_PROVISIONED_RESOURCES_SUPPORTED",
    "RESOURCE_TYPE_ASSIGNMENT_SUPPORTED",
)


def python312() -> str:
    """A Python >= 3.12 that runs (pyenv's shims are on PATH for versions not selected, and
    fail when run), 3.12 first: the validator pins numpy 1.x, which has wheels up to 3.12
    only (on a newer Python pip would spend many minutes compiling it, and fail); else
    AssertionError naming what was tried."""
    names = ["python3.12", "python3.13", "python3.14"]
    candidates = [p for n in names if (p := shutil.which(n))]
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates += sorted(str(p) for p in Path(root).glob("versions/3.1[2-9]*/bin/python3"))
    for exe in candidates:
        done = subprocess.run(
            [exe, "-c", "import sys; print(sys.version_info >= (3, 12), sys.executable)"],
            capture_output=True,
            text=True,
        )
        ok, _, real = done.stdout.strip().partition(" ")
        if done.returncode == 0 and ok == "True":
            return real
    raise AssertionError(
        f"the FOCUS validator needs Python >= 3.12 and none runs here (tried {candidates})"
    )


def validator() -> Path:
    """The validator's executable, installing it into its own venv the first time."""
    exe = VENV / "bin" / "focus-validator"
    installed = VENV / ".installed"  # written once pip has finished
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer; the others wait for it
        if installed.is_file() and installed.read_text() == "\n".join(REQUIREMENTS):
            return exe
        subprocess.run([python312(), "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run(
            # wheels only for the compiled ones: no Python they have no wheel for
            # --no-compile: byte-compiling pandas, polars and the rest took half the install's
            # CPU (54 s -> 28 s here); the validator compiles what it imports on first run
            [
                str(VENV / "bin" / "pip"),
                "install",
                "--quiet",
                "--no-compile",
                *BINARY,
                *REQUIREMENTS,
            ],
            check=True,
            timeout=900,
        )
        installed.write_text("\n".join(REQUIREMENTS))
    return exe


def or_branches(packages: Path) -> dict[str, str]:
    """Each rule that is a branch of an OR rule of the bundled 1.2 model -> that OR rule."""
    (model,) = (packages / "focus_validator" / "rules").glob("model-1.2*.json")
    rules = json.loads(model.read_text())["ModelRules"]
    out = {}
    for rule_id, rule in rules.items():
        requirement = rule["ValidationCriteria"].get("Requirement") or {}
        if requirement.get("CheckFunction") == "OR":
            for item in requirement["Items"]:
                if "ModelRuleId" in item:
                    out[item["ModelRuleId"]] = rule_id
    return out


def validate(tmp_path: Path, text: str, *criteria: str) -> tuple[list[str], str]:
    """The failed rules (but an OR's branch where the OR passed) and the validator's summary;
    AssertionError if it did not run.

    An OR rule passes when one branch does, and the validator still counts the other branch
    as failed: InvoiceId-C-003-C (InvoiceId is null without an invoice, not null with one) is
    an OR of InvoiceId-C-004-C (every row null) and -C-005-C (no row null), so every dataset
    fails one of them, whatever it holds. Such a branch is no failure of the export."""
    data = tmp_path / "focus.csv"
    data.write_text(text)
    exe = validator()
    # it reads its ISO 4217 list from a path relative to its package's parent folder
    packages = next((VENV / "lib").glob("python3*/site-packages"))
    argv = [str(exe), "--data-file", str(data), "--validate-version", "1.2", "--block-download"]
    if criteria:
        argv += ["--applicability-criteria", ",".join(criteria)]
    done = subprocess.run(argv, cwd=packages, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    # it exits 0 whatever it found: its summary and a line per rule are the verdict
    summary = re.search(r"Total: (\d+) \| Pass: (\d+) \| Fail: (\d+) \| Skipped: \d+", out)
    assert done.returncode == 0 and summary and int(summary.group(2)) > 0, out[-4000:]
    status = dict(re.findall(r"^\S+ (\S+): (PASS|FAIL|SKIPPED)", out, re.MULTILINE))
    assert sum(s == "FAIL" for s in status.values()) == int(summary.group(3)), out[-4000:]
    branches = or_branches(packages)
    failed = [
        rule
        for rule, s in status.items()
        if s == "FAIL" and status.get(branches.get(rule, ""), "") != "PASS"
    ]
    lines = [line for line in out.splitlines() if "FAIL" in line]
    return failed, "\n".join([summary.group(0), *lines])


CARD = f"""\
currency: EUR
default_rate: 1
models:
  {H100}:
    - rate: 2
    - {{rate: 3.5, from: "2026-10-06T12:00:00Z"}}
energy_price_per_kwh: 0.3
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_focus_export_passes_the_finops_validator(
    store: Store, report: Any, tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(CARD)
    # ml: one H100 for 30 h from 10:00 on day one, with ledger energy and half its time used;
    # web: 2 A100s for an hour and a MIG slice for 2 h; a node of 8 H100s and 2 A100s
    store.alloc("ml", T0, T0 + 30 * H)
    ledger(store, uid(store), [(T0 + i * H, 1800, 3_600_000, H) for i in range(30)])
    store.alloc("web", T0, T0 + H, units=2, model=A100)
    store.alloc("web", T0, T0 + 2 * H, physical=Fraction(1, 7), resource="nvidia.com/mig-1g.10gb")
    store.capacity("node-1", T0, None)
    store.capacity("node-2", T0, None, units=2, model=A100)
    argv = ("--from", "2026-10-05", "--to", "2026-10-08", *NOW, "--rate-card", str(card))
    result = report(
        *argv, "--format", "focus", "--focus-version", "1.2", "--spread-idle", "proportional",
        db=store,
    )  # fmt: skip
    assert result.rc == 0, result.err
    header = result.out.splitlines()[0].split(",")
    # the 57 FOCUS 1.2 columns, then ours (x_)
    assert len({c.lower() for c in header}) == len(header) == 60
    assert header[57:] == ["x_Cluster", "x_NodePool", "x_Owner"]
    rows = list(csv.DictReader(io.StringIO(result.out)))
    gpu = [
        (r["ChargePeriodStart"], r["ChargePeriodEnd"], r["SubAccountName"], r["SkuId"],
         r["PricingQuantity"], r["ListUnitPrice"], r["BilledCost"])
        for r in rows if r["SkuMeter"] == "GPU allocation"
    ]  # fmt: skip
    mig = f"gpu/{H100}/nvidia.com/mig-1g.10gb"
    assert gpu == [
        # day one: 14 h of ml's H100 at 2, web's 2 A100s for an hour and its 1/7 slice for 2 h
        ("2026-10-05T00:00:00Z", "2026-10-06T00:00:00Z", "ml", f"gpu/{H100}/nvidia.com/gpu",
         "14.000000", "2.0", "28.000000"),
        ("2026-10-05T00:00:00Z", "2026-10-06T00:00:00Z", "web", f"gpu/{A100}/nvidia.com/gpu",
         "2.000000", "1.0", "2.000000"),
        ("2026-10-05T00:00:00Z", "2026-10-06T00:00:00Z", "web", mig,
         "0.285714", "2.0", "0.571429"),
        # day two is split where the H100's rate changes (12:00): 12 h at 2, 4 h at 3.5
        ("2026-10-06T00:00:00Z", "2026-10-06T12:00:00Z", "ml", f"gpu/{H100}/nvidia.com/gpu",
         "12.000000", "2.0", "24.000000"),
        ("2026-10-06T12:00:00Z", "2026-10-07T00:00:00Z", "ml", f"gpu/{H100}/nvidia.com/gpu",
         "4.000000", "3.5", "14.000000"),
    ]  # fmt: skip
    # prices are decimals even where whole: the validator types a column by its values
    assert all(re.fullmatch(r"\d+\.\d+", r["ListUnitPrice"]) for r in rows)
    by_meter: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_meter.setdefault(r["SkuMeter"], []).append(r)
    energy = by_meter["GPU energy"]
    assert [
        (r["ChargePeriodStart"][:13], r["ConsumedQuantity"], r["BilledCost"]) for r in energy
    ] == [
        ("2026-10-05T00", "14.000000", "4.200000"),
        ("2026-10-06T00", "12.000000", "3.600000"),
        ("2026-10-06T12", "4.000000", "1.200000"),
    ]
    # used GPU-hours from the ledger (half of 30 h), its own rows per charge period, not
    # charged again
    used = by_meter["GPU activity"]
    assert [
        (r["SubAccountName"], r["ChargePeriodStart"][:13], r["PricingQuantity"], r["BilledCost"])
        for r in used
    ] == [
        ("ml", "2026-10-05T00", "7.000000", "0.000000"),
        ("ml", "2026-10-06T00", "6.000000", "0.000000"),
        ("ml", "2026-10-06T12", "2.000000", "0.000000"),
    ]
    # idle: each model's idle GPU-hours and cost per day, shared by physical GPU-hours
    idle = {
        (r["SubAccountName"], r["SkuId"], r["ChargePeriodStart"][:13]): r
        for r in by_meter["Idle GPU capacity"]
    }
    assert {k[:2] for k in idle} == {
        ("ml", f"gpu-idle/{H100}"), ("ml", f"gpu-idle/{A100}"),
        ("web", f"gpu-idle/{H100}"), ("web", f"gpu-idle/{A100}"),
    }  # fmt: skip
    # each charge period up to now (2026-10-07T00:00Z)
    assert {k[2] for k in idle} == {"2026-10-05T00", "2026-10-06T00", "2026-10-06T12"}
    # the whole bill is the report's: GPU cost + energy + spread idle
    table = report(*argv, "--spread-idle", "proportional", "--json", db=store)
    total = json.loads(table.out)["total"]
    billed = sum(Fraction(r["BilledCost"]) for r in rows)
    expected = sum(
        Fraction(str(total[f"{k}_EUR"])) for k in ("cost", "energy_cost", "spread_idle_cost")
    )
    assert abs(billed - expected) < Fraction(1, 100), (billed, expected, total)
    # the rules that apply to every dataset, and those too that apply to what this export is
    # (each store's export once: the validator takes seconds a run)
    criteria = () if store.url.startswith("sqlite") else CRITERIA
    failed, summary = validate(tmp_path, result.out, *criteria)
    assert failed == [], summary


@pytest.mark.timeout(1200)  # it may wait for the validator's install (see validator())
def test_the_validator_catches_a_broken_export(tmp_path: Path) -> None:
    """The check can fail: a row without its BilledCost is refused."""
    failed, summary = validate(tmp_path, "BilledCost,BillingCurrency\n,EUR\n")
    assert "BilledCost-C-000-M" in failed, summary


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--by", "namespace"), "--format focus: one row per namespace, SKU"),
        ((), "--format focus: needs --rate-card"),
        (("--top", "3", "--rate-card", "x.yaml"), "--top does not apply"),
        (("--rate-card", "dollars.yaml"), "currency 'dollars' is no ISO 4217 code"),
        (("--idle", "--rate-card", "x.yaml"), "--idle alone has no FOCUS rows"),
        (("--idle-allocations", "--rate-card", "x.yaml"), "--idle-allocations is a view FOCUS"),
    ],
)
def test_focus_refuses_what_it_cannot_express(
    report: Any, sqlite_store: Store, argv: tuple[str, ...], needle: str, tmp_path: Path
) -> None:
    (tmp_path / "x.yaml").write_text("default_rate: 1\n")
    (tmp_path / "dollars.yaml").write_text("default_rate: 1\ncurrency: dollars\n")
    argv = tuple(str(tmp_path / a) if a.endswith(".yaml") else a for a in argv)
    assert_refused(report(*WINDOW, *argv, "--format", "focus", db=sqlite_store), needle)


def test_focus_says_where_idle_is(report: Any, store: Store, tmp_path: Path) -> None:
    """Without --spread-idle the export has no idle rows, and says so."""
    (tmp_path / "x.yaml").write_text("default_rate: 1\n")
    store.alloc("ml", T0, T0 + H)
    store.capacity("node-1", ts("2026-10-05T00:00:00"), None)
    result = report(
        *WINDOW, *NOW, "--rate-card", str(tmp_path / "x.yaml"), "--format", "focus",
        db=store,
    )  # fmt: skip
    assert result.rc == 0, result.err
    assert "Idle GPU capacity" not in result.out
    assert "idle GPU-hours are in no row" in result.err


def test_spread_idle_rows_match_the_reports_namespaces(
    report: Any, store: Store, tmp_path: Path
) -> None:
    """Idle rows carry each namespace's share as `--by namespace --spread-idle` computes it,
    even where a namespace has several SKUs (an even spread is per namespace, not per SKU)."""
    card = tmp_path / "card.yaml"
    card.write_text(CARD)
    store.alloc("ml", T0, T0 + 3 * H)
    store.alloc("ml", T0, T0 + H, model=A100)
    store.alloc("ml", T0, T0 + H, physical=Fraction(1, 7), resource="nvidia.com/mig-1g.10gb")
    store.alloc("web", T0, T0 + H)
    store.capacity("node-1", T0, None)
    store.capacity("node-2", T0, None, units=2, model=A100)
    argv = (*WINDOW, *NOW, "--rate-card", str(card), "--spread-idle", "even")
    focus = report(*argv, "--format", "focus", db=store)
    assert focus.rc == 0, focus.err
    hours: dict[str, Fraction] = {}
    cost: dict[str, Fraction] = {}
    for r in csv.DictReader(io.StringIO(focus.out)):
        if r["SkuMeter"] == "Idle GPU capacity":
            ns = r["SubAccountName"]
            hours[ns] = hours.get(ns, Fraction(0)) + Fraction(r["PricingQuantity"])
            cost[ns] = cost.get(ns, Fraction(0)) + Fraction(r["BilledCost"])
    table = json.loads(report(*argv, "--json", db=store).out)
    expected = {row["group"]["namespace"]: row for row in table["rows"]}
    assert set(hours) == set(expected) == {"ml", "web"}
    for ns, row in expected.items():
        assert abs(hours[ns] - Fraction(str(row["spread_idle_gpu_hours"]))) < Fraction(1, 100)
        assert abs(cost[ns] - Fraction(str(row["spread_idle_cost_EUR"]))) < Fraction(1, 100)
    assert abs(hours["ml"] - hours["web"]) < Fraction(1, 10**5)  # even: one share each
