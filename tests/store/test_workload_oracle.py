"""The Accountant against the workload generator's own record of GPU binding (sim/workload.py),
an oracle written without quota/accounting.py: every interval, raw and physical, must match."""

from __future__ import annotations

import pytest

from gpuquota.quota.accounting.accountant import Accountant
from gpuquota.quota.store.db import Store
from gpuquota.sim.workload import generate
from tests.store import rows


@pytest.mark.parametrize("seed", [3, 11])
def test_replayed_workload_matches_the_generator_truth(
    store: Store, cluster: str, seed: int
) -> None:
    workload = generate(seed, 2.0)
    accountant = Accountant(store, cluster)
    for i, event in enumerate(workload.events, start=1):
        accountant.apply(event.type, event.object, event.at)
        if i % 250 == 0:
            accountant.flush()
    accountant.flush()
    got = {
        key: (
            r["namespace"],
            r["started_at"],
            r["ended_at"],
            r["raw_units"],
            round(r["physical_gpus"], 9),
        )
        for key, r in rows.allocations(store, cluster).items()
    }
    want = {
        (iv.pod_uid, iv.resource): (
            iv.namespace,
            iv.start,
            iv.end,
            iv.units,
            round(float(iv.units * iv.factor), 9),
        )
        for iv in workload.truth.intervals
    }
    assert got == want
    assert len(want) > 20  # the workload is not trivially small
