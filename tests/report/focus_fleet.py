"""The store the FOCUS tests export: two clusters replaying one trace, with namespace labels,
an owner and none, a MIG slice, the usage ledger and capacity; and the rate card they price it
with."""

from __future__ import annotations

from fractions import Fraction

from tests.report.conftest import A100, H100, Store
from tests.report.helpers import T0, H, known, ledger, uid

CARD = f"""\
currency: USD
default_rate: 1.0
models:
  {H100}:
    - rate: 2.0
    - {{rate: 3.5, from: "2026-10-06T12:00:00Z"}}
energy_price_per_kwh: 0.3
"""
PERIOD = ("--from", "2026-10-05", "--to", "2026-10-07")


def fleet(store: Store) -> None:
    """Clusters alpha and beta replaying the same trace: ml (labels team=research,
    cost-center=42) runs an H100 for 30 h from 10:00 on day one (half of it used, per the
    ledger) and a MIG slice for 2 h; web (team=web) 2 A100s for an hour (a pod without owner)
    and an H100 for 3 h; a node of 8 H100s and one of 2 A100s in pool-a of each cluster."""
    for cluster in ("alpha", "beta"):
        known(store, T0 - 10 * H, T0 + 40 * H, cluster=cluster)
        store.labels("ml", {"team": "research", "cost-center": "42"}, T0 - 10 * H, None,
                     cluster=cluster)  # fmt: skip
        store.labels("web", {"team": "web"}, T0 - 10 * H, None, cluster=cluster)
        store.alloc("ml", T0, T0 + 30 * H, cluster=cluster)
        ledger(store, uid(store), [(T0 + i * H, 1800, 3_600_000, H) for i in range(30)],
               cluster=cluster, device=f"GPU-{cluster}")  # fmt: skip
        store.alloc("ml", T0, T0 + 2 * H, physical=Fraction(1, 7),
                    resource="nvidia.com/mig-1g.10gb", cluster=cluster)  # fmt: skip
        store.alloc("web", T0, T0 + H, units=2, model=A100, owner=None, cluster=cluster)
        # beside ml's on the same H100 SKU and pool: the two split that origin charge
        store.alloc("web", T0 + H, T0 + 4 * H, owner=("Deployment", "api"), cluster=cluster)
        store.capacity("node-1", T0 - 10 * H, None, cluster=cluster)
        store.capacity("node-2", T0 - 10 * H, None, units=2, model=A100, cluster=cluster)
