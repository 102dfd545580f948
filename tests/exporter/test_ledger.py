"""The usage counters' pure rules (exporter/enrich/ledger.py): hand-made snapshots in, totals out;
no NVML, no threads, no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from gpuquota.exporter.enrich.ledger import (
    PROCESS_SM,
    SM_ACTIVE,
    UTILIZATION,
    LedgerConfig,
    LedgerState,
    advance,
    published,
)
from gpuquota.exporter.expose.render import Renderer, RenderOptions
from gpuquota.exporter.snapshot import (
    ClaimRef,
    DeviceSnapshot,
    DeviceState,
    GpmMetrics,
    HolderTotals,
    NodeSnapshot,
    PodRef,
    PodUsage,
    ProcessUtilization,
)
from tests.exporter.factories import gpu, mig, node
from tests.exporter.scrape import parse, value

T0 = 1_700_000_000.0
UIDS = {
    ("pod", "team-a", "a"): "uid-a",
    ("pod", "team-b", "b"): "uid-b",
    ("claim", "team-c", "shared"): "uid-claim",
}
G0 = gpu(0).uuid
DEFAULT = LedgerConfig()


def _ref(ns: str, pod: str) -> PodRef:
    return PodRef(ns, pod, "main")


def _usage(ns: str, pod: str, sm: float, covered: float = 1.0) -> PodUsage:
    """A pod whose processes' new samples report ``sm`` over ``covered`` seconds."""
    return PodUsage("pod", ns, pod, "main", 1, None, sm, 0.0, sm_seconds_sampled=sm * covered)


def _snap(
    t: float,
    devices: Sequence[DeviceSnapshot],
    pods: Mapping[str, tuple[PodRef, ...]] | None = None,
    **extra: object,
) -> NodeSnapshot:
    return node(*devices, collected_at=t, pods=dict(pods or {}), **extra)


def _run(
    snaps: Sequence[NodeSnapshot],
    uids: Mapping[tuple[str, str, str], str | None] = UIDS,
    state: LedgerState | None = None,
    config: LedgerConfig = DEFAULT,
) -> LedgerState:
    state = state or LedgerState()
    for snap in snaps:
        state = advance(state, snap, uids, config)
    return state


def _totals(state: LedgerState, uuid: str, name: str) -> HolderTotals:
    (found,) = [t for t in published(state).get(uuid, ()) if t.name == name]
    return found


def _whole(t: float, energy: float, **device: object) -> DeviceSnapshot:
    values: dict[str, object] = {"gpm": GpmMetrics(sm_active=0.5), "power_watts": 400.0}
    values.update(device)
    return gpu(0, energy_joules=energy, **values)


def test_exclusive_gpu_counts_gpm_sm_activity_and_all_its_energy() -> None:
    pods = {G0: (_ref("team-a", "a"),)}
    state = _run([_snap(T0 + i * 10, [_whole(T0, 1000.0 + 4000 * i)], pods) for i in range(4)])
    a = _totals(state, G0, "a")
    # 3 steps of 10 s at 0.5; the first collection adds nothing
    assert (a.activity, a.used_seconds) == (SM_ACTIVE, pytest.approx(15.0))
    assert a.energy_joules == pytest.approx(12000.0)
    assert (a.kind, a.namespace, a.uid) == ("pod", "team-a", "uid-a")
    assert state.unallocated[G0] == 0.0


def test_without_gpm_the_utilization_ratio_is_used_and_labelled_so() -> None:
    pods = {G0: (_ref("team-a", "a"),)}
    snaps = [
        _snap(T0 + i, [_whole(T0, 10.0 * i, gpm=None, gpu_utilization_ratio=0.25)], pods)
        for i in range(5)
    ]
    got = _totals(_run(snaps), G0, "a")
    assert (got.activity, got.used_seconds) == (UTILIZATION, pytest.approx(1.0))


