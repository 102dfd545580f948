"""`gpuquota report --format focus`: FOCUS 1.3 by default, checked column by column against the
1.3 specification's pages (tests/report/focus13_spec.py), and the cases of issue #36 one by
one: every row names its cluster, billing account and provider; Tags carry the namespace
labels; each unit has one meaning; used and idle rows are per day, clipped to covered time; a
currency outside ISO 4217 is refused; an InvoiceId names one cluster's one period."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tests.report import focus13_spec
from tests.report.conftest import H100, Store, ts
from tests.report.focus_fleet import CARD, PERIOD, fleet
from tests.report.helpers import NOW, T0, H, assert_refused, known, ledger, uid


def export(report: Any, store: Store, tmp_path: Path, *argv: str, card: str = CARD) -> Any:
    (tmp_path / "card.yaml").write_text(card)
    result = report(*PERIOD, *NOW, "--rate-card", str(tmp_path / "card.yaml"),
                    "--format", "focus", *argv, db=store)  # fmt: skip
    assert result.rc == 0, result.err
    return result


def rows_of(text: str) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    return list(reader.fieldnames or []), list(reader)


@pytest.mark.parametrize("spread", ["proportional", "even"])
def test_focus_13_follows_the_specifications_column_pages(
    report: Any, store: Store, tmp_path: Path, spread: str
) -> None:
    fleet(store)
    result = export(report, store, tmp_path, "--spread-idle", spread, "--focus-tags", "team")
    header, rows = rows_of(result.out)
    assert header == [*sorted(c.name for c in focus13_spec.COLUMNS), "x_Cluster", "x_NodePool",
                      "x_Owner"]  # fmt: skip
    assert focus13_spec.problems(header, rows) == []
    kinds = {r["SkuMeter"] for r in rows}
    assert kinds == {"GPU allocation", "GPU energy", "GPU activity", "Idle GPU capacity"}
    # an allocation row is an allocated charge of its node pool's GPUs to the namespace
    alloc = [r for r in rows if r["SkuMeter"] == "GPU allocation"]
    assert {(r["ResourceId"], r["AllocatedResourceId"], r["AllocatedMethodId"]) for r in alloc} == {
        (f"{c}/nodepool/pool-a", f"{c}/namespace/{ns}", "gpuquota-gpu-time")
        for c in ("alpha", "beta")
        for ns in ("ml", "web")
    }
    # used and energy rows are no split of a charge
    assert all(r["AllocatedMethodId"] == "" for r in rows if r["SkuMeter"] != "GPU allocation"
               and r["SkuMeter"] != "Idle GPU capacity")  # fmt: skip
    # ml's 14 h and web's 3 h of H100s on day one split that charge of pool-a
    ratios = sorted(
        json.loads(r["AllocatedMethodDetails"])["Elements"][0]["AllocatedRatio"]
        for r in alloc
        if r["x_Cluster"] == "alpha" and r["SkuId"] == f"gpu/{H100}/nvidia.com/gpu"
        and r["ChargePeriodStart"] == "2026-10-05T00:00:00Z"
    )  # fmt: skip
    assert ratios == [round(3 / 17, 12), round(14 / 17, 12)]
    idle = {r["AllocatedMethodId"] for r in rows if r["SkuMeter"] == "Idle GPU capacity"}
    assert idle == {f"gpuquota-idle-{spread}"}
    # the provider columns of 1.3: the service provider hosts its own service by default
    assert {(r["ServiceProviderName"], r["HostProviderName"]) for r in rows} == {
        ("gpuquota", "gpuquota")
    }


def test_the_column_check_catches_a_broken_export(
    report: Any, sqlite_store: Store, tmp_path: Path
) -> None:
    """The checker can fail: each broken rule is found, with its page."""
    sqlite_store.clear()
    fleet(sqlite_store)
    header, rows = rows_of(export(report, sqlite_store, tmp_path, "--spread-idle", "even").out)
    broken = [dict(r) for r in rows]
    broken[0]["ChargeCategory"] = "Use"
    broken[1]["BilledCost"] = ""
    broken[2]["ChargePeriodStart"] = "2026-10-05 00:00"
    broken[3]["ConsumedUnit"] = ""
    split = [i for i, r in enumerate(broken) if r["AllocatedResourceId"]]
    broken[split[0]]["AllocatedResourceName"] = ""
    broken[split[1]]["AllocatedMethodDetails"] = '{"Elements": [{"AllocatedRatio": 0.5}]}'
    found = "\n".join(focus13_spec.problems([*header[:-3], "Extra"], broken))
    for needle in (
        "'Use' is none of the allowed values",
        "BilledCost (Billed Cost): null",
        "no UTC date/time",
        "ConsumedUnit (Consumed Unit): null must go with ConsumedQuantity null",
        "AllocatedResourceName (Allocated Resource Name)",
        "adds up to",
        "Extra: neither a FOCUS 1.3 column",
    ):
        assert needle in found, found


def test_every_row_names_its_cluster_account_and_provider(
    report: Any, store: Store, tmp_path: Path
) -> None:
    """Issue #36, why 1: the same trace as clusters alpha and beta is two clusters' rows, each
    with the cluster in its own column, its resource ids and its invoice; the billing account
    and provider names come from the rate card, a flag over it."""
    fleet(store)
    card = CARD + (
        "focus:\n  billing_account_id: acme-gpu\n  billing_account_name: ACME GPU fleet\n"
        "  provider: ACME platform\n  host_provider: On-premises\n  invoice_issuer: ACME finance\n"
    )
    result = export(report, store, tmp_path, "--focus-billing-account-id", "acme-eu", card=card)
    _, rows = rows_of(result.out)
    assert {r["x_Cluster"] for r in rows} == {"alpha", "beta"}
    for r in rows:
        c = r["x_Cluster"]
        assert r["ResourceId"].startswith(f"{c}/") and r["SubAccountId"].startswith(f"{c}/")
        assert r["InvoiceId"] == f"acme-eu-{c}-20261005T000000Z-20261007T000000Z"
        assert json.loads(r["Tags"])["gpuquota.io/cluster"] == c
    assert {
        (r["BillingAccountId"], r["BillingAccountName"], r["ServiceProviderName"],
         r["HostProviderName"], r["InvoiceIssuerName"], r["ProviderName"])
        for r in rows
    } == {("acme-eu", "ACME GPU fleet", "ACME platform", "On-premises", "ACME finance",
           "ACME platform")}  # fmt: skip
    # the clusters' costs are apart, each the report's `--by cluster` figure
    table = json.loads(
        report(*PERIOD, *NOW, "--rate-card", str(tmp_path / "card.yaml"), "--by", "cluster",
               "--json", db=store).out
    )  # fmt: skip
    billed: dict[str, Fraction] = defaultdict(Fraction)
    for r in rows:
        if r["SkuMeter"] == "GPU allocation":
            billed[r["x_Cluster"]] += Fraction(r["BilledCost"])
    for row in table["rows"]:
        cost = Fraction(str(row["cost_USD"]))
        assert abs(billed[row["group"]["cluster"]] - cost) < Fraction(1, 10**5)
    # 1.2 has no 1.3 provider columns: ProviderName and PublisherName carry the names
    old = export(report, store, tmp_path, "--focus-version", "1.2", "--focus-publisher", "NVIDIA",
                 card=card)  # fmt: skip
    header, rows = rows_of(old.out)
    assert "ServiceProviderName" not in header and "AllocatedMethodId" not in header
    assert {(r["ProviderName"], r["PublisherName"]) for r in rows} == {("ACME platform", "NVIDIA")}
    assert {r["ResourceId"] for r in rows} == {
        f"{c}/namespace/{ns}" for c in ("alpha", "beta") for ns in ("ml", "web")
    }


def test_tags_carry_the_namespace_labels_and_rows_their_owner_and_pool(
    report: Any, store: Store, tmp_path: Path
) -> None:
    """Issue #36, why 2: the labels `--by label:` groups by are in Tags (the rate card's or
    the flag's keys), owner and node pool in x_ columns."""
    fleet(store)
    card = CARD + "focus:\n  tags: [team]\n"
    _, rows = rows_of(export(report, store, tmp_path, card=card).out)
    tags = {(r["SubAccountName"], json.loads(r["Tags"]).get("team")) for r in rows}
    assert tags == {("ml", "research"), ("web", "web")}
    _, rows = rows_of(export(report, store, tmp_path, "--focus-tags", "team,cost-center",
                             card=card).out)  # fmt: skip
    ml = json.loads(next(r["Tags"] for r in rows if r["SubAccountName"] == "ml"))
    assert (ml["team"], ml["cost-center"]) == ("research", "42")
    web = json.loads(next(r["Tags"] for r in rows if r["SubAccountName"] == "web"))
    assert "cost-center" not in web  # unlabelled: no tag, not an invented value
    assert {(r["SubAccountName"], r["x_Owner"], r["x_NodePool"]) for r in rows
            if r["SkuMeter"] == "GPU allocation"} == {
        ("ml", "ml/Job/train", "pool-a"), ("web", "", "pool-a"),
        ("web", "web/Deployment/api", "pool-a"),
    }  # fmt: skip


