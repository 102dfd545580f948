"""`gpuquota report`: parse the flags into a ReportRequest, open the store, build the report
(quota/report/build.py) and render it (exit 2 on bad input, nothing on stdout unless the
whole report was computed)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from gpuquota.cli_common import exitcodes
from gpuquota.cli_common.durations import duration_flag
from gpuquota.cli_common.ratios import parse_ratio
from gpuquota.quota.options import add_db_option, add_prometheus_cluster_label_option
from gpuquota.quota.report import period, ratecard, render
from gpuquota.quota.report.allocations import GROUP_COLUMNS
from gpuquota.quota.report.build import ReportError, ReportRequest, build_report, first_line
from gpuquota.quota.store.db import (
    StoreError,
    StoreUnavailableError,
    StoreURLError,
    reading,
    safe_url,
)

EPILOG = """\
period (half-open [start, end); default: this month so far; --tz zone, default UTC):
  --month 2026-10                    a calendar month, midnight to midnight in --tz
  --from 2026-10-01 --to 2026-10-08  dates are midnight in --tz; RFC 3339 times also work
  --last 7d                          the last 7 days up to now (ms, s, m, h, d, w, combined
                                     as in 1h30m, or a bare number of seconds)
  Intervals are split pro rata at the window's edges; running allocations count up to the
  end of the window, now, or where the cluster's data ends (the controller's last heartbeat
  or a replay's last event), whichever is earliest; the report notes where the data ends.