def _shared(sm_a: float, sm_b: float, energy: float) -> DeviceSnapshot:
    return _whole(
        T0,
        energy,
        process_utilization=(ProcessUtilization(1, sm_a, 0, 0, 0),),
        power_watts=100.0,
    )


def test_time_sliced_gpu_splits_activity_and_energy_by_process_sm() -> None:
    pods = {G0: (_ref("team-a", "a"), _ref("team-b", "b"))}
    snaps = [
        _snap(
            T0 + i,
            [_shared(0.6, 0.2, 100.0 * i)],
            pods,
            pod_usage={G0: (_usage("team-a", "a", 0.6), _usage("team-b", "b", 0.2))},
        )
        for i in range(3)
    ]
    state = _run(snaps)
    a, b = _totals(state, G0, "a"), _totals(state, G0, "b")
    assert (a.activity, a.used_seconds) == (PROCESS_SM, pytest.approx(1.2))
    assert (b.activity, b.used_seconds) == (PROCESS_SM, pytest.approx(0.4))
    assert a.energy_joules == pytest.approx(150.0)  # 200 J split 3:1
    assert b.energy_joules == pytest.approx(50.0)


def test_a_round_that_cannot_measure_leaves_the_used_counter_out() -> None:
    """Unmeasured is not idle: a shared GPU whose per-process utilisation NVML did not answer
    this round adds nothing and publishes no used counter (the ledger sees a gap, so the bill
    shows lost coverage, not zero use); the next measured round continues the same counter."""
    pods = {G0: (_ref("team-a", "a"), _ref("team-b", "b"))}
    usage = {G0: (_usage("team-a", "a", 0.6), _usage("team-b", "b", 0.2))}
    blind = _whole(T0, 200.0, process_utilization=None, power_watts=100.0)
    state = _run([
        _snap(T0, [_shared(0.6, 0.2, 0.0)], pods, pod_usage=usage),
        _snap(T0 + 1, [_shared(0.6, 0.2, 100.0)], pods, pod_usage=usage),
        _snap(T0 + 2, [blind], pods, pod_usage={G0: ()}),
    ])  # fmt: skip
    a = _totals(state, G0, "a")
    assert (a.activity, a.used_seconds) == ("", pytest.approx(0.6))  # left out, nothing added
    assert a.energy_joules > 0  # energy is still apportioned (equally: no activity known)
    out = parse(Renderer().render(_snap(T0 + 2, [blind], pods, usage_totals=published(state))))
    assert "gpu_pod_used_seconds_total" not in out
    assert len(out["gpu_pod_energy_joules_total"]) == 2
    state = advance(state, _snap(T0 + 3, [_shared(0.6, 0.2, 300.0)], pods, pod_usage=usage),
                    UIDS, DEFAULT)  # fmt: skip
    a = _totals(state, G0, "a")
    assert (a.activity, a.used_seconds) == (PROCESS_SM, pytest.approx(1.2))


def test_a_held_process_sample_adds_no_use() -> None:
    """The gauges keep a process's last sample a few seconds (exporter/collect/profiling.py);
    the counter takes only new samples: no sample in a second is no use that second (on a
    real time-sliced H100 a process had none in seconds the other one filled, real-h100.md)."""
    pods = {G0: (_ref("team-a", "a"), _ref("team-b", "b"))}
    fresh = (_usage("team-a", "a", 0.6), _usage("team-b", "b", 0.2))
    held = (
        PodUsage("pod", "team-a", "a", "main", 1, None, 0.6, 0.0, sm_seconds_sampled=0.0),
        _usage("team-b", "b", 0.2),
    )
    snaps = [
        _snap(T0 + i, [_shared(0.6, 0.2, 100.0 * i)], pods,
              pod_usage={G0: fresh if i < 2 else held})
        for i in range(4)
    ]  # fmt: skip
    state = _run(snaps)
    a, b = _totals(state, G0, "a"), _totals(state, G0, "b")
    assert (a.activity, a.used_seconds) == (PROCESS_SM, pytest.approx(0.6))  # one fresh step
    assert (b.activity, b.used_seconds) == (PROCESS_SM, pytest.approx(0.6))  # three