def test_each_unit_has_one_meaning(report: Any, store: Store, tmp_path: Path) -> None:
    """Issue #36, why 3: SUM(ConsumedQuantity) GROUP BY ConsumedUnit gives allocated, used
    and idle GPU-hours apart, each the report's own figure."""
    fleet(store)
    argv = ("--spread-idle", "proportional")
    _, rows = rows_of(export(report, store, tmp_path, *argv).out)
    sums: dict[str, Fraction] = defaultdict(Fraction)
    for r in rows:
        sums[r["ConsumedUnit"]] += Fraction(r["ConsumedQuantity"])
    assert set(sums) == {"GPU-Hours", "Used GPU-Hours", "Idle GPU-Hours", "kWh"}
    total = {}
    for cluster in ("alpha", "beta"):
        doc = json.loads(report(*PERIOD, *NOW, "--rate-card", str(tmp_path / "card.yaml"),
                                "--cluster", cluster, *argv, "--json", db=store).out)  # fmt: skip
        for k, v in doc["total"].items():
            if isinstance(v, int | float):
                total[k] = total.get(k, 0) + v
    close = Fraction(1, 10**4)
    assert abs(sums["GPU-Hours"] - Fraction(str(total["gpu_hours_physical"]))) < close
    assert abs(sums["Used GPU-Hours"] - Fraction(str(total["gpu_hours_used"]))) < close
    assert abs(sums["Idle GPU-Hours"] - Fraction(str(total["spread_idle_gpu_hours"]))) < close


