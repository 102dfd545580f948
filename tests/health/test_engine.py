"""The XID table and the health state machine, without any I/O."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuquota.exporter.health.config import defaults, parse_config
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.health.verdict import Action, NodeHealth, State
from gpuquota.exporter.snapshot import DeviceSnapshot, DeviceState, NodeSnapshot, NvLinkCounters
from tests.health.factory import gpu, gpus, mig, node

H, D, U = State.HEALTHY, State.DEGRADED, State.UNHEALTHY
DEFAULT_XID_RULES = defaults().xid_rules

# What the documentation promises for the XIDs operators meet most (docs/health.md).
DOCUMENTED = [
    (13, D, Action.RESTART_APP),
    (31, D, Action.RESTART_APP),
    (43, H, Action.NONE),
    (45, H, Action.NONE),
    (48, U, Action.RESET_GPU),
    (63, H, Action.NONE),
    (64, U, Action.RESET_GPU),
    (68, D, Action.RESTART_APP),
    (74, U, Action.RESET_GPU),
    (79, U, Action.REBOOT_NODE),
    (92, D, Action.NONE),
    (94, D, Action.RESTART_APP),
    (95, U, Action.RESET_GPU),
    (109, U, Action.RESET_GPU),
    (119, U, Action.RESET_GPU),
    (120, U, Action.RESET_GPU),
    (140, U, Action.RESET_GPU),
]


@pytest.mark.parametrize(("xid", "state", "action"), DOCUMENTED)
def test_default_xid_table(xid: int, state: State, action: Action) -> None:
    rule = DEFAULT_XID_RULES[xid]
    assert (rule.state, rule.action) == (state, action)


def test_nvidia_device_plugin_skip_list_never_withdraws_a_gpu_except_109() -> None:
    # NVIDIA's plugin ignores 13, 31, 43, 45, 68, 109; we agree except for 109 (catalog: reset).
    for xid in (13, 31, 43, 45, 68):
        assert DEFAULT_XID_RULES[xid].state is not State.UNHEALTHY
    assert DEFAULT_XID_RULES[109].note


def test_table_is_consistent() -> None:
    for xid, rule in DEFAULT_XID_RULES.items():
        assert rule.xid == xid
        assert rule.mnemonic and rule.description and rule.catalog
        # A healthy verdict never recommends doing something.
        assert rule.state is not State.HEALTHY or rule.action is Action.NONE


def tracker(quiet: float = 300.0) -> DeviceTracker:
    return DeviceTracker(parse_config(None, quiet_period_s=quiet))


def one(health: NodeHealth, uuid: str = "GPU-00000000"):
    return health.by_uuid()[uuid]


def test_starts_healthy_with_since_of_first_snapshot() -> None:
    t = tracker()
    h = t.observe_snapshot(node(*gpus(2)), now=100.0)
    assert [d.state for d in h.devices] == [H, H]
    assert one(h).since == 100.0 and one(h).action is Action.NONE and one(h).reasons == ()
    assert h.generation == 1


def test_fatal_xid_then_recovery_after_quiet_period() -> None:
    t = tracker(quiet=300)
    t.observe_snapshot(node(*gpus(2)), now=0)
    h = t.observe_xid("GPU-00000000", 79, at=10)
    dev = one(h)
    assert dev.state is U and dev.action is Action.REBOOT_NODE and dev.since == 10
    assert [r.code for r in dev.reasons] == ["xid_79"]
    assert "fallen off the bus" in dev.reasons[0].message
    assert one(h, "GPU-00000001").state is H
    assert t.next_expiry() == 310
    assert one(t.expire(309.9)).state is U
    h = t.expire(310)
    assert one(h).state is H and one(h).since == 310 and one(h).reasons == ()


def test_repeated_xid_extends_the_episode_and_counts() -> None:
    t = tracker(quiet=300)
    t.observe_snapshot(node(gpu(0)), now=0)
    t.observe_xid("GPU-00000000", 48, at=0)
    h = t.observe_xid("GPU-00000000", 48, at=200)
    reason = one(h).reasons[0]
    assert (reason.count, reason.since, reason.last_seen) == (2, 0, 200)
    assert one(t.expire(400)).state is U
    assert one(t.expire(500)).state is H


def test_worst_reason_wins_state_and_action() -> None:
    t = tracker()
    t.observe_snapshot(node(gpu(0)), now=0)
    h = t.observe_xid("GPU-00000000", 13, at=1)
    assert (one(h).state, one(h).action) == (D, Action.RESTART_APP)
    h = t.observe_xid("GPU-00000000", 95, at=2)
    assert (one(h).state, one(h).action) == (U, Action.RESET_GPU)
    assert [r.code for r in one(h).reasons] == ["xid_95", "xid_13"]  # worst first


def test_ignored_xid_changes_nothing() -> None:
    t = tracker()
    before = t.observe_snapshot(node(gpu(0)), now=0)
    after = t.observe_xid("GPU-00000000", 45, at=1)
    assert after == before


def test_unknown_xid_uses_the_configurable_default() -> None:
    t = tracker()
    t.observe_snapshot(node(gpu(0)), now=0)
    dev = one(t.observe_xid("GPU-00000000", 250, at=1))
    assert (dev.state, dev.action) == (D, Action.NONE)
    assert "not in the table" in dev.reasons[0].message


def test_lost_gpu_is_unhealthy_until_it_answers_again() -> None:
    t = tracker()
    t.observe_snapshot(node(gpu(0)), now=0)
    h = t.observe_snapshot(node(gpu(0, state=DeviceState.LOST)), now=5)
    assert (one(h).state, one(h).action) == (U, Action.REBOOT_NODE)
    assert one(h).reasons[0].code == "gpu_lost"
    h = t.observe_snapshot(node(gpu(0, state=DeviceState.LOST)), now=6)
    assert one(h).since == 5  # same episode
    h = t.observe_snapshot(node(gpu(0)), now=7)
    assert one(h).state is H


def test_reset_required_and_nvml_error() -> None:
    t = tracker()
    h = t.observe_snapshot(
        node(
            gpu(0, state=DeviceState.RESET_REQUIRED),
            gpu(1, state=DeviceState.ERROR, errors=(("nvmlDeviceGetUUID", "Unknown Error"),)),
        ),
        now=0,
    )
    assert (one(h).state, one(h).action) == (U, Action.RESET_GPU)
    other = one(h, "GPU-00000001")
    assert other.state is D and "nvmlDeviceGetUUID: Unknown Error" in other.reasons[0].message


def test_pending_remap_clears_after_reset() -> None:
    t = tracker()
    h = t.observe_snapshot(node(gpu(0, remap_pending=True)), now=0)
    assert (one(h).state, one(h).action) == (D, Action.RESET_GPU)
    h = t.observe_snapshot(node(gpu(0, remap_pending=False)), now=1)
    assert one(h).state is H


def test_remap_failure_and_retired_pages_pending() -> None:
    t = tracker()
    h = t.observe_snapshot(
        node(gpu(0, remap_failure=True), gpu(1, retired_pages_pending=True)), now=0
    )
    assert one(h).state is U and one(h).reasons[0].code == "row_remap_failure"
    assert one(h, "GPU-00000001").state is D


def test_uncorrectable_ecc_increase_is_an_edge_with_a_baseline() -> None:
    t = tracker(quiet=60)
    h = t.observe_snapshot(node(gpu(0, ecc_uncorrected_volatile=7)), now=0)
    assert one(h).state is H  # an old count at start-up is not an increase
    h = t.observe_snapshot(node(gpu(0, ecc_uncorrected_volatile=9)), now=1)
    assert (one(h).state, one(h).action) == (U, Action.RESET_GPU)
    assert "+2, now 9" in one(h).reasons[0].message
    assert one(t.observe_snapshot(node(gpu(0, ecc_uncorrected_volatile=9)), now=30)).state is U
    assert (
        one(t.observe_snapshot(node(gpu(0, ecc_uncorrected_volatile=0)), now=61)).state is H
    )  # reset


def test_nvlink_error_increase_is_degraded() -> None:
    t = tracker(quiet=60)
    links = (NvLinkCounters(0, replay_errors=1, crc_flit_errors=0),)
    t.observe_snapshot(node(gpu(0, nvlinks=links)), now=0)
    more = (NvLinkCounters(0, replay_errors=1, crc_flit_errors=4),)
    h = t.observe_snapshot(node(gpu(0, nvlinks=more)), now=1)
    assert (one(h).state, one(h).reasons[0].code) == (D, "nvlink_errors")
    assert one(t.expire(61)).state is H


@pytest.mark.parametrize(
    ("bits", "expected"),
    [
        (0x1, []),
        (0x4, []),
        (0x8, ["hw_slowdown"]),
        (0x40, ["hw_thermal_slowdown"]),
        (0x20, ["sw_thermal_slowdown"]),
        (0x80 | 0x1, ["hw_power_brake_slowdown"]),
    ],
)
def test_clock_event_reasons(bits: int, expected: list[str]) -> None:
    h = tracker().observe_snapshot(node(gpu(0, clock_event_reasons=bits)), now=0)
    assert [r.code for r in one(h).reasons] == expected
    assert one(h).state is (D if expected else H)


def test_missing_device_and_unreadable_nvml() -> None:
    t = tracker()
    t.observe_snapshot(node(*gpus(2)), now=0)
    h = t.observe_snapshot(node(gpu(0)), now=1)
    assert (one(h, "GPU-00000001").state, one(h, "GPU-00000001").reasons[0].code) == (
        U,
        "device_missing",
    )
    h = t.observe_snapshot(node(ok=False), now=2)
    assert {r.reasons[0].code for r in h.devices} == {"nvml_unavailable"}
    h = t.observe_snapshot(node(*gpus(2)), now=3)
    assert all(d.state is H for d in h.devices)


SICK = {"recovery_action": 1, "remap_pending": True, "remap_failure": True}
SICK_CODES = {
    "recovery_reset",
    "row_remap_pending",
    "row_remap_failure",
    "hw_thermal_slowdown",
    "retired_pages_pending",  # read once, then left out of the next snapshot: still known
}


@pytest.mark.parametrize(
    "unknown",
    [
        pytest.param(gpu(0), id="values-not-read"),
        pytest.param(gpu(0, state=DeviceState.ERROR), id="reader-did-not-answer"),
        pytest.param(gpu(0, state=DeviceState.LOST), id="gpu-lost"),
    ],
)
def test_an_unknown_value_keeps_the_reasons_it_gave_last(unknown: DeviceSnapshot) -> None:
    t = tracker()
    t.observe_snapshot(
        node(gpu(0, **SICK, retired_pages_pending=True, clock_event_reasons=0x40)), 0
    )
    before = t.observe_snapshot(node(gpu(0, **SICK, clock_event_reasons=0x40)), now=1)
    h = t.observe_snapshot(node(unknown, gpu(1)), now=2)
    assert {r.code for r in one(h).reasons} >= SICK_CODES
    assert one(h).state is U and one(h).since == one(before).since == 0
    kept = {r.code: r for r in one(h).reasons}["recovery_reset"]
    assert (kept.since, kept.last_seen) == (0, 1)  # as last read, not seen again
    # a reading that says "nothing wrong" is what clears them
    well = {k: False for k in ("remap_pending", "remap_failure", "retired_pages_pending")}
    h = t.observe_snapshot(node(gpu(0, recovery_action=0, clock_event_reasons=0, **well)), now=3)
    assert one(h).state is H


def test_a_missing_gpu_keeps_what_its_values_said_last() -> None:
    t = tracker()
    t.observe_snapshot(node(gpu(0, recovery_action=2), gpu(1)), now=0)
    h = t.observe_snapshot(node(gpu(1)), now=1)
    assert {r.code for r in one(h).reasons} == {"device_missing", "recovery_reboot"}
    h = t.observe_snapshot(node(ok=False), now=2)
    assert {r.code for r in one(h).reasons} == {"nvml_unavailable", "recovery_reboot"}


def mig_node(**parent_values: object) -> NodeSnapshot:
    return node(gpu(0, mig_mode_enabled=True, **parent_values), mig(0, 1), mig(0, 2), gpu(1))


def test_contained_mig_xid_stays_on_its_instance() -> None:
    t = tracker()
    t.observe_snapshot(mig_node(), now=0)
    h = t.observe_xid("GPU-00000000", 94, at=1, gpu_instance_id=2, compute_instance_id=0)
    states = {d.uuid: d.state for d in h.devices}
    assert states == {"GPU-00000000": H, "MIG-00-01-00": H, "MIG-00-02-00": D, "GPU-00000001": H}


def test_mig_xid_needing_a_reset_takes_the_whole_gpu() -> None:
    t = tracker()
    t.observe_snapshot(mig_node(), now=0)
    h = t.observe_xid("GPU-00000000", 95, at=1, gpu_instance_id=2, compute_instance_id=0)
    states = {d.uuid: d.state for d in h.devices}
    assert states == {"GPU-00000000": U, "MIG-00-01-00": U, "MIG-00-02-00": U, "GPU-00000001": H}
    assert one(h, "MIG-00-01-00").reasons[0].inherited


def test_gpu_level_xid_and_lost_parent_reach_every_instance() -> None:
    t = tracker()
    t.observe_snapshot(mig_node(), now=0)
    h = t.observe_xid(
        "GPU-00000000", 13, at=1, gpu_instance_id=0xFFFFFFFF, compute_instance_id=0xFFFFFFFF
    )
    assert {d.uuid for d in h.devices if d.state is D} == {
        "GPU-00000000",
        "MIG-00-01-00",
        "MIG-00-02-00",
    }
    h = t.observe_snapshot(mig_node(state=DeviceState.LOST), now=2)
    assert {d.uuid for d in h.devices if d.state is U} == {
        "GPU-00000000",
        "MIG-00-01-00",
        "MIG-00-02-00",
    }


def test_devices_are_ordered_parent_then_instances() -> None:
    h = tracker().observe_snapshot(
        node(gpu(1), mig(0, 2), gpu(0, mig_mode_enabled=True), mig(0, 1)), now=0
    )
    assert [d.uuid for d in h.devices] == [
        "GPU-00000000",
        "MIG-00-01-00",
        "MIG-00-02-00",
        "GPU-00000001",
    ]


def test_xid_before_any_snapshot_is_kept() -> None:
    t = tracker()
    h = t.observe_xid("GPU-00000005", 79, at=1)
    assert one(h, "GPU-00000005").state is U
    h = t.observe_snapshot(node(gpu(5)), now=2)
    assert one(h, "GPU-00000005").state is U and one(h, "GPU-00000005").index == 5


events = st.lists(
    st.tuples(
        st.floats(0, 1000), st.sampled_from([13, 31, 45, 48, 79, 94, 95, 250]), st.integers(0, 2)
    ),
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(events)
def test_state_is_the_worst_reason_and_everything_heals(evs: list[tuple[float, int, int]]) -> None:
    t = tracker(quiet=50)
    t.observe_snapshot(node(*gpus(3)), now=0)
    for at, xid, index in sorted(evs):
        h = t.observe_xid(f"GPU-{index:08d}", xid, at=at)
        for dev in h.devices:
            assert dev.state == max((r.state for r in dev.reasons), default=H)
            assert dev.action == max((r.action for r in dev.reasons), default=Action.NONE)
    final = t.expire(2000)
    assert all(d.state is H and not d.reasons for d in final.devices)


def test_mig_reconfiguration_forgets_old_instances_but_a_lost_gpu_keeps_them() -> None:
    t = tracker()
    t.observe_snapshot(mig_node(), now=0)
    # GPU 0 now has one bigger instance instead of two small ones.
    h = t.observe_snapshot(
        node(gpu(0, mig_mode_enabled=True), mig(0, 5, profile="3g.40gb"), gpu(1)), now=1
    )
    assert [d.uuid for d in h.devices] == ["GPU-00000000", "MIG-00-05-00", "GPU-00000001"]
    assert all(d.state is H for d in h.devices)
    # A lost GPU cannot list its instances: they stay, unhealthy, until it answers again.
    h = t.observe_snapshot(
        node(gpu(0, mig_mode_enabled=True, state=DeviceState.LOST), gpu(1)), now=2
    )
    inst = one(h, "MIG-00-05-00")
    assert inst.state is U and {r.code for r in inst.reasons} == {"device_missing", "gpu_lost"}


def test_mig_xid_without_compute_instance_reaches_every_instance_of_the_gpu_instance() -> None:
    t = tracker()
    t.observe_snapshot(
        node(gpu(0, mig_mode_enabled=True), mig(0, 1, 0), mig(0, 1, 1), mig(0, 2, 0)), now=0
    )
    h = t.observe_xid("GPU-00000000", 13, at=1, gpu_instance_id=1, compute_instance_id=0xFFFFFFFF)
    assert {d.uuid for d in h.devices if d.state is D} == {"MIG-00-01-00", "MIG-00-01-01"}
    h = t.observe_xid("GPU-00000000", 31, at=2, gpu_instance_id=2, compute_instance_id=0)
    assert one(h, "MIG-00-02-00").reasons[0].code == "xid_31"
    h = t.observe_xid("GPU-00000000", 31, at=3, gpu_instance_id=9, compute_instance_id=0)
    assert one(h).reasons[0].code == "xid_31"  # an instance we do not know: the GPU itself