def test_process_use_is_what_the_samples_cover_not_the_round_step() -> None:
    """The driver is asked once a second whatever the collection interval, and an answer that
    comes late covers the time since the ask before: a round with no new sample adds nothing,
    the late one adds all it covers (a starved agent loses nothing)."""
    pods = {G0: (_ref("team-a", "a"), _ref("team-b", "b"))}
    held = (_usage("team-a", "a", 0.6, covered=0.0), _usage("team-b", "b", 0.2, covered=0.0))
    steps = [(0.0, 1.0), (1.0, 1.0), (1.4, 0.0), (2.9, 1.9)]  # (round at, seconds covered)
    snaps = [
        _snap(T0 + at, [_shared(0.6, 0.2, 100.0 * at)], pods,
              pod_usage={G0: held if not covered else
                         (_usage("team-a", "a", 0.6, covered), _usage("team-b", "b", 0.2, covered))})
        for at, covered in steps
    ]  # fmt: skip
    state = _run(snaps)
    assert _totals(state, G0, "a").used_seconds == pytest.approx(0.6 * (1.0 + 1.9))
    assert _totals(state, G0, "b").used_seconds == pytest.approx(0.2 * (1.0 + 1.9))
    # the energy split weighs the latest ratios, held ones included (3:1 throughout)
    assert _totals(state, G0, "a").energy_joules == pytest.approx(0.75 * 290.0)


def test_mps_and_idle_moments_on_a_shared_gpu_split_energy_equally() -> None:
    pods = {G0: (_ref("team-a", "a"), _ref("team-b", "b"))}
    busy = {G0: (_usage("team-a", "a", 0.5),)}
    idle: dict[str, tuple[PodUsage, ...]] = {G0: ()}
    # 1 s busy (only a) at 300 W then 1 s idle at 100 W: 400 J in one counter step
    snaps = [
        _snap(T0, [_shared(0, 0, 0.0)], pods, pod_usage=busy),
        _snap(T0 + 1, [_whole(T0, 0.0, process_utilization=(), power_watts=300.0)], pods,
              pod_usage=busy),
        _snap(T0 + 2, [_whole(T0, 400.0, process_utilization=(), power_watts=100.0)], pods,
              pod_usage=idle),
    ]  # fmt: skip
    state = _run(snaps)
    a, b = _totals(state, G0, "a"), _totals(state, G0, "b")
    assert a.energy_joules == pytest.approx(350.0)  # the busy moment all, half the idle one
    assert b.energy_joules == pytest.approx(50.0)
    assert (b.activity, b.used_seconds) == (PROCESS_SM, 0.0)
    assert a.energy_joules + b.energy_joules == pytest.approx(400.0)


def test_mig_instances_count_own_gpm_times_n_over_7_and_the_unheld_share_is_unallocated() -> None:
    parent = gpu(0, mig_mode_enabled=True, power_watts=700.0)
    small = mig(parent, 1, 1, "1g.10gb")
    big = mig(parent, 2, 2, "3g.40gb")
    pods = {small.uuid: (_ref("team-a", "a"),)}  # big is unheld

    def at(i: int) -> NodeSnapshot:
        return _snap(
            T0 + 3600 * i,
            [
                replace(parent, energy_joules=7000.0 * i),
                replace(small, gpm=GpmMetrics(sm_active=1.0)),
                replace(big, gpm=GpmMetrics(sm_active=1.0)),
            ],
            pods,
        )

    state = _run([at(0), at(1)], config=LedgerConfig(max_gap_s=3600))
    a = _totals(state, small.uuid, "a")
    assert (a.activity, a.used_seconds) == (SM_ACTIVE, pytest.approx(3600 / 7))
    assert a.energy_joules == pytest.approx(1000.0)  # 1/7 of the parent's
    assert state.unallocated[parent.uuid] == pytest.approx(6000.0)


