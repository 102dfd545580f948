"""Which node agents' GPUs changed in a window, asked of the time-series store with PromQL
instead of read from every sample (issue 37): the fleet history needs transitions (a verdict
or its reasons changed, a counter moved, a series appeared or went silent, an identity
changed), and nearly every scrape of a big fleet says "nothing changed".

An agent's GPU (its ``uuid``, ``node`` and ``instance`` labels) is *busy* in [lo, hi] when
its agent counts its own changes (``gpu_history_changes_total``, one series per GPU: it grows
whenever any series the history reads changed value or presence between two renderings,
exporter/expose/history.py) and:

- that counter changed (``changes``), or was not there at every scrape of its agent (its
  ``count_over_time`` against that of the agent's ``gpuquota_exporter_start_time_seconds``,
  which every scrape of the agent has): the GPU appeared, went, or changed (a scrape that
  drops the start time makes every GPU of its agent busy);
- its agent was silent for about ``max_gap`` or more anywhere in [lo, hi] (a subquery counts
  the agent's start-time samples in windows of ``W`` seconds every ``S`` seconds, W + S =
  max_gap - 2, so any silence the history could call a gap leaves one window empty; the
  start or the end included), or restarted (its start time changed: a new count, and values
  that may have changed while it was down).

So the store reads one series per GPU and one per agent, instead of about two dozen per GPU.

A GPU whose agent does not say the counter (an agent older than it, or a scrape that drops
it) is asked about the old way, from the series themselves (``busy_terms``): busy when

- a series of it changed value (``changes``) or was not there at every scrape of its
  ``gpu_info`` (``count_over_time`` against gpu_info's), so appeared, went, or was NaN;
- it had more than one ``gpu_info`` series (its identity changed);
- its ``gpu_info`` was silent for about ``max_gap`` or more anywhere in [lo, hi] (the same
  subquery over gpu_info).

Those queries are asked only of the agents (``instance``) without the counter, while there
are few of them, else of every agent.

The others are *quiet*: said the same at every scrape from before the window to after it,
without a gap. The history of a quiet GPU is one observed stretch over the whole window and
no event (quota/fleet/rules.py, ``Reading.until``), so only its identity, verdict and whether
it is lost are asked (their values at ``hi``); the samples of the busy ones are fetched.
Both Prometheus and VictoriaMetrics answer these queries through the same HTTP API.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpuquota.quota import promhttp
from gpuquota.quota.promhttp import PrometheusError
from gpuquota.quota.promscope import Scope

BY = "uuid,node,instance"  # an agent's GPU: what rules.Reading.agent is made of
GPU = ',uuid=~"GPU-.*"'  # whole GPUs (MIG instances are parts of their board)
INFO = "gpu_info"
COUNTER = "gpu_history_changes_total"  # per GPU: its agent's count of its history's changes
START = "gpuquota_exporter_start_time_seconds"  # per agent (its scrape target: instance)
AGENT = "instance"
# the labels of gpu_info a reading keeps (source._identity, with uuid and node): the quiet
# GPUs' answer leaves out the others (a third of its bytes)
IDENTITY = "serial,pci_bus_id,model,driver_version,vbios_version"
SIDE_BY_SIDE = 4  # queries asked at once
# agents without the counter asked about by instance (each query's selectors repeat the
# instances, so a few hundred of them per query), over this many queries each the old way
# asks about every agent instead
LEGACY_PIECES = 2
LEGACY_BYTES = 3_000


def windows(max_gap: int) -> tuple[int, int] | None:
    """The silence test's window and step (W, S), or None when ``max_gap`` is too short for
    one (every GPU is then busy)."""
    if max_gap < 6:
        return None
    w = (max_gap - 2) // 2
    return w, max_gap - 2 - w


# The agents' series, in groups whose series never share their labels once the metric's name
# is dropped (as changes() drops it; two that did would make Prometheus refuse the query):
# one query per group reads each series once. A metric of the fleet history in none is asked
# on its own.
GROUPS = (
    (
        "gpu_health_state",
        "gpu_health_reason",
        "gpu_xid_errors_total",
        "gpu_ecc_aggregate_errors_total",
        "gpu_health_since_timestamp_seconds",
    ),
    ("gpu_remapped_rows_total", "gpu_row_remap_pending", "gpu_device_state"),
    ("gpu_retired_pages_total", "gpu_row_remap_failure"),
    ("gpu_retired_pages_pending",),
)
# more matchers of a group: of the device states the history reads only whether it is lost
# (the group's other series have no state label)
ONLY = {"gpu_device_state": ',state=~"lost|"'}
# series whose presence at every scrape matters, not only their values: a reason or an XID
# counter appearing, a verdict or a lost GPU's state no longer said (the verdict's series come
# and go together: its since stands for its states). The others may be left out of a scrape
# (a failed NVML read) without changing the history.
PRESENCE = (
    "gpu_health_reason",
    "gpu_xid_errors_total",
    "gpu_health_since_timestamp_seconds",
    "gpu_device_state",  # its lost state only
)


def selectors(metrics: Sequence[str], matchers: str = "") -> list[str]:
    """The selectors that read ``metrics`` (but gpu_info): ``GROUPS``, then each other one on
    its own; each with ``matchers`` (``,label=~"..."``) too."""
    wanted = [m for m in metrics if m != INFO]
    out = []
    for group in GROUPS:
        names = [m for m in group if m in wanted]
        if names:
            more = "".join(sorted({ONLY.get(m, "") for m in names}))
            out.append(f'{{__name__=~"{"|".join(names)}"{more}{matchers}}}')
    grouped = {m for g in GROUPS for m in g}
    out += [f'{{__name__="{m}"{ONLY.get(m, "")}{matchers}}}' for m in wanted if m not in grouped]
    return out


def _silent(selector: str, by: str, lo: int, hi: int, w: int, step: int) -> str:
    """The series of ``selector`` (by ``by``) without a sample in some window of ``w``
    seconds of [lo, hi], stepped by ``step``: silent for about w + step or more."""
    span = f"[{hi - lo - w}s:{step}s]"
    return (
        f"count by ({by}) (count_over_time(count_over_time({selector}[{w}s]){span})"
        f" < scalar(count_over_time(vector(1){span})))"
    )


def busy_terms(
    metrics: Sequence[str], lo: int, hi: int, max_gap: int, matchers: str = ""
) -> list[str] | None:
    """The old way, from the series themselves: the PromQL queries, evaluated at ``hi``,
    whose answers together are every busy agent's GPU (labels ``BY``; MIG instances too,
    which the caller leaves out) among the series with ``matchers``: asked side by side, a
    store evaluating each query on one core uses several."""
    steps = windows(max_gap)
    if steps is None:
        return None
    w, step = steps
    r = f"[{hi - lo + 1}s]"  # a second before lo too: Prometheus 3 leaves a range's start out
    info = f"{INFO}{{{matchers[1:]}}}" if matchers else INFO
    seen = f"max by ({BY}) (count_over_time({info}{r}))"
    terms = [
        f"count by ({BY}) (count_over_time({info}{r})) > 1",
        # every window of w seconds in [lo, hi] holds a sample of gpu_info
        _silent(info, BY, lo, hi, w, step),
    ]
    for sel in selectors(metrics, matchers):
        terms.append(f"sum by ({BY}) (changes({sel}{r})) > 0")
    present = [m for m in PRESENCE if m in metrics]
    if present:
        # one selector for all (their labels differ): the lost device state and the others,
        # which have no state label
        sel = f'{{__name__=~"{"|".join(present)}",state=~"lost|"{matchers}}}'
        terms.append(
            f"count by ({BY}) (count_over_time({sel}{r}) != on ({BY}) group_left () {seen})"
        )
    return terms


def busy_query(metrics: Sequence[str], lo: int, hi: int, max_gap: int) -> str | None:
    """``busy_terms`` as one query."""
    terms = busy_terms(metrics, lo, hi, max_gap)
    return None if terms is None else " or ".join(f"({t})" for t in terms)


def counter_terms(lo: int, hi: int, max_gap: int) -> dict[str, str] | None:
    """The queries, evaluated at ``hi``, of the agents that count their GPUs' changes
    (``COUNTER``): by name, ``counted`` (each GPU's counter samples in [lo, hi]; every GPU
    with one), ``scrapes`` (each agent's start-time samples), ``changed`` (the GPUs whose
    counter changed), ``silent`` and ``restarted`` (the agents silent for about ``max_gap``
    or more, the agents whose start time changed)."""
    steps = windows(max_gap)
    if steps is None:
        return None
    w, step = steps
    r = f"[{hi - lo + 1}s]"
    counter = f"{COUNTER}{{{GPU[1:]}}}"
    return {
        "counted": f"max by ({BY}) (count_over_time({counter}{r}))",
        "scrapes": f"max by ({AGENT}) (count_over_time({START}{r}))",
        "changed": f"max by ({BY}) (changes({counter}{r})) > 0",
        "silent": _silent(START, AGENT, lo, hi, w, step),
        "restarted": f"max by ({AGENT}) (changes({START}{r})) > 0",
    }


@dataclass(frozen=True)
class Quiet:
    """A quiet agent's GPU: its gpu_info labels, verdict (``unknown`` when no state is 1) and
    whether it is lost."""

    info: dict[str, str]
    state: str
    lost: bool


def _key(labels: dict[str, str]) -> tuple[str, str, str]:
    return labels.get("uuid", ""), labels.get("node", ""), labels.get("instance", "")


def _vector(
    base_url: str, promql: str, at: int, timeout: float, scope: Scope | None = None
) -> list[dict[str, Any]]:
    data = promhttp.instant_query(base_url, promql, at, timeout, scope)
    result = data.get("result")
    if data.get("resultType") != "vector" or not isinstance(result, list):
        raise PrometheusError(f"Prometheus at {base_url}: expected a vector for {promql!r:.200}")
    try:
        return [{"metric": dict(item["metric"]), "value": item["value"]} for item in result]
    except (KeyError, TypeError) as exc:
        raise PrometheusError(
            f"Prometheus at {base_url}: malformed answer {result!r:.200}"
        ) from exc


def find(
    base_url: str,
    metrics: Sequence[str],
    lo: int,
    hi: int,
    max_gap: int,
    timeout: float,
    scope: Scope | None = None,
) -> tuple[list[tuple[str, str, str]], list[Quiet]] | None:
    """The busy agents' GPUs (uuid, node, instance) and the quiet ones, or None when the
    silence test cannot tell (``windows``). Its queries are asked side by side: first the
    counters' (``counter_terms``) with the quiet GPUs' identity, verdict and lost flag, then,
    for the GPUs without a counter, the old way's (``busy_terms``); over ``scope``'s series
    only (quota/promscope.py adds its matcher to every selector)."""
    terms = counter_terms(lo, hi, max_gap)
    if terms is None:
        return None
    r = f"[{hi - lo + 1}s]"
    asked = [
        # quiet: the same value throughout; gpu_info in [lo, hi] only, the others as at hi
        f"max by ({BY},{IDENTITY}) (last_over_time({INFO}{{{GPU[1:]}}}{r}))",
        f"max by ({BY},state) (gpu_health_state{{{GPU[1:]}}} == 1)",
        f'max by ({BY}) (gpu_device_state{{state="lost"{GPU}}} == 1)',
        *terms.values(),
    ]
    answers = _ask(base_url, asked, hi, timeout, scope)
    infos, states_said, lost_said = answers[:3]
    said = dict(zip(terms, answers[3:], strict=True))
    scrapes = {item["metric"].get(AGENT, ""): _number(item) for item in said["scrapes"]}
    counted = {_key(item["metric"]): _number(item) for item in said["counted"]}
    busy = {key for key, n in counted.items() if scrapes.get(key[2]) != n}
    busy.update(_key(item["metric"]) for item in said["changed"])
    agents = {item["metric"].get(AGENT, "") for item in said["silent"] + said["restarted"]}
    keys = {_key(item["metric"]) for item in infos} | set(counted)
    busy.update(key for key in keys if key[2] in agents)
    legacy = sorted({key[2] for key in keys if key not in counted})
    if legacy:
        busy.update(_old_way(base_url, metrics, lo, hi, max_gap, timeout, legacy, scope))
    found = sorted(key for key in busy if key[0].startswith("GPU-"))
    busy_uuids = {uuid for uuid, _, _ in found}
    states = {_key(item["metric"]): item["metric"].get("state", "") for item in states_said}
    lost = {_key(item["metric"]) for item in lost_said}
    quiet = []
    for item in infos:
        key = _key(item["metric"])
        if key[0] not in busy_uuids:
            quiet.append(Quiet(item["metric"], states.get(key, "unknown"), key in lost))
    return found, quiet


def _old_way(
    base_url: str,
    metrics: Sequence[str],
    lo: int,
    hi: int,
    max_gap: int,
    timeout: float,
    agents: list[str],
    scope: Scope | None = None,
) -> set[tuple[str, str, str]]:
    """The busy GPUs of ``agents`` (instances whose GPUs have no counter), asked the old
    way (``busy_terms``): of those agents while they fit in ``LEGACY_PIECES`` pieces of
    instances, else of every agent."""
    pieces = list(regexes(agents, LEGACY_BYTES))
    matchers = [f',{AGENT}=~"{regex}"' for regex in pieces] if len(pieces) <= LEGACY_PIECES else [""]  # fmt: skip
    asked = []
    for more in matchers:
        terms = busy_terms(metrics, lo, hi, max_gap, more)
        assert terms is not None  # counter_terms asked the same of windows()
        asked += terms
    return {
        _key(item["metric"]) for said in _ask(base_url, asked, hi, timeout, scope) for item in said
    }


def _ask(
    base_url: str, queries: list[str], at: int, timeout: float, scope: Scope | None = None
) -> list[list[dict[str, Any]]]:
    """The vectors of ``queries`` at ``at``, asked ``SIDE_BY_SIDE`` at once."""
    with ThreadPoolExecutor(max_workers=SIDE_BY_SIDE) as pool:
        return list(pool.map(lambda q: _vector(base_url, q, at, timeout, scope), queries))


def _number(item: dict[str, Any]) -> float:
    try:
        return float(item["value"][1])
    except (IndexError, TypeError, ValueError) as exc:
        raise PrometheusError(f"malformed sample {item!r:.200}") from exc


def groups(values: list[str], budget: int) -> Iterator[list[str]]:
    """``values`` in runs whose regular expression (``alternatives``) is at most about
    ``budget`` characters (one value each at least)."""
    out: list[str] = []
    size = 0
    for value in values:
        one = len(alternatives([value])) + 1
        if out and size + one > budget:
            yield out
            out, size = [], 0
        out.append(value)
        size += one
    if out:
        yield out


def regexes(values: list[str], budget: int) -> Iterator[str]:
    """``values`` as regular expressions (``alternatives``) of at most about ``budget``
    characters each (one value each at least)."""
    return map(alternatives, groups(values, budget))


def alternatives(values: list[str]) -> str:
    """A regular expression matching exactly ``values`` (each character but letters,
    digits, ``_``, ``:`` and ``-`` escaped), written for a double-quoted PromQL string."""
    regex = "|".join(re.sub(r"[^A-Za-z0-9_:-]", lambda m: "\\" + m.group(), v) for v in values)
    return regex.replace("\\", "\\\\").replace('"', '\\"')
