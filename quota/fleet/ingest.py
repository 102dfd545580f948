"""The fleet history's ingestion: each closed window's agent readings from Prometheus into the
store. It runs in the usage ledger's process, after the ledger's own windows of each turn, with
the ledger's windows, delay, look-back and back-fill (``--ledger-*``): a controller that was
down catches up on both the same way, up to ``--ledger-backfill``, and a failure of either is
retried by the same loop. Its progress is its own (``gpu_history_progress``): a window of the
ledger is never held back by the history or the other way round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpuquota.quota.fleet import rules, source
from gpuquota.quota.fleet.write import FleetStore
from gpuquota.quota.ledger import rules as ledger_rules
from gpuquota.quota.ledger.ingest import LedgerSettings
from gpuquota.quota.store.db import Store

log = logging.getLogger(__name__)


def ingest_window(fleet: FleetStore, settings: LedgerSettings, start: int) -> int:
    """Fetch and store the history of one window; returns the rows written."""
    s = settings
    readings, xids = source.fetch(s.prometheus_url, start, s.window, s.max_gap, s.timeout)
    priors = fleet.priors(sorted({r.serial for r in readings}), start)
    history = rules.window_history(readings, xids, priors, start, start + s.window, s.max_gap)
    return fleet.replace_window(start, s.window, history)


def turn(
    store: Store, cluster: str, settings: LedgerSettings, now: float, stopped: Callable[[], bool]
) -> int:
    """The ledger process' turn of the fleet history (ledger/ingest.py ``Turn``)."""
    return run_once(FleetStore(store, cluster), settings, now, stopped)


def run_once(
    fleet: FleetStore,
    settings: LedgerSettings,
    now: float,
    stopped: Callable[[], bool] = lambda: False,
) -> int:
    """Ingest every history window that is due; returns how many. Raises PrometheusError or
    StoreError; windows ingested before the failure stay ingested."""
    s = settings
    progress = fleet.progress()
    until = progress.ingested_until if progress else None
    due = ledger_rules.plan(
        until, now, window=s.window, delay=s.delay, lookback=s.lookback, backfill=s.backfill
    )
    if until is not None and due and due[0] > until:
        log.warning(
            "fleet history: windows from %d to %d are beyond --ledger-backfill and are skipped",
            until,
            due[0],
        )
    done = 0
    for start in due:
        if stopped():
            break
        ingest_window(fleet, s, start)
        done += 1
    return done
