"""Usage counters per holder and device: used physical GPU-seconds and joules (issue 19).

The node agent's half of the usage ledger (../shared/accounting.md, "Used, not only
allocated"). :func:`advance` is the one pure rule: the previous :class:`LedgerState` plus one
snapshot (and the UIDs known for its holders) give the next state; the time step is the
snapshot's ``collected_at`` minus the previous one's. :class:`LedgerEnricher` carries the state
from one collection to the next and publishes the totals in ``NodeSnapshot.usage_totals``.

Holders. A device's holders are the DRA claims on it (one holder per claim, however many pods
share it) and the pods holding it other than through a claim (device plugin), from
``NodeSnapshot.claims`` and ``NodeSnapshot.pods``.

Activity (physical GPU-seconds per second), from the readings the collector already makes:

* a whole GPU with one holder: GPM SM activity (``sm_active``), else NVML's utilisation
  ratio (``utilization``);
* a GPU with several holders (time-slicing, MPS): each holder's processes' SM utilisation
  (``process_sm``, ``NodeSnapshot.pod_usage`` from exporter/enrich/usage.py). Its used
  seconds are the SM-seconds of the new samples, over the time NVML says they cover (not
  this round's step: the driver is asked once a second, whatever the collection interval, and
  an answer that comes late covers the time since the ask before); the last sample the gauges
  hold for a few seconds adds nothing (a process with no sample in a second used nothing in
  it, docs/real-h100.md). The energy split weighs the latest ratios, capped at 1;
* a MIG instance: its own GPM SM activity x the profile's physical share, ``sm_active``
  (N/7, as the accounting's ``mig_share`` without overrides: the node agent imports nothing
  from gpuquota.quota, so tests/common/test_mig_share.py holds the two equal); several
  holders of one instance share it equally (NVML has no per-process utilisation on MIG).

One used counter per holder and device, however it was measured: a GPU's first rounds, before
its first GPM pair, measure utilisation, and the ``activity`` label names the latest round's
way; the ledger reads the series as one counter across that label change.

Energy. Each round's moment weighs ``power x dt`` (``dt`` where power is not read) and is split
among the GPU's holders: by activity shares on a shared GPU, equally when nobody is active;
on a MIG-enabled GPU by the instances' physical shares (an instance's share equally among its
holders); the rest (unheld GPU, unheld instances, unpartitioned slices) to the GPU's
unallocated energy. When the GPU's energy counter moves (the slow tier reads it), its increase
is distributed in proportion to the weights gathered since the previous reading, so the
holders' joules sum to the counter's increase exactly.

Never guessed: the first collection (no previous time, no previous energy reading), a failed
collection, a lost device, a step longer than ``max_gap_s`` and an energy counter that went
backwards add nothing and start a new baseline. Totals never decrease.

Unmeasured is not idle. A round that holds a device but cannot measure a holder's activity
(no per-process answer, or a baseline one: the first after the agent started or the GPU came
back, whose samples cover unknown time) adds nothing and leaves its used counter out of the
scrape (energy stays), so the ledger sees no samples there and the bill shows the coverage it
lost instead of idle time.

UIDs. A holder's totals are kept from the first round it is seen; its series are published
only once its UID is known (the pod directory, the DRA claim reader), the usage seen before
then included in the first value. A holder that is gone keeps its series for ``retain_s``
(its last value stays scrapeable), then is forgotten; a name whose UID changes (a pod
recreated under the same name) starts again from 0.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Protocol

from gpuquota.exporter.snapshot import (
    DeviceSnapshot,
    DeviceState,
    HolderTotals,
    NodeSnapshot,
    PodUsage,
)

MIG_SLICES = 7  # compute slices of a MIG-capable GPU (A100, H100, H200, B200)
_MIG_PROFILE = re.compile(r"^(\d+)g\.\d+gb(?:\+.*)?$")  # 1g.10gb, 3g.40gb, 1g.10gb+me
KIND_POD = "pod"
KIND_CLAIM = "claim"
SM_ACTIVE = "sm_active"  # GPM SM activity (whole GPU with one holder, MIG instance)
UTILIZATION = "utilization"  # NVML utilisation ratio (no GPM)
PROCESS_SM = "process_sm"  # per-process SM utilisation (several holders on one GPU)
ACTIVITIES = (SM_ACTIVE, UTILIZATION, PROCESS_SM)

HolderKey = tuple[str, str, str]  # (kind, namespace, name)
# (device UUID, kind, namespace, name): one holder on one device
SeriesKey = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class Holding:
    """One holder of one device in one snapshot."""

    key: HolderKey  # (kind, namespace, name)
    pods: frozenset[tuple[str, str]]  # (namespace, pod) of the pods behind it

    @property
    def kind(self) -> str:
        return self.key[0]

    @property
    def namespace(self) -> str:
        return self.key[1]

    @property
    def name(self) -> str:
        return self.key[2]


@dataclass(frozen=True, slots=True)
class Totals:
    used: float  # physical GPU-seconds, however measured
    activity: str  # how the latest measured round measured it ("" before any)
    # whether the holder's latest round (while it held the device) measured its activity: a
    # round that could not (no GPM, utilisation or per-process reading) unpublishes the used
    # counter, so the ledger sees a gap, not a stretch of zero use with full coverage
    measured: bool
    energy: float
    uid: str  # "" until known
    last_seen: float


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    max_gap_s: float = 60.0  # a longer step between two collections adds nothing
    retain_s: float = 600.0  # a holder not seen this long is forgotten


@dataclass(frozen=True, slots=True)
class LedgerState:
    """Everything :func:`advance` carries from one collection to the next."""

    at: float | None = None  # collected_at of the previous usable collection
    totals: Mapping[SeriesKey, Totals] = field(default_factory=dict)
    uids: Mapping[HolderKey, str] = field(default_factory=dict)  # learned, kept while seen
    energy_at: Mapping[str, float] = field(default_factory=dict)  # GPU -> last counter (J)
    # GPU -> series key (None: unallocated) -> weight gathered since the last counter reading
    pending: Mapping[str, Mapping[SeriesKey | None, float]] = field(default_factory=dict)
    unallocated: Mapping[str, float] = field(default_factory=dict)  # GPU -> joules


def holdings(snapshot: NodeSnapshot) -> dict[str, tuple[Holding, ...]]:
    """Device UUID -> its holders: each DRA claim once, and the pods holding it other than
    through a claim."""
    out: dict[str, tuple[Holding, ...]] = {}
    for uuid in snapshot.pods.keys() | snapshot.claims.keys():
        claims: dict[tuple[str, str], set[tuple[str, str]]] = {}
        for c in snapshot.claims.get(uuid, ()):
            claims.setdefault((c.claim_namespace, c.claim), set()).add((c.namespace, c.pod))
        through_claims = set().union(*claims.values()) if claims else set()
        pods = sorted({(r.namespace, r.pod) for r in snapshot.pods.get(uuid, ())} - through_claims)
        found = [Holding((KIND_CLAIM, ns, name), frozenset(p)) for (ns, name), p in claims.items()]
        found += [Holding((KIND_POD, ns, pod), frozenset({(ns, pod)})) for ns, pod in pods]
        out[uuid] = tuple(sorted(found, key=lambda h: h.key))
    return out


def physical_share(device: DeviceSnapshot) -> float | None:
    """The physical GPUs one device is: 1, or a MIG instance's N/7 (None: unknown profile)."""
    return 1.0 if device.mig is None else _profile_share(device.mig.profile)