def test_used_and_idle_rows_are_per_day_clipped_to_covered_time(
    report: Any, store: Store, tmp_path: Path
) -> None:
    """Issue #36, why 4: the ledger's used GPU-hours (and energy) and the idle capacity have
    a row per charge period, as the allocations do, each inside the time the store covers (here from
    06:30 on day one, when the data begins, up to its end at 14:00 on day two)."""
    begins, ends = ts("2026-10-05T06:30:00"), ts("2026-10-06T14:00:00")
    known(store, begins, ends, cluster="c1")
    store.alloc("ml", T0, None)
    ledger(store, uid(store), [(T0 + i * H, 1800, 3_600_000, H) for i in range(28)])
    store.capacity("node-1", T0 - 30 * H, None, units=2)
    _, rows = rows_of(export(report, store, tmp_path, "--spread-idle", "even").out)
    periods = {
        meter: [(r["ChargePeriodStart"], r["ChargePeriodEnd"]) for r in rows
                if r["SkuMeter"] == meter]
        for meter in ("GPU activity", "Idle GPU capacity", "GPU energy")
    }  # fmt: skip
    assert periods["GPU activity"] == [
        ("2026-10-05T06:30:00Z", "2026-10-06T00:00:00Z"),
        ("2026-10-06T00:00:00Z", "2026-10-06T12:00:00Z"),  # the H100's price changes at 12:00
        ("2026-10-06T12:00:00Z", "2026-10-06T14:00:00Z"),
    ]
    assert periods["Idle GPU capacity"] == periods["GPU energy"] == periods["GPU activity"]
    used = [Fraction(r["ConsumedQuantity"]) for r in rows if r["SkuMeter"] == "GPU activity"]
    assert used == [7, 6, 1]  # half of 14 h, 12 h and 2 h (the ledger's windows up to 14:00)


def test_a_currency_outside_iso_4217_is_refused(
    report: Any, sqlite_store: Store, tmp_path: Path
) -> None:
    """Issue #36, why 6: XYZ looks like a code and is none; XAU (gold) is one, but no
    national currency a bill can be in."""
    sqlite_store.clear()
    fleet(sqlite_store)
    for code, needle in (
        ("XYZ", "'XYZ' is no ISO 4217 code"),
        ("XAU", "'XAU' is an ISO 4217 code but no national currency"),
    ):
        (tmp_path / "card.yaml").write_text(CARD.replace("USD", code))
        result = report(*PERIOD, *NOW, "--rate-card", str(tmp_path / "card.yaml"),
                        "--format", "focus", db=sqlite_store)  # fmt: skip
        assert_refused(result, needle)
    assert export(report, sqlite_store, tmp_path, card=CARD.replace("USD", "XOF")).rc == 0