def test_a_shared_dra_claim_is_charged_once_not_per_pod() -> None:
    claim = [
        ClaimRef("team-c", "shared", "team-c", pod, "main", "gpu.nvidia.com", "n", "gpu-0")
        for pod in ("p1", "p2")
    ]
    pods = {G0: (_ref("team-c", "p1"), _ref("team-c", "p2"))}
    snaps = [
        _snap(T0 + i, [_whole(T0, 100.0 * i)], pods, claims={G0: tuple(claim)}) for i in range(3)
    ]
    state = _run(snaps)
    (only,) = published(state)[G0]
    assert (only.kind, only.name, only.uid) == ("claim", "shared", "uid-claim")
    assert (only.activity, only.used_seconds) == (SM_ACTIVE, pytest.approx(1.0))
    assert only.energy_joules == pytest.approx(200.0)


def test_unheld_gpu_energy_goes_to_unallocated() -> None:
    state = _run([_snap(T0 + i, [_whole(T0, 50.0 * i)]) for i in range(3)])
    assert published(state) == {}
    assert state.unallocated[G0] == pytest.approx(100.0)


def test_a_failed_collection_or_a_lost_gpu_adds_nothing_and_starts_a_new_baseline() -> None:
    pods = {G0: (_ref("team-a", "a"),)}
    snaps = [
        _snap(T0, [_whole(T0, 0.0)], pods),
        _snap(T0 + 1, [_whole(T0, 100.0)], pods),
        _snap(T0 + 2, [_whole(T0, 200.0)], pods, ok=False),
        _snap(T0 + 3, [_whole(T0, 300.0)], pods),  # baseline again: adds nothing
        _snap(T0 + 4, [gpu(0, state=DeviceState.LOST, energy_joules=None)], pods),
        _snap(T0 + 5, [_whole(T0, 500.0)], pods),  # baseline again
        _snap(T0 + 6, [_whole(T0, 600.0)], pods),
    ]
    a = _totals(_run(snaps), G0, "a")
    assert a.energy_joules == pytest.approx(200.0)  # 0->100 and 500->600 only
    # 0.5 x (the step to T0+1, and the steps to T0+5 and T0+6): the failed round, the round
    # after it and the lost GPU's round add no activity
    assert (a.activity, a.used_seconds) == (SM_ACTIVE, pytest.approx(1.5))


def test_the_first_per_process_answer_after_a_loss_is_unmeasured_not_idle() -> None:
    """A shared GPU comes back from a loss: its first per-process answer is a baseline (asked
    from 0), which covers unknown time. Taken as a measured zero it would publish the used
    counter unchanged, and the ledger would read the round as idle, covered time; it is left
    out instead (a gap: lost coverage), and the next answer counts what it covers."""
    pods = {G0: (_ref("team-a", "a"), _ref("team-b", "b"))}
    usage = {G0: (_usage("team-a", "a", 0.6), _usage("team-b", "b", 0.2))}
    first = (_usage("team-a", "a", 0.6, covered=0.0), _usage("team-b", "b", 0.2, covered=0.0))
    baseline = _whole(
        T0, 300.0, power_watts=100.0,
        process_utilization=(ProcessUtilization(1, 0.6, 0, 0, 0, baseline=True),),
    )  # fmt: skip
    state = _run([
        _snap(T0, [_shared(0.6, 0.2, 0.0)], pods, pod_usage=usage),
        _snap(T0 + 1, [_shared(0.6, 0.2, 100.0)], pods, pod_usage=usage),
        _snap(T0 + 2, [gpu(0, state=DeviceState.LOST, energy_joules=None)], pods),
        _snap(T0 + 3, [baseline], pods, pod_usage={G0: first}),
    ])  # fmt: skip
    a = _totals(state, G0, "a")
    assert (a.activity, a.used_seconds) == ("", pytest.approx(0.6))  # left out, not idle
    out = parse(Renderer().render(_snap(T0 + 3, [baseline], pods, usage_totals=published(state))))
    assert "gpu_pod_used_seconds_total" not in out
    state = advance(state, _snap(T0 + 4, [_shared(0.6, 0.2, 400.0)], pods, pod_usage=usage),
                    UIDS, DEFAULT)  # fmt: skip
    a = _totals(state, G0, "a")
    assert (a.activity, a.used_seconds) == (PROCESS_SM, pytest.approx(1.2))


