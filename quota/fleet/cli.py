"""`gpuquota gpus`: every GPU's health over a period, by board serial, worst first; failure
rates per model, node pool, driver or node over observed GPU-days; or one board's RMA
evidence file. Read from the fleet history the controller keeps (docs/health.md)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpuquota.cli_common import exitcodes
from gpuquota.cli_common.durations import duration_flag
from gpuquota.quota.fleet import cost, query, render, summary
from gpuquota.quota.options import add_db_option
from gpuquota.quota.report.build import ReportError
from gpuquota.quota.report.cli import add_period_arguments, connect, period_of, write_atomically
from gpuquota.quota.report.period import Period

EPILOG = """\
period: as in `gpuquota report` (--month 2026-10, --from/--to, --last 7d; default this month
so far; --tz for dates and display).

columns (one row per GPU, by board serial, worst first: fences, relapses, fenced hours,
XIDs, memory errors, lost):
  where         the nodes it was seen on in the period (a GPU moved keeps its history)
  observed      time the node agent reported it; unknown: the rest of its known life in the
                period (agent or Prometheus down, node gone): never counted as healthy
  fenced        time it was unhealthy (withdrawn from the device plugin, Node tainted)
  fences        times it became unhealthy; relapses: fences within --relapse-within of a
                release, in the period the fence falls in (the release may be in the one
                before); recoveries: how long each release held ("holding" if it still does)
  xids          XIDs by code (79x2: two XID 79); memory: ECC, remapped-row and retired-page
                counters' increase, and pending/failed remaps
The table rounds (45s, 2m05s, 35m, 1.8h); --format csv|json carry the exact figures (CSV:
observed_h, fenced_h, unknown_h in hours, recoveries in seconds).

--by model|pool|driver|node: fences and XIDs per 1,000 GPU-days, over observed time only;
no rate for a group observed under --min-gpu-days (10) GPU-days (a note says so).
--cost: per namespace, the GPU-hours fences in the period took from its pods that held the
GPUs when they were fenced (the usage ledger says which pods held which GPU).
--serial S --evidence [PATH]: PATH.json and PATH.txt (default rma-S): the board's identity and
whole timeline for a vendor's RMA case (the period does not apply).

examples:
  gpuquota gpus --month 2026-10
  gpuquota gpus --last 30d --by model --format csv
  gpuquota gpus --serial 1654922005863 --evidence