@functools.lru_cache(maxsize=64)
def _profile_share(profile: str) -> float | None:
    match = _MIG_PROFILE.match(profile)
    return None if match is None else min(1.0, int(match.group(1)) / MIG_SLICES)


class Activity(NamedTuple):
    """One holder's activity on one device this round."""

    how: str  # SM_ACTIVE, UTILIZATION or PROCESS_SM
    ratio: float  # physical GPUs of activity now (0-1): the energy split's weight
    # physical GPU-seconds measured for the time they cover (process samples); None: ratio x
    # the round's step
    seconds: float | None = None
    # False: the ratio is known (it weighs the energy split) but no time is measured (a
    # baseline per-process answer): the used counter is left out, as unmeasured
    measured: bool = True


def activities(
    device: DeviceSnapshot, holders: tuple[Holding, ...], pod_usage: tuple[PodUsage, ...]
) -> dict[HolderKey, Activity]:
    """Holder -> its :class:`Activity` on ``device`` this round; a holder without a usable
    reading is left out."""
    if not holders:
        return {}
    if device.mig is not None:
        share = physical_share(device)
        sm = device.gpm.sm_active if device.gpm is not None else None
        if sm is None or share is None:
            return {}
        each = min(max(sm, 0.0), 1.0) * share / len(holders)
        return {h.key: Activity(SM_ACTIVE, each) for h in holders}
    if device.mig_mode_enabled:
        return {}  # a MIG-enabled GPU's work is its instances'
    if len(holders) == 1:
        sm = device.gpm.sm_active if device.gpm is not None else None
        if sm is not None:
            return {holders[0].key: Activity(SM_ACTIVE, min(max(sm, 0.0), 1.0))}
        if device.gpu_utilization_ratio is not None:
            ratio = min(max(device.gpu_utilization_ratio, 0.0), 1.0)
            return {holders[0].key: Activity(UTILIZATION, ratio)}
        return {}
    if device.process_utilization is None:
        return {}
    # a baseline answer (the first after a loss) covers unknown time: its ratios still weigh
    # the energy split, but it measures no use (a measured zero would read as idle time)
    baseline = any(u.baseline for u in device.process_utilization)
    out = {}
    for h in holders:
        mine = [u for u in pod_usage if u.owner == KIND_POD and (u.namespace, u.pod) in h.pods]
        ratio = sum(u.sm_ratio or 0.0 for u in mine)
        seconds = sum(u.sm_seconds_sampled or 0.0 for u in mine)
        out[h.key] = Activity(
            PROCESS_SM, min(max(ratio, 0.0), 1.0), max(seconds, 0.0), measured=not baseline
        )
    return out


