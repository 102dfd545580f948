"""gpu_history_changes_total (issue 37): the agent's own count of changes to what the fleet
history reads, per GPU. The pure rule (exporter/expose/history.py) and the renderer's count,
on hand-made snapshots."""

from __future__ import annotations

import random
from dataclasses import replace

from gpuquota.exporter.expose import history, metrics
from gpuquota.exporter.expose.render import Renderer, RenderOptions
from gpuquota.exporter.health.verdict import Action, DeviceHealth, NodeHealth, Reason, State
from gpuquota.exporter.snapshot import DeviceState, PodRef
from gpuquota.quota.fleet import source
from tests.exporter.factories import gpu, mig, node
from tests.exporter.scrape import parse, value

COUNTER = "gpu_history_changes_total"
A = ("gpu", "0"), ("uuid", "GPU-a")
B = ("gpu", "1"), ("uuid", "GPU-b")
XA = (*A, ("xid", "79"))


def test_a_fingerprint_is_a_gpus_rendered_history_series_in_any_order() -> None:
    one = history.fingerprints(
        [
            ("gpu_info", A, "1"),
            ("gpu_info", B, "1"),
            ("gpu_xid_errors_total", XA, "2"),
        ]
    )
    other = history.fingerprints(
        [
            ("gpu_xid_errors_total", XA, "2"),
            ("gpu_info", B, "1"),
            ("gpu_info", A, "1"),
        ]
    )
    assert one == other
    assert set(one) == {"GPU-a", "GPU-b"}
    assert len(one["GPU-a"]) == 2


def test_the_count_grows_on_a_change_of_value_or_presence_and_only_then() -> None:
    counter = history.ChangeCounter()
    base = [("gpu_info", A, "1"), ("gpu_info", B, "1")]
    assert counter.update(history.fingerprints(base)) == {"GPU-a": 0, "GPU-b": 0}
    assert counter.update(history.fingerprints(base)) == {"GPU-a": 0, "GPU-b": 0}
    xid = ("gpu_xid_errors_total", XA, "1")
    assert counter.update(history.fingerprints([*base, xid])) == {"GPU-a": 1, "GPU-b": 0}
    more = ("gpu_xid_errors_total", XA, "2")
    assert counter.update(history.fingerprints([*base, more])) == {"GPU-a": 2, "GPU-b": 0}
    assert counter.update(history.fingerprints(base)) == {"GPU-a": 3, "GPU-b": 0}  # it went
    # a GPU missing from a rendering, back as it was: its counter series was missing meanwhile
    assert counter.update(history.fingerprints(base[:1])) == {"GPU-a": 3}
    assert counter.update(history.fingerprints(base)) == {"GPU-a": 3, "GPU-b": 0}
    # NaN is written the same each time: no change
    nan = ("gpu_health_since_timestamp_seconds", B, "NaN")
    assert counter.update(history.fingerprints([*base, nan]))["GPU-b"] == 1
    assert counter.update(history.fingerprints([*base, nan]))["GPU-b"] == 1


def test_the_history_rows_are_what_the_fleet_history_reads() -> None:
    assert set(metrics.HISTORY) == set(source.GPU_METRICS)
    assert {source.INFO, source.STATE, source.REASON, source.SINCE, source.DEVICE_STATE,
            source.XID, *source.COUNTERS} == set(metrics.HISTORY)  # fmt: skip


def _verdict(uuid: str, state: State, generation: int, since: float = 1.0) -> NodeHealth:
    action = Action.NONE if state is State.HEALTHY else Action.REBOOT_NODE
    reasons = () if state is State.HEALTHY else (Reason("xid_79", state, action, "", 1, 1),)
    return NodeHealth((DeviceHealth(uuid, 0, state, action, since, reasons),), generation, 1.0)


def _counts(body: bytes) -> dict[str, float]:
    return {labels["uuid"]: v for labels, v in parse(body).get(COUNTER, [])}