""" + exitcodes.help_text()

if TYPE_CHECKING:
    from gpuquota.quota.remediation.record import StoredAct


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_period_arguments(parser)
    what = parser.add_argument_group("what")
    what.add_argument("--by", choices=summary.GROUP_KEYS, help="failure rates per group")
    what.add_argument("--serial", metavar="SERIAL", help="only the GPU with this board serial")
    what.add_argument(
        "--evidence",
        nargs="?",
        const="",
        metavar="PATH",
        help="with --serial: write PATH.json and PATH.txt (default rma-SERIAL)",
    )
    what.add_argument(
        "--cluster", metavar="NAME", help="only this cluster (default: every cluster in the store)"
    )
    what.add_argument(
        "--relapse-within",
        metavar="DURATION",
        type=duration_flag(minimum=1),
        default=summary.DEFAULT_RELAPSE_WITHIN,
        help="a fence this soon after a release is a relapse, counted in the period the "
        "fence falls in wherever the release fell (default 1d)",
    )
    what.add_argument(
        "--min-gpu-days",
        metavar="N",
        type=float,
        default=summary.RATE_FLOOR_GPU_DAYS,
        help="with --by: no rate for a group observed less than N GPU-days "
        f"(default {summary.RATE_FLOOR_GPU_DAYS:g}; 0 shows every rate)",
    )
    what.add_argument(
        "--cost",
        action="store_true",
        help="the GPU-hours fences took from each namespace's pods holding the GPUs",
    )
    what.add_argument("--top", type=int, metavar="N", help="only the N worst GPUs")
    fmt = parser.add_argument_group("output").add_mutually_exclusive_group()
    fmt.add_argument("--format", choices=("table", "csv", "json"), default="table")
    fmt.add_argument("--json", dest="format", action="store_const", const="json")
    add_db_option(parser)


def run(args: argparse.Namespace) -> int:
    try:
        output, written = build(args)
    except ReportError as exc:
        print(f"gpuquota gpus: error: {exc}", file=sys.stderr)
        return exc.status
    if written:
        for path in written:
            print(f"gpuquota gpus: wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(output)
        sys.stdout.flush()
    return exitcodes.OK


def build(args: argparse.Namespace) -> tuple[str, list[Path]]:
    """The output, or the files written; ReportError on bad input or no data."""
    if args.cluster is not None and not args.cluster.strip():
        raise ReportError("--cluster: the cluster name is empty")
    if args.evidence is not None and not args.serial:
        raise ReportError("--evidence: give the board with --serial S")
    if args.evidence is not None and args.by:
        raise ReportError("--evidence: one board's timeline, not with --by")
    if args.cost and (args.by or args.evidence is not None):
        raise ReportError("--cost: a view of its own, not with --by or --evidence")
    if not args.min_gpu_days >= 0:
        raise ReportError(f"--min-gpu-days: {args.min_gpu_days}: give 0 or more")
    if args.top is not None and args.top < 1:
        raise ReportError(f"--top: {args.top}: give at least 1")
    window, _ = period_of(args)
    lo, hi = (0, 2**62) if args.evidence is not None else (window.start, window.end)
    where = f" for cluster {args.cluster}" if args.cluster else ""
    with connect(args.db) as conn:
        boards = query.load(conn, args.cluster, lo, hi, serial=args.serial)
    if args.evidence is not None:
        if not boards:
            raise ReportError(f"--serial: no GPU with serial {args.serial!r} in the store{where}")
        if len(boards) > 1:
            clusters = ", ".join(b.cluster for b in boards)
            raise ReportError(
                f"--serial {args.serial}: in several clusters ({clusters}): add --cluster"
            )
        base = args.evidence or f"rma-{args.serial}"
        doc = render.evidence(boards[0], args.relapse_within)
        # the pods its fences evicted or marked, over its whole life: the same key the table's
        # JSON carries for --serial, so the file and the table tell one story
        acts = _acts(args, boards[0].cluster, {st.uuid for st in boards[0].stretches}, lo, hi)
        from gpuquota.quota.fleet import pod_actions as view

        doc["summary"]["pod_actions"] = [view.act_json(a, None) for a in acts]
        files = []
        for suffix, text in (
            (".json", json.dumps(doc, indent=2) + "\n"),
            (".txt", render.evidence_text(doc) + view.acts_text(acts, None)),
        ):
            target = base + suffix
            try:
                files.append(write_atomically(target, text, ""))
            except OSError as exc:
                raise ReportError(
                    f"--evidence: cannot write {target}: {exc.strerror or exc}"
                ) from exc
        return "", files
    if not boards or not any(b.stretches for b in boards):
        raise ReportError(_no_history(args, window, where))
    if args.cost:
        return _cost(args, boards, window), []
    if args.by:
        groups = summary.rates(boards, args.by, window.start, window.end, args.relapse_within)
        return render.rates_text(groups, args.by, window, args.format, args.min_gpu_days), []
    summaries = summary.worst_first(
        summary.summarize(b, window.start, window.end, args.relapse_within) for b in boards
    )
    if args.top is not None:
        summaries = summaries[: args.top]
    text = render.boards_text(summaries, window, args.format)
    if args.serial and args.format != "csv":  # which pods its fences evicted or marked, when
        text = _with_pod_actions(args, text, summaries, window)
    return text, []


def _with_pod_actions(
    args: argparse.Namespace, text: str, summaries: list[summary.BoardSummary], window: Period
) -> str:
    from gpuquota.quota.fleet import pod_actions as view

    acts = {
        s.serial: _acts(args, s.cluster, set(s.uuids), window.start, window.end) for s in summaries
    }
    if args.format == "json":
        return view.with_acts_json(text, acts, window)
    return text + "".join(view.acts_text(a, window) for a in acts.values())


def _acts(
    args: argparse.Namespace, cluster: str, uuids: set[str], lo: int, hi: int
) -> list[StoredAct]:
    """What gpuquota remediate did to pods holding these devices in [lo, hi)."""
    from gpuquota.quota.remediation.record import acts_on_devices

    with connect(args.db) as conn:
        return list(acts_on_devices(conn, cluster, uuids, lo, hi))


def _no_history(args: argparse.Namespace, window: Period, where: str) -> str:
    """Why there is nothing to show, and what to do: a store without any fleet history is
    not the one its controller keeps it in, or that controller has no usage ledger."""
    with connect(args.db) as conn:
        ingested = query.ingested_until(conn, args.cluster)
    if ingested is None:
        return (
            f"no GPU history in this store{where}: the controller keeps it in its --db when "
            "its usage ledger is on (--ledger-prometheus-url); give that store with --db "
            "(docs/health.md, History by serial)"
        )
    what = f"GPU {args.serial!r}" if args.serial else "GPU"
    until = datetime.fromtimestamp(ingested, window.tz).isoformat()
    return f"no {what} history{where} in {window.label()} (the history is ingested up to {until})"


def _cost(args: argparse.Namespace, boards: list[summary.BoardHistory], window: Period) -> str:
    found = []
    with connect(args.db) as conn:
        for name in sorted({b.cluster for b in boards}):
            mine = [b for b in boards if b.cluster == name]
            wanted = [(uuid, at) for b in mine for at, _, uuid in cost.fence_spans(b)]
            found += cost.costs(mine, cost.holders_of(conn, name, wanted), window.start, window.end)
    merged: dict[str, cost.NamespaceCost] = {}
    for c in found:  # several clusters: one row per namespace name
        into = merged.setdefault(c.namespace, cost.NamespaceCost(c.namespace))
        into.fences += c.fences
        into.gpu_seconds += c.gpu_seconds
        into.pods |= c.pods
        into.serials |= c.serials
    rows = sorted(merged.values(), key=lambda c: (-c.gpu_seconds, c.namespace))
    return render.cost_text(rows, window, args.format)
