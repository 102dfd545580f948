"""The fleet history's readings from a window asked in pieces (quota/prompieces.py) are those
of the window asked in one query: the real plan's range selectors, answered here as Prometheus
2 answers them (a range includes its start, so a sample on the edge of two time slices comes in
both), over a set of agent series with state changes, reasons, counters, XID counters, a lost
GPU, an agent restart, a driver update and a sample on a slice's edge. (Against the real
Prometheus: tests/fleet/test_history.py.)"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable

from gpuquota.quota import prompieces
from gpuquota.quota.fleet.source import METRICS, Readings, readings_of
from gpuquota.quota.promhttp import MatrixSeries

LO = 1_800_000_000 - 60  # a window of an hour and a minute either side
HI = LO + 3720
EDGE = LO + 930  # an edge of every plan of 4 slices (3720 / 4), on a 15 s scrape
QUERY = re.compile(
    r'\{__name__=~"(?P<names>[^"]*)"(?:,uuid(?P<op>=~|!~)"(?P<re>.*)")?\}\[(?P<len>\d+)s\]'
)

Said = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (metric, labels) -> value


def scrapes(offset: float = 0.0, skip: tuple[int, int] | None = None) -> list[float]:
    """An agent's scrape times (every 15 s, from before LO to after HI)."""
    times = [LO - 30 + 15 * k + offset for k in range(3720 // 15 + 5)]
    return [t for t in times if skip is None or not skip[0] <= t - LO < skip[1]]


def agent(
    uuid: str, node: str, times: list[float], said: Callable[[float], Said]
) -> list[MatrixSeries]:
    """The series of what one agent said about one GPU at each scrape."""
    base = {"gpu": "0", "uuid": uuid, "node": node, "instance": f"{node}:9400"}
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    for t in times:
        for key, value in said(t).items():
            samples.setdefault(key, []).append((t, value))
    return [
        MatrixSeries({"__name__": name, **base, **dict(labels)}, values)
        for (name, labels), values in samples.items()
    ]


def health(
    serial: str,
    state: str,
    since: float,
    reasons: tuple[tuple[str, str], ...] = (),
    driver: str = "550.54.15",
) -> Said:
    """One scrape's identity and verdict."""
    info = (
        ("driver_version", driver),
        ("model", "NVIDIA H100 80GB HBM3"),
        ("pci_bus_id", "00000000:18:00.0"),
        ("serial", serial),
    )
    out: Said = {("gpu_info", info): 1.0, ("gpu_health_since_timestamp_seconds", ()): since}
    for s in ("healthy", "degraded", "unhealthy"):
        out[("gpu_health_state", (("state", s),))] = float(s == state)
    for reason, action in reasons:
        out[("gpu_health_reason", (("action", action), ("reason", reason)))] = 1.0
    return out


def s1(t: float) -> Said:
    """Fenced at EDGE by XID 79 (its counter steps on the edge), released at LO+2400; an
    XID 13 at LO+1000."""
    if EDGE <= t < LO + 2400:
        said = health("S1", "unhealthy", EDGE, (("xid_79", "reboot_node"),))
    else:
        said = health("S1", "healthy", LO - 600 if t < EDGE else LO + 2400)
    said[("gpu_xid_errors_total", (("xid", "79"),))] = float(t >= EDGE)
    said[("gpu_xid_errors_total", (("xid", "13"),))] = 2.0 if t < LO + 1000 else 3.0
    return said


def s2(t: float) -> Said:
    """Degraded by a pending row remap from LO+2000 (its correctable remapped rows 0 -> 2
    just before); a NaN from a failed NVML read at LO+1500."""
    if t >= LO + 2000:
        said = health("S2", "degraded", LO + 2000, (("row_remap_pending", "reset_gpu"),))
    else:
        said = health("S2", "healthy", LO - 900)
    remapped = t >= LO + 1990
    said[("gpu_remapped_rows_total", (("cause", "correctable"),))] = 2.0 * remapped
    said[("gpu_remapped_rows_total", (("cause", "uncorrectable"),))] = 0.0
    said[("gpu_row_remap_pending", ())] = math.nan if round(t) == LO + 1500 else float(remapped)
    said[("gpu_ecc_aggregate_errors_total", (("type", "corrected"),))] = 7.0
    said[("gpu_ecc_aggregate_errors_total", (("type", "uncorrected"),))] = 0.0
    return said


def s3(t: float) -> Said:
    """Lost in [LO+3000, LO+3300); its driver updated at LO+2500 (a second gpu_info)."""
    said = health("S3", "healthy", LO - 60, driver="550.54.15" if t < LO + 2500 else "550.90.07")
    lost = LO + 3000 <= t < LO + 3300
    said[("gpu_device_state", (("state", "ok"),))] = float(not lost)
    said[("gpu_device_state", (("state", "lost"),))] = float(lost)
    said[("gpu_retired_pages_pending", ())] = 0.0
    return said


def fleet() -> list[MatrixSeries]:
    """Five GPUs of two nodes (UUIDs in different shards, one outside every hex shard) and a
    MIG instance, as Prometheus answers them (series sorted by labels)."""
    s1_uuid = "GPU-5a1b2c3d-0000-1111-2222-3344556677ff"
    out = agent(s1_uuid, "node-1", scrapes(), s1)
    # scraped off the second (Prometheus' own timestamps)
    out += agent("GPU-0c9e8f7a-1b2c-3d4e-5f60-71829304a50a", "node-1", scrapes(0.317), s2)
    # its agent restarts: no scrapes for 90 s
    out += agent(
        "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1b7", "node-2", scrapes(skip=(1500, 1590)), s3
    )
    # no serial (tracked by its UUID), a UUID no hex shard takes
    out += agent("GPU-odd-uuid-xyz", "node-2", scrapes(), lambda t: health("", "healthy", LO))
    # joins node-2 mid-window
    joined = [t for t in scrapes() if t >= LO + 1805]
    out += agent(
        "GPU-77e0c3d2-aaaa-bbbb-cccc-0123456789c3",
        "node-2",
        joined,
        lambda t: health("S5", "healthy", LO + 1805),
    )
    # a MIG instance of S1: not a board of its own
    out += agent(
        "MIG-1f2e3d4c-0000-1111-2222-333344445555",
        "node-1",
        scrapes(),
        lambda t: health("M", "healthy", LO),
    )
    return sorted(out, key=lambda s: sorted(s.metric.items()))


def answer(everything: list[MatrixSeries], promql: str, at: int) -> list[MatrixSeries]:
    """What Prometheus 2 answers to the range selector ``promql`` at ``at``: the series it
    selects with their samples in [at - length, at], those without any left out."""
    match = QUERY.fullmatch(promql)
    assert match is not None, promql
    names = set(match["names"].split("|"))
    out = []
    for item in everything:
        if item.metric["__name__"] not in names:
            continue
        if match["op"] is not None:
            hit = re.fullmatch(match["re"], item.metric.get("uuid", "")) is not None
            if hit != (match["op"] == "=~"):
                continue
        times = [t for t, _ in item.values]
        first = bisect.bisect_left(times, at - int(match["len"]))
        last = bisect.bisect_right(times, at)
        if first < last:
            out.append(MatrixSeries(item.metric, item.values[first:last]))
    return out


def total_in_window(everything: list[MatrixSeries]) -> int:
    return sum(1 for s in everything for t, _ in s.values if LO <= t <= HI)


def test_readings_from_many_pieces_are_those_of_one_query() -> None:
    everything = fleet()
    total = total_in_window(everything)
    ((whole_query, at),) = prompieces.queries(METRICS, LO, HI, total, total)
    readings, xids = readings_of(answer(everything, whole_query, at))
    # what the window holds: every scrape of the four GPUs that have gpu_info, both XIDs
    assert len(readings) == len({(r.identity.uuid, r.t) for r in readings}) > 900
    assert {r.serial for r in readings} == {"S1", "S2", "S3", "S5", "uuid:GPU-odd-uuid-xyz"}
    assert [(x.code, x.samples[0][0], x.samples[-1][0], len(x.samples)) for x in xids] == [
        ("13", LO, HI, 249),
        ("79", LO, HI, 249),
    ]
    on_edge = [r for r in readings if r.t == EDGE and r.serial == "S1"]
    assert on_edge[0].state == "unhealthy" and on_edge[0].reasons == (("xid_79", "reboot_node"),)
    assert (EDGE, 1.0) in xids[1].samples and (EDGE - 15, 0.0) in xids[1].samples
    nan = [r for r in readings if r.serial == "S2" and round(r.t) == LO + 1500]
    assert "gpu_row_remap_pending" not in nan[0].counters

    # 4 and 16 shards; 256 shards and 2, 4 (EDGE among the edges) and 5 slices of time
    for max_samples, slices in ((5_000, 1), (1_000, 1), (20, 2), (10, 4), (8, 5)):
        count, edges = prompieces.plan(total, LO, HI, max_samples)
        assert len(edges) - 1 == slices
        plan = prompieces.queries(METRICS, LO, HI, total, max_samples)
        assert len(plan) == (count + 1) * slices  # and the shard of other UUIDs
        assert slices != 4 or EDGE in edges
        pieces = Readings()
        for promql, at in plan:
            pieces.add(answer(everything, promql, at))
        assert pieces.result() == (readings, xids), max_samples