def test_the_renderer_counts_each_gpus_history_changes() -> None:
    renderer = Renderer(RenderOptions(node="node-a"))
    g0, g1 = gpu(0), gpu(1)
    first = node(g0, g1)
    samples = parse(renderer.exposition(first))
    assert value(samples, COUNTER, uuid=g0.uuid, gpu="0", node="node-a") == 0
    assert _counts(renderer.exposition(first)) == {g0.uuid: 0, g1.uuid: 0}

    def then(snapshot, *devices, verdict=None, **changes):  # type: ignore[no-untyped-def]
        later = replace(
            snapshot, collected_at=snapshot.collected_at + 1, devices=devices, **changes
        )
        return later, _counts(renderer.exposition(later, verdict))

    # not read by the history: no change
    s, counts = then(first, replace(g0, power_watts=1.0), g1)
    assert counts == {g0.uuid: 0, g1.uuid: 0}
    # a memory counter of GPU 0
    s, counts = then(s, replace(g0, ecc_uncorrected_aggregate=2), g1)
    assert counts == {g0.uuid: 1, g1.uuid: 0}
    # an XID on GPU 1 (a new series)
    s, counts = then(s, *s.devices, xid_counts={g1.uuid: {79: 1}})
    assert counts == {g0.uuid: 1, g1.uuid: 1}
    # its identity (gpu_info's labels)
    s, counts = then(s, s.devices[0], replace(g1, vbios_version="96.00.99.00.01"))
    assert counts == {g0.uuid: 1, g1.uuid: 2}
    # lost: its gpu_device_state
    s, counts = then(s, replace(s.devices[0], state=DeviceState.LOST), s.devices[1])
    assert counts == {g0.uuid: 2, g1.uuid: 2}
    # the verdict beside the snapshot: appears, then changes
    s, counts = then(s, *s.devices, verdict=_verdict(g1.uuid, State.HEALTHY, 1))
    assert counts == {g0.uuid: 2, g1.uuid: 3}
    s, counts = then(s, *s.devices, verdict=_verdict(g1.uuid, State.UNHEALTHY, 2, since=5.0))
    assert counts == {g0.uuid: 2, g1.uuid: 4}
    # a pod taking a GPU changes no history series without --pod-labels
    s, counts = then(
        s, *s.devices, verdict=_verdict(g1.uuid, State.UNHEALTHY, 2, since=5.0),
        pods={g0.uuid: (PodRef("ml", "a", "main"),)},
    )  # fmt: skip
    assert counts == {g0.uuid: 2, g1.uuid: 4}


def test_mig_instances_have_no_counter_of_their_own() -> None:
    parent = gpu(0, mig_mode_enabled=True)
    counts = _counts(Renderer().render(node(parent, mig(parent, 0, 7))))
    assert counts == {parent.uuid: 0}


def test_any_two_renderings_whose_history_series_differ_differ_in_the_count() -> None:
    """The rule the fleet history rests on, over random sequences of snapshots and verdicts
    (as scraped: each rendering parsed back)."""
    rng = random.Random(37)
    renderer = Renderer(RenderOptions(pod_labels=True))
    g0 = gpu(0)
    seen: list[tuple[frozenset[tuple[str, tuple[tuple[str, str], ...], float]], float]] = []
    snapshot = node(g0)
    for step in range(60):
        device = replace(
            g0,
            ecc_corrected_aggregate=rng.choice([7, 8]),
            remap_pending=rng.choice([False, True, None]),
            power_watts=float(step),
            state=rng.choice([DeviceState.OK, DeviceState.OK, DeviceState.LOST]),
        )
        pods = {g0.uuid: (PodRef("ml", rng.choice("ab"), "main"),)} if rng.random() < 0.5 else {}
        xids = {g0.uuid: {79: rng.choice([1, 2])}} if rng.random() < 0.5 else {}
        snapshot = replace(
            snapshot, collected_at=snapshot.collected_at + 1, devices=(device,),
            pods=pods, xid_counts=xids,
        )  # fmt: skip
        state = rng.choice([State.HEALTHY, State.UNHEALTHY, None])
        verdict = None if state is None else _verdict(g0.uuid, state, step)
        samples = parse(renderer.exposition(snapshot, verdict))
        said = frozenset(
            (name, tuple(sorted(labels.items())), v)
            for name in metrics.HISTORY
            for labels, v in samples.get(name, [])
        )
        seen.append((said, value(samples, COUNTER, uuid=g0.uuid)))
    counts = [count for _, count in seen]
    assert counts == sorted(counts) and counts[-1] > 10
    for i, (said, count) in enumerate(seen):
        for other, other_count in seen[i + 1 :]:
            if other != said:
                assert other_count != count