group keys (--by, comma-separated or repeated; default namespace):
  namespace, model, node, pool (node pool), cluster, owner (namespace/Kind/name), resource
  (resource name; a DRA claim's device class), pod (namespace/pod), path (device-plugin:
  extended resources such as nvidia.com/gpu; dra: ResourceClaims), label:<key> (the
  namespace's label as it was at the time). Every view counts both allocation paths; a
  claim shared by several pods counts once; pod-level keys (owner, pod) split its time
  equally among the pods using it at each instant.

columns:
  GPU-h raw         GPU-hours in the units pods requested (a MIG slice or a shared
                    replica counts as one)
  GPU-h phys        physical-GPU equivalents (replica = 1/replicas, MIG NgX = N/7 or the
                    rate card's fraction)
  cost              physical GPU-hours x the rate in force when it happened (--rate-card)
  share %           share of the physical GPU-hours of all groups
  est. GPU-h        raw GPU-hours of intervals closed by estimate (controller downtime)
  spread idle GPU-h with --spread-idle: the idle table's idle GPU-hours shared among groups
  prom util %, prom busy GPU-h, prom not-busy GPU-h   with --prometheus: utilisation, per
                    pod where the exporter runs --pod-usage (a shared GPU's busy time split
                    by each pod's SM use), else split evenly among the pods holding a GPU
  used GPU-h, eff. %, idle alloc GPU-h, energy kWh, energy cost, kg CO2e, coverage %
                    from the usage ledger (where the store has one): used physical
                    GPU-hours, used / the allocated GPU-hours the ledger covers, the covered
                    rest, energy (priced and turned into carbon by the rate card's
                    energy_price_per_kwh and carbon_g_per_kwh), and the share of allocated
                    GPU-seconds with samples; blank (null) where a group has no usage data
  idle allocations  --idle-allocations: holders whose activity stayed under --idle-threshold
                    (5%) for at least --idle-for (1h) of consecutive ledger windows
  quota section     per group, quota and resource (each in its own units: whole GPUs, MIG
                    slices and shared replicas are never added up): time-weighted average
                    used and hard, peak used and hard, unused unit-hours (hard - used) and
                    the share of the period with quota samples; with --by namespace or a
                    namespace label
  Rounding: each figure is rounded half up from its own exact value, a total from the exact
  sum of its rows (so within half a unit per row of the rows shown); CSV and JSON carry the
  exact values. Idle and allocatable count only the time the store covers (after its data
  begins, before it ends, outside recorded gaps); the rest is "uncovered GPU-h", not idle.

examples:
  gpuquota report --month 2026-10 --rate-card ratecard.yaml
  gpuquota report --last 7d --by label:team,model --format csv > team-usage.csv
  gpuquota report --month 2026-10 --tz Europe/Berlin --idle --spread-idle proportional
  gpuquota report --from 2026-10-01 --to 2026-10-15T12:00:00Z --by owner --top 20
  gpuquota report --month 2026-10 --prometheus http://prometheus:9090 --chart usage.svg
  gpuquota report --db postgresql+psycopg://gpuquota@db/gpuquota --cluster prod --json
  gpuquota report --month previous --idle-allocations --idle-for 2h
  gpuquota report --month previous --rate-card ratecard.yaml --format focus > focus.csv
                                     (FinOps FOCUS 1.3; --focus-version 1.2 for 1.2: one
                                     row per cluster, namespace, owner, node pool, SKU and
                                     day: allocated GPU-Hours, kWh, Used GPU-Hours; with
                                     --spread-idle Idle GPU-Hours too; --focus-tags
                                     team,cost-center puts those namespace labels in Tags)

missing data is never shown as zero: a group Prometheus has no samples for, or a namespace
without quota samples, gets blank cells (null in JSON) and a note naming it; "measured %"
says how much of the allocated time Prometheus covers, and util % is over that part only.
An empty store, or a period the store covers none of, is exit 2, never an empty bill.

On an error nothing is printed on stdout: the report is computed before any of it is.

""" + exitcodes.help_text()


def add_period_arguments(parser: argparse.ArgumentParser) -> None:
    """--from/--to, --month, --last, --tz and --now (period.resolve), for every command that
    reports over a period (`gpuquota report`, `gpuquota gpus`)."""
    when = parser.add_argument_group("period")
    when.add_argument(
        "--from", dest="start", metavar="WHEN", help="start: date or RFC 3339 time (inclusive)"
    )
    when.add_argument(
        "--to",
        dest="end",
        metavar="WHEN",
        help="end: date or RFC 3339 time (exclusive; default now)",
    )
    when.add_argument(
        "--month",
        metavar="YYYY-MM",
        help="a calendar month in --tz; 'previous' is the last whole month (a monthly job)",
    )
    when.add_argument(
        "--last",
        metavar="DURATION",
        type=duration_flag(minimum=1),
        help="the period up to now, e.g. 7d, 12h, 1h30m (durations as in every gpuquota flag)",
    )
    when.add_argument(
        "--tz",
        default="UTC",
        metavar="ZONE",
        help="time zone for dates and display (IANA name; default UTC)",
    )
    when.add_argument(
        "--now",
        metavar="WHEN",
        help="take this time as now (reproducible reports; default: the clock)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "GPU-hour chargeback: GPU-hours per group over a period, their cost, quota use\n"
        "and the fleet's idle GPU-hours, computed in the database from the quota store."
    )
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_period_arguments(parser)
    what = parser.add_argument_group("grouping and columns")
    what.add_argument(
        "--by",
        action="append",
        metavar="KEYS",
        help="group keys, comma-separated or repeated (default namespace); see below",
    )
    what.add_argument(
        "--cluster", metavar="NAME", help="only this cluster (default: every cluster in the store)"
    )
    what.add_argument(
        "--rate-card", metavar="FILE", type=Path, help="YAML rate card for the cost columns"
    )
    what.add_argument(
        "--idle", action="store_true", help="add idle GPU-hours per model and node pool"
    )
    what.add_argument(
        "--spread-idle",
        choices=("proportional", "even"),
        help="share idle GPU-hours (and cost) among groups by use or evenly (implies --idle)",
    )
    what.add_argument(
        "--top",
        type=int,
        metavar="N",
        help="show the N largest groups (N >= 1) and fold the rest into (other); default: all",
    )
    what.add_argument(
        "--prometheus",
        metavar="URL",
        help="Prometheus base URL for measured utilisation (any --by keys)",
    )
    add_prometheus_cluster_label_option(what)
    ledger = parser.add_argument_group("usage ledger")
    ledger.add_argument(
        "--idle-allocations",
        action="store_true",
        help="add the idle allocations: holders whose activity stayed under --idle-threshold "
        "for at least --idle-for of consecutive ledger windows (reclaim candidates)",
    )
    ledger.add_argument(
        "--idle-threshold",
        metavar="RATIO",
        default="5%",
        help="activity under this is idle: a ratio (0.05) or a percentage (5%%), as the "
        "controller's flag (default 5%%)",
    )
    ledger.add_argument(
        "--idle-for",
        metavar="DURATION",
        type=duration_flag(minimum=1),
        default=3600,
        help="idle for at least this long (default 1h)",
    )
    out = parser.add_argument_group("output")
    fmt = out.add_mutually_exclusive_group()
    fmt.add_argument(
        "--format",
        choices=("table", "csv", "json", "focus"),
        default="table",
        help="output format (default table); focus: a FinOps FOCUS 1.3 (or 1.2) CSV export",
    )
    fmt.add_argument(
        "--json", dest="format", action="store_const", const="json", help="same as --format json"
    )
    add_focus_arguments(parser)
    out.add_argument(
        "--output",
        metavar="FILE",
        help="write the report to FILE instead of stdout, whole or not at all (written beside "
        "it, then renamed); {month} in FILE becomes the period's first month, e.g. 2026-10",
    )
    out.add_argument(
        "--chart",
        metavar="FILE",
        type=Path,
        help="also draw GPU-hours per group over time (.png or .svg; needs gpuquota[chart])",
    )
    add_db_option(parser)


def add_focus_arguments(parser: argparse.ArgumentParser) -> None:
    """The FOCUS export's version, identity and tag flags (each over the rate card's focus:
    section, quota/report/focus_settings.py)."""
    from gpuquota.quota.report import focus_csv, focus_settings

    group = parser.add_argument_group("FOCUS export (--format focus)")
    group.add_argument(
        "--focus-version",
        choices=focus_csv.VERSIONS,
        help=f"FOCUS version of the export (default {focus_csv.DEFAULT_VERSION})",
    )
    helps = {
        "billing_account_id": "BillingAccountId (default gpuquota)",
        "billing_account_name": "BillingAccountName (default: the billing account id)",
        "provider": "ServiceProviderName (1.3) and ProviderName (default gpuquota)",
        "host_provider": "HostProviderName (1.3; default: the provider)",
        "publisher": "PublisherName (default: the provider)",
        "invoice_issuer": "InvoiceIssuerName (default: the provider)",
        "tags": "namespace labels to put in Tags, comma-separated (as --by label:KEY), "
        "e.g. team,cost-center",
    }
    for key, flag in focus_settings.KEYS.items():
        group.add_argument(flag, dest=f"focus_{key}", metavar="KEYS" if key == "tags" else "NAME",
                           help=helps[key])  # fmt: skip


def focus_settings_of(args: argparse.Namespace, card: ratecard.RateCard | None) -> Any:
    """The FOCUS settings: the flags over the rate card's focus: section; ReportError on a bad
    flag, or on a FOCUS flag given without --format focus."""
    from gpuquota.quota.report import focus_settings

    given = {k: getattr(args, f"focus_{k}", None) for k in focus_settings.KEYS}
    named = [focus_settings.KEYS[k] for k, v in given.items() if v is not None]
    if getattr(args, "focus_version", None) is not None:
        named.insert(0, "--focus-version")
    if args.format != "focus":
        if named:
            raise ReportError(f"{named[0]}: only with --format focus")
        return None
    values: dict[str, Any] = {}
    for key, value in given.items():
        if value is None:
            continue
        flag = focus_settings.KEYS[key]
        try:
            if key == "tags":
                values[key] = focus_settings.label_keys(value, flag)
            else:
                values[key] = focus_settings.text(value, flag)
        except focus_settings.SettingError as exc:
            raise ReportError(f"{flag}: {exc.problem}") from exc
    base = card.focus if card is not None else focus_settings.FocusSettings()
    return focus_settings.FocusSettings(**values).over(base)


def parse_keys(values: Sequence[str] | None) -> list[str]:
    keys: list[str] = []
    for value in values or ["namespace"]:
        for part in value.split(","):
            key = part.strip()
            if key.startswith("label:"):
                if not key[len("label:") :].strip():
                    raise ReportError(f"--by: {part!r} needs a label key, e.g. label:team")
                key = "label:" + key[len("label:") :].strip()
            elif key not in GROUP_COLUMNS:
                known = ", ".join([*GROUP_COLUMNS, "label:<key>"])
                raise ReportError(f"--by: unknown group key {part.strip()!r} (known: {known})")
            if key in keys:
                raise ReportError(f"--by: group key {key!r} given twice")
            keys.append(key)
    return keys


def run(args: argparse.Namespace) -> int:
    try:
        if args.output is not None and not args.output.strip():
            raise ReportError("--output: give a file name")
        output, stderr_notes = build(args)
    except ReportError as exc:
        print(f"gpuquota report: error: {exc}", file=sys.stderr)
        return exc.status
    if args.output:
        try:
            written = write_atomically(args.output, output, args.output_month)
        except OSError as exc:
            print(
                f"gpuquota report: error: --output: cannot write {args.output}: "
                f"{exc.strerror or exc}",
                file=sys.stderr,
            )
            return exitcodes.BAD_INPUT
        print(f"gpuquota report: wrote {written}", file=sys.stderr)
    else:
        sys.stdout.write(output)
        sys.stdout.flush()
    for note in stderr_notes:
        print(f"gpuquota report: note: {note}", file=sys.stderr)
    return 0


def period_of(args: argparse.Namespace) -> tuple[period.Period, int]:
    """The period of add_period_arguments' flags and the time taken as now; ReportError on
    bad input."""
    try:
        now = int(time.time())
        if args.now is not None:
            now = period.parse_instant(args.now, period.parse_zone(args.tz), "--now")
        window = period.resolve(
            now=now,
            tz_name=args.tz,
            start=args.start,
            end=args.end,
            month=args.month,
            last=args.last,
        )
    except period.PeriodError as exc:
        raise ReportError(str(exc)) from exc
    return window, now


def request_of(args: argparse.Namespace) -> ReportRequest:
    """The parsed and checked flags as a ReportRequest; ReportError on bad input."""
    window, now = period_of(args)
    keys = parse_keys(args.by)
    if args.top is not None and args.top < 1:
        raise ReportError(f"--top: {args.top} groups: give at least 1 (leave --top out for all)")
    if args.chart is not None and args.format == "focus":
        raise ReportError("--chart: not with --format focus (its rows are per day already)")
    if args.chart is not None and args.chart.suffix.lower() not in (".png", ".svg"):
        raise ReportError(f"--chart: {args.chart} must end in .png or .svg")
    if args.prometheus:
        from gpuquota.quota.report import prometheus

        try:
            prometheus.check_url(args.prometheus)
        except prometheus.PrometheusError as exc:
            raise ReportError(str(exc)) from exc
    if args.cluster is not None and not args.cluster.strip():
        raise ReportError("--cluster: the cluster name is empty")
    card = None
    if args.rate_card is not None:
        try:
            card = ratecard.load(args.rate_card)
        except ratecard.RateCardError as exc:
            raise ReportError(f"rate card {exc}") from exc
    try:
        threshold = parse_ratio(args.idle_threshold)
    except ValueError as exc:
        raise ReportError(f"--idle-threshold: {exc}") from None
    focus_settings_of(args, card)  # FOCUS flags only with --format focus
    if args.format == "focus" and args.by:
        raise ReportError(
            "--format focus: one row per namespace, SKU (GPU model and resource) and charge "
            f"period: leave --by out (got --by {','.join(keys)})"
        )
    if args.format == "focus" and args.idle and args.spread_idle is None:
        raise ReportError(
            "--format focus: --idle alone has no FOCUS rows (idle capacity is no namespace's "
            "charge): add --spread-idle proportional|even to charge it to the namespaces"
        )
    if args.format == "focus":
        from gpuquota.quota.report import focus

        for flag, given in (
            ("--idle-allocations", args.idle_allocations),
            ("--prometheus", args.prometheus),
        ):
            if given:
                raise ReportError(
                    f"--format focus: {flag} is a view FOCUS rows do not carry (costs and "
                    "quantities only): leave it out, or ask for it in another --format"
                )
        settings = focus_settings_of(args, card)
        keys = list(focus.keys(settings.tags))
    if args.format == "focus" and args.top is not None:
        raise ReportError("--format focus: --top does not apply (every namespace is a row)")
    if args.format == "focus" and card is None:
        raise ReportError("--format focus: needs --rate-card (FOCUS rows carry costs)")
    if args.format == "focus" and card is not None:
        from gpuquota.quota.report import currency

        wrong = currency.problem(card.currency)
        if wrong is not None:
            raise ReportError(
                f"--format focus: the rate card's currency {card.currency!r} {wrong} "
                "(FOCUS BillingCurrency)"
            )
    return ReportRequest(
        window=window,
        now=now,
        keys=tuple(keys),
        cluster=args.cluster,
        card=card,
        idle=args.idle,
        spread_idle=args.spread_idle,
        top=args.top,
        chart_buckets=args.chart is not None,
        day_buckets=args.format == "focus",
        prometheus=args.prometheus,
        prometheus_cluster_label=args.prometheus_cluster_label,
        idle_allocations=args.idle_allocations,
        idle_threshold=threshold,
        idle_for=int(args.idle_for),
    )


def build(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The whole report as text (and notes for stderr); raises ReportError on bad input."""
    request = request_of(args)
    chart_module: Any = None
    if args.chart is not None:
        from gpuquota.quota.report import chart

        try:
            chart_module = chart.require()
        except chart.ChartUnavailableError as exc:
            raise ReportError(str(exc)) from exc
    with connect(args.db) as conn:
        report = build_report(conn, request)
    window = request.window
    args.output_month = datetime.fromtimestamp(window.start, window.tz).strftime("%Y-%m")
    if args.format == "csv":
        output, notes = render.render_csv(report), render.notes(report)
    elif args.format == "focus":
        from gpuquota.quota.report import focus_csv

        assert request.card is not None  # request_of refuses focus without a rate card
        output = focus_csv.render(
            report,
            window,
            request.card,
            focus_settings_of(args, request.card),
            args.focus_version or focus_csv.DEFAULT_VERSION,
            request.spread_idle,
        )
        notes = render.notes(report)
        if request.spread_idle is None:
            notes.append(
                "--format focus: the fleet's idle GPU-hours are in no row (they are nobody's "
                "charge); --spread-idle proportional|even adds each namespace's share as rows"
            )
    elif args.format == "json":
        output, notes = render.render_json(report, window), []
    else:
        output, notes = render.render_table(report, window), []
    if chart_module is not None:
        try:
            chart_module.draw(report, window, args.chart)
        except OSError as exc:
            raise ReportError(f"--chart: cannot write {args.chart}: {exc.strerror or exc}") from exc
    return output, notes


def write_atomically(target: str, text: str, month: str) -> Path:
    """``text`` into ``target`` ({month} filled in) through a temporary file in the same folder
    renamed over it: a reader (or a crash) never sees half a report."""
    path = Path(target.replace("{month}", month))
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextmanager
def connect(url: str) -> Iterator[Connection]:
    """The store's read-only report connection (quota/store/db.py ``reading``), its errors as
    ReportError: bad input 2, a database that does not answer 1."""
    try:
        with reading(url) as conn:
            yield conn
    except StoreURLError as exc:
        raise ReportError(f"--db: {exc}") from exc
    except StoreUnavailableError as exc:
        raise ReportError(str(exc), 1) from exc
    except StoreError as exc:
        raise ReportError(str(exc)) from exc
    except SQLAlchemyError as exc:
        raise ReportError(
            f"cannot connect to database {safe_url(url)}: {first_line(exc)}", 1
        ) from exc