def test_an_invoice_id_names_one_period(report: Any, sqlite_store: Store, tmp_path: Path) -> None:
    """Issue #36, why 6: two periods of one day are two invoices."""
    sqlite_store.clear()
    fleet(sqlite_store)
    (tmp_path / "card.yaml").write_text(CARD)
    ids = []
    for start, end in (("02:00", "06:30"), ("06:30", "23:00")):
        result = report("--from", f"2026-10-05T{start}:00Z", "--to", f"2026-10-05T{end}:00Z",
                        *NOW, "--rate-card", str(tmp_path / "card.yaml"), "--format", "focus",
                        db=sqlite_store)  # fmt: skip
        assert result.rc == 0, result.err
        ids.append({r["InvoiceId"] for r in rows_of(result.out)[1]})
    assert ids[1] == {f"gpuquota-{c}-20261005T063000Z-20261005T230000Z" for c in ("alpha", "beta")}
    assert not ids[0] & ids[1]


@pytest.mark.parametrize(
    ("argv", "card", "needle"),
    [
        (("--focus-tags", "team"), None, "--focus-tags: only with --format focus"),
        (("--format", "focus", "--focus-tags", "te am"), CARD,
         "--focus-tags: 'te am' is no Kubernetes label key"),
        (("--format", "focus", "--focus-provider", " "), CARD, "--focus-provider: expected a"),
        (("--format", "focus"), CARD + "focus:\n  acount: x\n", "focus.acount: unknown key"),
        (("--format", "focus"), CARD + "focus:\n  tags: team\n  provider: [a]\n",
         "focus.provider: expected a non-empty string"),
    ],
)  # fmt: skip
def test_focus_settings_are_checked(
    report: Any,
    sqlite_store: Store,
    tmp_path: Path,
    argv: tuple[str, ...],
    card: str | None,
    needle: str,
) -> None:
    sqlite_store.clear()
    fleet(sqlite_store)
    extra: tuple[str, ...] = ()
    if card is not None:
        (tmp_path / "card.yaml").write_text(card)
        extra = ("--rate-card", str(tmp_path / "card.yaml"))
    assert_refused(report(*PERIOD, *NOW, *argv, *extra, db=sqlite_store), needle)


def test_a_label_change_splits_the_rows_not_the_namespaces_share(
    report: Any, store: Store, tmp_path: Path
) -> None:
    """A namespace relabelled mid-day (team a -> b at 15:00) has a row per label value, and
    its even share of the idle capacity is still one namespace's, split between its label
    values by their GPU-hours: the report's `--by namespace --spread-idle even` figures."""
    known(store, T0 - 10 * H, T0 + 40 * H, cluster="c1")
    store.labels("ml", {"team": "a"}, T0 - 10 * H, T0 + 5 * H)
    store.labels("ml", {"team": "b"}, T0 + 5 * H, None)
    store.alloc("ml", T0, T0 + 8 * H)  # 5 h as team a, 3 h as team b
    store.alloc("web", T0, T0 + 2 * H)
    store.capacity("node-1", T0 - 10 * H, None)
    argv = ("--spread-idle", "even", "--focus-tags", "team")
    _, rows = rows_of(export(report, store, tmp_path, *argv).out)
    alloc = {
        (r["SubAccountName"], json.loads(r["Tags"]).get("team")): Fraction(r["ConsumedQuantity"])
        for r in rows
        if r["SkuMeter"] == "GPU allocation"
    }
    assert alloc == {("ml", "a"): 5, ("ml", "b"): 3, ("web", None): 2}
    idle: dict[tuple[str, str | None], Fraction] = defaultdict(Fraction)
    for r in rows:
        if r["SkuMeter"] == "Idle GPU capacity":
            idle[(r["SubAccountName"], json.loads(r["Tags"]).get("team"))] += Fraction(
                r["ConsumedQuantity"]
            )
    doc = json.loads(
        report(*PERIOD, *NOW, "--rate-card", str(tmp_path / "card.yaml"), "--spread-idle",
               "even", "--json", db=store).out
    )  # fmt: skip
    spread = {row["group"]["namespace"]: row["spread_idle_gpu_hours"] for row in doc["rows"]}
    assert abs(idle[("ml", "a")] + idle[("ml", "b")] - Fraction(str(spread["ml"]))) < 1e-4
    assert abs(idle[("web", None)] - Fraction(str(spread["web"]))) < 1e-4
    assert abs(idle[("ml", "a")] / idle[("ml", "b")] - Fraction(5, 3)) < 1e-4
