"""A property test of the report's views (issue #27, item 7): for generated stores, every
grouping's rows add up to the same totals, a group's figure is the same in every view that
contains it (finer groupings, --top, the table and JSON), idle never exceeds the covered
capacity, and nothing outside the covered time is priced."""

from __future__ import annotations

import json
from datetime import UTC
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert
from sqlalchemy.engine import Connection

from gpuquota.quota.report import compute, render
from gpuquota.quota.report.build import ReportRequest, build_report
from gpuquota.quota.report.period import Period
from gpuquota.quota.report.ratecard import parse
from gpuquota.quota.store.models import Cluster, Gap, Heartbeat
from tests.report.conftest import A100, H100, Store, ts

T0 = ts("2026-10-01T00:00:00")
H = 3600
SPAN = 48 * H  # the generated stores live in two days
CARD = parse({"currency": "USD", "default_rate": 1, "models": {H100: 3, A100: 2}})
RATE = {H100: Fraction(3), A100: Fraction(2)}

allocation = st.tuples(
    st.sampled_from(["ml", "web", "batch"]),  # namespace
    st.sampled_from([("Job", "a"), ("Job", "b"), None]),  # owner
    st.sampled_from([H100, A100]),  # model
    st.integers(1, 4),  # units
    st.integers(0, SPAN - 1),  # start
    st.integers(1, 20 * H),  # length
    st.sampled_from([None, 2, 7]),  # sharing: whole, 2 replicas, MIG sevenths
)
stores = st.fixed_dictionaries(
    {
        "begins": st.integers(0, 12).map(lambda h: T0 + h * H),
        "ends": st.integers(30, 48).map(lambda h: T0 + h * H),
        "gap": st.none() | st.tuples(st.integers(0, 40), st.integers(1, 8)),
        "allocations": st.lists(allocation, min_size=1, max_size=8),
        "capacity": st.lists(
            st.tuples(st.sampled_from([H100, A100]), st.integers(1, 8), st.integers(0, 24)),
            min_size=1,
            max_size=3,
        ),
    }
)


def _fill(store: Store, spec: dict[str, Any]) -> None:
    store.clear()
    with store.engine.begin() as conn:
        conn.execute(insert(Cluster).values(name="c1", created_at=spec["begins"]))
        conn.execute(
            insert(Heartbeat).values(
                cluster="c1", holder="replay", at=spec["ends"], resource_versions={}
            )
        )
        if spec["gap"] is not None:
            at, hours = spec["gap"]
            conn.execute(
                insert(Gap).values(
                    cluster="c1",
                    kind="Pod",
                    started_at=T0 + at * H,
                    ended_at=T0 + (at + hours) * H,
                    reason="restart",
                )
            )
    for i, (model, units, start_h) in enumerate(spec["capacity"]):
        store.capacity(f"n{i}", T0 - H + start_h * H, None, units=units, model=model,
                       pool=f"pool-{model[-4:]}")  # fmt: skip
    for ns, owner, model, units, start, length, sharing in spec["allocations"]:
        physical = Fraction(units) if sharing is None else Fraction(units, sharing)
        store.alloc(ns, T0 + start, T0 + start + length, units=units, physical=physical,
                    model=model, owner=owner, pool=f"pool-{model[-4:]}")  # fmt: skip


def _report(conn: Connection, keys: tuple[str, ...], **extra: Any) -> compute.Report:
    request = ReportRequest(
        window=Period(T0 - 6 * H, T0 + SPAN, UTC),
        now=T0 + 30 * 24 * H,
        keys=keys,
        card=CARD,
        **extra,
    )
    return build_report(conn, request)


def _by(report: compute.Report, key: str) -> dict[str | None, tuple[Fraction, ...]]:
    """Each group's (raw, physical, cost) added up by one of its keys."""
    at = report.keys.index(key)
    out: dict[str | None, tuple[Fraction, ...]] = {}
    for g in report.groups:
        old = out.get(g.keys[at], (Fraction(0),) * 3)
        out[g.keys[at]] = tuple(
            a + b for a, b in zip(old, (g.raw_seconds, g.physical_seconds, g.cost), strict=True)
        )
    return out


