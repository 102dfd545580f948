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

from sqlalchemy.exc import SQLAlchemyError

from gpuquota.quota.fleet import query, rules, source, summary
from gpuquota.quota.fleet.write import FleetStore
from gpuquota.quota.ledger import rules as ledger_rules
from gpuquota.quota.ledger.ingest import LedgerSettings
from gpuquota.quota.store.db import Store

log = logging.getLogger(__name__)


def ingest_window(
    fleet: FleetStore, settings: LedgerSettings, start: int, *, by_changes: bool = True
) -> int:
    """Fetch and store the history of one window; returns the rows written. ``by_changes``:
    samples of the GPUs that changed only (source.fetch); the history is the same."""
    s = settings
    readings, xids = source.fetch(
        s.prometheus_url,
        start,
        s.window,
        s.max_gap,
        s.timeout,
        max_samples=s.max_samples,
        by_changes=by_changes,
        scope=s.scope(fleet.cluster),
    )
    # a quiet board (one reading over the window: source.py) has no event to compare
    priors = fleet.priors(sorted({r.serial for r in readings if r.until is None}), start)
    source.recall(s.prometheus_url, priors, start - s.max_gap, s.timeout, s.scope(fleet.cluster))
    history = rules.window_history(readings, xids, priors, start, start + s.window, s.max_gap)
    return fleet.replace_window(start, s.window, history)


RECENT = 7 * 86400  # the controller's fence and relapse gauges look this far back

Samples = dict[str, list[tuple[tuple[str, ...], float]]]


def turn(
    store: Store, cluster: str, settings: LedgerSettings, now: float, stopped: Callable[[], bool]
) -> Samples:
    """The ledger process' turn of the fleet history (ledger/ingest.py ``Turn``): the due
    windows, then the controller's fence and relapse gauges (controller/metrics.py)."""
    fleet = FleetStore(store, cluster)
    run_once(fleet, settings, now, stopped)
    return recent_fences(fleet, settings.relapse_within)


def recent_fences(fleet: FleetStore, relapse_within: int) -> Samples:
    """Fences and relapses per GPU in the ``RECENT`` seconds before the ingested end."""
    progress = fleet.progress()
    out: Samples = {"fleet_gpu_fences": [], "fleet_gpu_relapses": []}
    if progress is None:
        return out
    hi = progress.ingested_until
    try:
        with fleet.store.engine.connect() as conn:
            boards = query.load(conn, fleet.cluster, hi - RECENT, hi)
    except SQLAlchemyError as exc:
        raise fleet.failed("read from", exc) from None
    for board in boards:
        got = summary.summarize(board, hi - RECENT, hi, relapse_within)
        if not got.fences:
            continue
        labels = (board.serial, got.model or "", got.nodes[-1] if got.nodes else "")
        out["fleet_gpu_fences"].append((labels, float(len(got.fences))))
        if got.relapses:
            out["fleet_gpu_relapses"].append((labels, float(got.relapses)))
    return out


def run_once(
    fleet: FleetStore,
    settings: LedgerSettings,
    now: float,
    stopped: Callable[[], bool] = lambda: False,
    *,
    by_changes: bool = True,
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
        ingest_window(fleet, s, start, by_changes=by_changes)
        done += 1
    return done