def _split_gpu(
    gpu: DeviceSnapshot,
    held: Mapping[str, tuple[Holding, ...]],
    active: Mapping[str, Mapping[HolderKey, Activity]],
    instances: list[DeviceSnapshot],
) -> dict[SeriesKey | None, float]:
    """Fractions of this round's energy of one physical GPU per series (None: unallocated)."""
    out: dict[SeriesKey | None, float] = {}
    if gpu.mig_mode_enabled:
        left = 1.0
        for inst in instances:
            share = physical_share(inst) or 0.0
            holders = held.get(inst.uuid, ())
            for h in holders:
                out[(inst.uuid, *h.key)] = share / len(holders)
            if holders:
                left -= share
        if left > 1e-12:
            out[None] = left
        return out
    holders = held.get(gpu.uuid, ())
    if not holders:
        return {None: 1.0}
    acts = active.get(gpu.uuid, {})
    total = sum(a.ratio for a in acts.values())
    for h in holders:
        if len(holders) > 1 and total > 0:
            found = acts.get(h.key)
            out[(gpu.uuid, *h.key)] = (found.ratio if found is not None else 0.0) / total
        else:
            out[(gpu.uuid, *h.key)] = 1.0 / len(holders)
    return out


def advance(
    state: LedgerState,
    snapshot: NodeSnapshot,
    uids: Mapping[HolderKey, str | None],
    config: LedgerConfig = LedgerConfig(),
    held: Mapping[str, tuple[Holding, ...]] | None = None,
) -> LedgerState:
    """The next state after ``snapshot``; ``uids``: the UIDs known now for its holders;
    ``held``: :func:`holdings` of ``snapshot`` where the caller has it already."""
    now = snapshot.collected_at
    if not snapshot.ok:  # NVML could not be read: nothing added, every baseline starts again
        return replace(state, at=None, energy_at={}, pending={})
    dt: float | None = None
    if state.at is not None and 0 < now - state.at <= config.max_gap_s:
        dt = now - state.at
    if held is None:
        held = holdings(snapshot)
    learned = dict(state.uids)
    for holder, uid in uids.items():
        if uid:
            learned[holder] = uid
    totals: dict[SeriesKey, Totals] = dict(state.totals)
    ok = {d.uuid: d for d in snapshot.devices if d.state is DeviceState.OK}
    active: dict[str, dict[HolderKey, Activity]] = {}
    for uuid, holders in held.items():
        device = ok.get(uuid)
        if device is None:
            continue
        active[uuid] = acts = activities(device, holders, snapshot.pod_usage.get(uuid, ()))
        for h in holders:
            key = (uuid, *h.key)
            old, uid = totals.get(key), learned.get(h.key, "")
            if old is not None and old.uid and uid != old.uid:
                old = None  # the name now stands for another pod or claim: a new holder
            used = old.used if old is not None else 0.0
            activity = old.activity if old is not None else ""
            measured = h.key in acts and acts[h.key].measured and dt is not None
            if measured and dt is not None:
                # one counter whichever way it was measured (a GPU's first rounds, before its
                # first GPM pair, measure utilisation): the ledger sees no reset when it switches
                found = acts[h.key]
                activity = found.how
                used += found.ratio * dt if found.seconds is None else found.seconds
            totals[key] = Totals(
                used=used,
                activity=activity,
                measured=measured,
                energy=old.energy if old is not None else 0.0,
                uid=uid,
                last_seen=now,
            )
    energy_at = dict(state.energy_at)
    pending = {gpu: dict(w) for gpu, w in state.pending.items()}
    unallocated = dict(state.unallocated)
    instances: dict[str, list[DeviceSnapshot]] = {}
    for d in ok.values():
        if d.mig is not None:
            instances.setdefault(d.mig.parent_uuid, []).append(d)
    for gpu_uuid in list(energy_at):
        if gpu_uuid not in ok:  # lost or unreadable: start again when it is back
            energy_at.pop(gpu_uuid)
            pending.pop(gpu_uuid, None)
    for gpu in ok.values():
        if gpu.mig is not None:
            continue
        unallocated.setdefault(gpu.uuid, 0.0)
        weights = pending.setdefault(gpu.uuid, {})
        if dt is not None:
            moment = (gpu.power_watts if gpu.power_watts is not None else 1.0) * dt
            for share_key, fraction in _split_gpu(
                gpu, held, active, instances.get(gpu.uuid, [])
            ).items():
                weights[share_key] = weights.get(share_key, 0.0) + moment * fraction
        reading, previous = gpu.energy_joules, energy_at.get(gpu.uuid)
        if reading is None or previous is None or reading < previous or dt is None:
            # no counter, a first reading, a counter gone back or a gap: a new baseline
            if reading is None:
                energy_at.pop(gpu.uuid, None)
            else:
                energy_at[gpu.uuid] = reading
            weights.clear()
            continue
        if reading == previous:
            continue  # not read again yet (slow tier): keep gathering
        total = sum(weights.values())
        if total > 0:
            delta = reading - previous
            for series, weight in weights.items():
                joules = delta * weight / total
                if series is None:
                    unallocated[gpu.uuid] += joules
                elif (t := totals.get(series)) is not None:
                    totals[series] = replace(t, energy=t.energy + joules)
        energy_at[gpu.uuid] = reading
        weights.clear()
    # forget holders not seen for a while (their last value was published meanwhile)
    keep = {k: t for k, t in totals.items() if now - t.last_seen <= config.retain_s}
    seen = {k[1:] for k in keep}
    return LedgerState(
        at=now,
        totals=keep,
        uids={k: u for k, u in learned.items() if k in seen},
        energy_at=energy_at,
        pending=pending,
        unallocated={g: j for g, j in unallocated.items() if g in energy_at or g in ok},
    )