def _covered_seconds(spec: dict[str, Any], start: int, end: int) -> int:
    """Seconds of [start, end) inside the store's covered time, computed apart."""
    lo, hi = max(start, spec["begins"]), min(end, spec["ends"])
    seconds = max(hi - lo, 0)
    if spec["gap"] is not None and seconds:
        g0, g1 = T0 + spec["gap"][0] * H, T0 + (spec["gap"][0] + spec["gap"][1]) * H
        seconds -= max(min(hi, g1) - max(lo, g0), 0)
    return seconds


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(spec=stores)
def test_every_view_of_a_bill_agrees(sqlite_store: Store, spec: dict[str, Any]) -> None:
    _fill(sqlite_store, spec)
    # the store's own connection: the reads one after another (a report's read-only
    # connection reads side by side in threads; one report per connection, as the CLI does)
    with sqlite_store.engine.connect() as conn:
        _check(conn, spec)


def _check(conn: Connection, spec: dict[str, Any]) -> None:
    by_ns = _report(conn, ("namespace",), idle=True, spread_idle="proportional")
    totals = (
        sum((g.raw_seconds for g in by_ns.groups), Fraction(0)),
        sum((g.physical_seconds for g in by_ns.groups), Fraction(0)),
        sum((g.cost for g in by_ns.groups), Fraction(0)),
    )
    # every grouping's rows add up to the same totals; a group's figure is the same where a
    # finer grouping contains it
    ns_figures = _by(by_ns, "namespace")
    for keys in (("owner",), ("namespace", "model"), ("pool",)):
        other = _report(conn, keys)
        assert (
            tuple(sum((v[i] for v in _by(other, keys[0]).values()), Fraction(0)) for i in range(3))
            == totals
        ), keys
        if "namespace" in keys:
            assert _by(other, "namespace") == ns_figures
    # an owner belongs to one namespace: owners regroup exactly into namespaces
    by_owner_ns = _report(conn, ("owner", "namespace"))
    for owner, ns in {g.keys for g in by_owner_ns.groups}:
        assert owner is None or owner.startswith(f"{ns}/")
    # the printed figure of a group is its own: the same with --top and in JSON
    top = _report(conn, ("namespace",), top=1)
    cols = render.columns(by_ns)
    rows, _totals = render.table_cells(by_ns.groups, cols)
    top_rows, _ = render.table_cells(top.groups, render.columns(top))
    first = {c.name: x.text() for c, x in zip(cols, rows[0], strict=True)}
    assert {c.name: x.text() for c, x in zip(render.columns(top), top_rows[0], strict=True)}[
        "gpu_hours_raw"
    ] == first["gpu_hours_raw"]
    doc = json.loads(render.render_json(by_ns, Period(T0 - 6 * H, T0 + SPAN, UTC)))
    for g, line, entry in zip(by_ns.groups, rows, doc["rows"], strict=True):
        assert entry["group"]["namespace"] == g.keys[0]
        for c, x in zip(cols, line, strict=True):
            if x.exact is not None:  # JSON carries the exact figure the table rounds
                assert entry[c.name] == float(x.exact)
    # idle: only covered time, never more than the covered capacity, priced at the rate
    assert by_ns.idle is not None
    by_model = {r.gpu_model: r for r in by_ns.idle}
    for model in (H100, A100):
        covered = sum(
            (
                Fraction(units) * _covered_seconds(spec, T0 - H + start_h * H, T0 + SPAN)
                for m, units, start_h in spec["capacity"]
                if m == model
            ),
            Fraction(0),
        )
        r = by_model.get(model)
        if r is None:
            assert covered == 0
            continue
        assert r.allocatable_seconds == covered
        assert 0 <= r.idle_seconds <= r.allocatable_seconds
        assert r.idle_seconds >= r.allocatable_seconds - r.allocated_seconds
        assert r.idle_cost == r.idle_seconds * RATE[model] / H
    # the spread shares out exactly the idle table's idle, nothing else
    idle_total = sum((r.idle_seconds for r in by_ns.idle), Fraction(0))
    spread = sum((g.idle_seconds or Fraction(0) for g in by_ns.groups), Fraction(0))
    assert spread == idle_total