def test_counters_never_decrease_even_when_the_energy_counter_goes_back() -> None:
    pods = {G0: (_ref("team-a", "a"),)}
    energies = [0.0, 100.0, 100.0, 250.0, 10.0, 60.0, 60.0, 90.0]
    state, last = LedgerState(), (0.0, 0.0)
    for i, e in enumerate(energies):
        state = advance(state, _snap(T0 + i, [_whole(T0, e)], pods), UIDS)
        t = _totals(state, G0, "a")
        now = (t.used_seconds, t.energy_joules)
        assert now[0] >= last[0] and now[1] >= last[1]
        last = now
    assert last[1] == pytest.approx(250.0 + 80.0)  # the reset (250 -> 10) adds nothing


def test_usage_before_the_uid_is_known_is_in_the_first_published_value() -> None:
    pods = {G0: (_ref("team-a", "a"),)}
    snaps = [_snap(T0 + i, [_whole(T0, 100.0 * i)], pods) for i in range(4)]
    state = _run(snaps[:3], uids={})
    assert published(state) == {}
    state = _run(snaps[3:], state=state)
    a = _totals(state, G0, "a")
    assert a.energy_joules == pytest.approx(300.0)
    assert (a.activity, a.used_seconds) == (SM_ACTIVE, pytest.approx(1.5))


def test_a_recreated_pod_of_the_same_name_starts_from_zero() -> None:
    pods = {G0: (_ref("team-a", "a"),)}
    snaps = [_snap(T0 + i, [_whole(T0, 100.0 * i)], pods) for i in range(3)]
    state = _run(snaps)
    state = _run([_snap(T0 + 3, [_whole(T0, 300.0)], pods)],
                 uids={("pod", "team-a", "a"): "uid-a2"}, state=state)  # fmt: skip
    a = _totals(state, G0, "a")
    assert a.uid == "uid-a2"
    assert a.energy_joules == pytest.approx(100.0)


def test_the_counters_render_with_the_contract_labels() -> None:
    pods = {G0: (_ref("team-a", "a"),)}
    state = _run([_snap(T0 + i, [_whole(T0, 100.0 * i)], pods) for i in range(3)])
    snap = _snap(T0 + 2, [_whole(T0, 200.0)], pods, usage_totals=published(state),
                 unallocated_energy={G0: 5.0})  # fmt: skip
    out = parse(Renderer().render(snap))
    at = {"gpu": "0", "uuid": G0}
    pod = {"namespace": "team-a", "pod": "a", "pod_uid": "uid-a", **at}
    assert value(out, "gpu_pod_used_seconds_total", activity="sm_active", **pod) == 1.0
    assert value(out, "gpu_pod_energy_joules_total", **pod) == 200.0
    assert value(out, "gpu_unallocated_energy_joules_total", **at) == 5.0


def test_dcgm_compat_rows_are_unchanged_by_the_counters() -> None:
    pods = {G0: (_ref("team-a", "a"),)}
    state = _run([_snap(T0 + i, [_whole(T0, 100.0 * i)], pods) for i in range(3)])
    plain = _snap(T0 + 2, [_whole(T0, 200.0)], pods)
    counted = replace(plain, usage_totals=published(state), unallocated_energy={G0: 5.0})
    renderer = Renderer(RenderOptions(compat=frozenset({"dcgm"})))

    def dcgm(snap: NodeSnapshot) -> list[str]:
        text = renderer.render(snap).decode()
        return [line for line in text.splitlines() if "DCGM_" in line]

    assert dcgm(counted) == dcgm(plain) and len(dcgm(plain)) > 20
    assert b"gpu_pod_energy_joules_total{" in renderer.render(counted)