def published(state: LedgerState) -> dict[str, tuple[HolderTotals, ...]]:
    """Device UUID -> the totals of its holders whose UID is known (snapshot form)."""
    out: dict[str, list[HolderTotals]] = {}
    for (uuid, kind, namespace, name), t in sorted(state.totals.items()):
        if not t.uid:
            continue
        out.setdefault(uuid, []).append(
            HolderTotals(
                kind=kind,
                namespace=namespace,
                name=name,
                uid=t.uid,
                used_seconds=t.used,
                activity=t.activity if t.measured else "",
                energy_joules=t.energy,
            )
        )
    return {uuid: tuple(found) for uuid, found in out.items()}


class UidSource(Protocol):
    """Where the agent learns holders' UIDs (the pod directory, the DRA claim reader)."""

    def uid_of(self, namespace: str, name: str) -> str | None: ...


class LedgerEnricher:
    """CollectLoop enricher: carries the :class:`LedgerState` across collections and fills
    ``NodeSnapshot.usage_totals`` and ``unallocated_energy``. Run it after pod attribution
    and per-pod usage (it reads both)."""

    def __init__(
        self,
        pods: UidSource | None,
        claims: UidSource | None = None,
        config: LedgerConfig = LedgerConfig(),
    ) -> None:
        self.pods = pods
        self.claims = claims
        self.config = config
        self.state = LedgerState()

    def uids(self, held: Mapping[str, tuple[Holding, ...]]) -> dict[HolderKey, str | None]:
        out: dict[HolderKey, str | None] = {}
        for holders in held.values():
            for h in holders:
                if h.key in out:
                    continue
                source = self.pods if h.kind == KIND_POD else self.claims
                out[h.key] = source.uid_of(h.namespace, h.name) if source is not None else None
        return out

    def __call__(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        held = holdings(snapshot)
        self.state = advance(self.state, snapshot, self.uids(held), self.config, held)
        return replace(
            snapshot,
            usage_totals=published(self.state),
            unallocated_energy={
                g: j for g, j in self.state.unallocated.items() if g in self.state.energy_at
            },
        )
