"""Which node agents' GPUs changed in a window, asked of the time-series store with PromQL
instead of read from every sample (issue 37): the fleet history needs transitions (a verdict
or its reasons changed, a counter moved, a series appeared or went silent, an identity
changed), and nearly every scrape of a big fleet says "nothing changed".

An agent's GPU (its ``uuid``, ``node`` and ``instance`` labels) is *busy* in [lo, hi] when:

- a series of it changed value (``changes``) or was not there at every scrape of its
  ``gpu_info`` (``count_over_time`` against gpu_info's), so appeared, went, or was NaN;
- it had more than one ``gpu_info`` series (its identity changed);
- its ``gpu_info`` was silent for about ``max_gap`` or more anywhere in [lo, hi]: a subquery
  counts gpu_info's samples in windows of ``W`` seconds every ``S`` seconds (W + S =
  max_gap - 2, so any silence the history could call a gap leaves one window empty), and
  fewer windows with a sample than windows is a silence, the start or the end included.

The others are *quiet*: said the same at every scrape from before the window to after it,
without a gap. The history of a quiet GPU is one observed stretch over the whole window and
no event (quota/fleet/rules.py, ``Reading.until``), so only its identity, verdict and whether
it is lost are asked (their values at ``hi``); the samples of the busy ones are fetched.
Both Prometheus and VictoriaMetrics answer these queries through the same HTTP API.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpuquota.quota import promhttp
from gpuquota.quota.promhttp import PrometheusError
from gpuquota.quota.promscope import Scope

BY = "uuid,node,instance"  # an agent's GPU: what rules.Reading.agent is made of
GPU = ',uuid=~"GPU-.*"'  # whole GPUs (MIG instances are parts of their board)
INFO = "gpu_info"
SIDE_BY_SIDE = 4  # queries asked at once


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


def selectors(metrics: Sequence[str]) -> list[str]:
    """The selectors that read ``metrics`` (but gpu_info): ``GROUPS``, then each other one on
    its own."""
    wanted = [m for m in metrics if m != INFO]
    out = []
    for group in GROUPS:
        names = [m for m in group if m in wanted]
        if names:
            more = "".join(sorted({ONLY.get(m, "") for m in names}))
            out.append(f'{{__name__=~"{"|".join(names)}"{more}}}')
    grouped = {m for g in GROUPS for m in g}
    out += [f'{{__name__="{m}"{ONLY.get(m, "")}}}' for m in wanted if m not in grouped]
    return out


def busy_terms(metrics: Sequence[str], lo: int, hi: int, max_gap: int) -> list[str] | None:
    """The PromQL queries, evaluated at ``hi``, whose answers together are every busy agent's
    GPU (labels ``BY``; MIG instances too, which the caller leaves out): asked side by side,
    a store evaluating each query on one core uses several."""
    steps = windows(max_gap)
    if steps is None:
        return None
    w, step = steps
    r = f"[{hi - lo + 1}s]"  # a second before lo too: Prometheus 3 leaves a range's start out
    seen = f"max by ({BY}) (count_over_time({INFO}{r}))"
    terms = [
        f"count by ({BY}) (count_over_time({INFO}{r})) > 1",
        # every window of w seconds in [lo, hi] holds a sample of gpu_info
        f"count by ({BY}) (count_over_time(count_over_time({INFO}[{w}s])[{hi - lo - w}s:{step}s])"
        f" < scalar(count_over_time(vector(1)[{hi - lo - w}s:{step}s])))",
    ]
    for sel in selectors(metrics):
        terms.append(f"sum by ({BY}) (changes({sel}{r})) > 0")
    present = [m for m in PRESENCE if m in metrics]
    if present:
        # one selector for all (their labels differ): the lost device state and the others,
        # which have no state label
        sel = f'{{__name__=~"{"|".join(present)}",state=~"lost|"}}'
        terms.append(
            f"count by ({BY}) (count_over_time({sel}{r}) != on ({BY}) group_left () {seen})"
        )
    return terms


def busy_query(metrics: Sequence[str], lo: int, hi: int, max_gap: int) -> str | None:
    """``busy_terms`` as one query."""
    terms = busy_terms(metrics, lo, hi, max_gap)
    return None if terms is None else " or ".join(f"({t})" for t in terms)


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
    silence test cannot tell (``windows``). Its queries are asked side by side, over
    ``scope``'s series only (quota/promscope.py adds its matcher to every selector)."""
    terms = busy_terms(metrics, lo, hi, max_gap)
    if terms is None:
        return None
    r = f"[{hi - lo + 1}s]"
    asked = [
        # quiet: the same value throughout; gpu_info in [lo, hi] only, the others as at hi
        f"last_over_time({INFO}{{{GPU[1:]}}}{r})",
        f"max by ({BY},state) (gpu_health_state{{{GPU[1:]}}} == 1)",
        f'max by ({BY}) (gpu_device_state{{state="lost"{GPU}}} == 1)',
        *terms,
    ]
    with ThreadPoolExecutor(max_workers=SIDE_BY_SIDE) as pool:
        answers = list(pool.map(lambda q: _vector(base_url, q, hi, timeout, scope), asked))
    infos, states_said, lost_said = answers[:3]
    busy = sorted(
        {
            key
            for said in answers[3:]
            for key in map(_key, (item["metric"] for item in said))
            if key[0].startswith("GPU-")
        }
    )
    busy_uuids = {uuid for uuid, _, _ in busy}
    states = {_key(item["metric"]): item["metric"].get("state", "") for item in states_said}
    lost = {_key(item["metric"]) for item in lost_said}
    quiet = []
    for item in infos:
        key = _key(item["metric"])
        if key[0] not in busy_uuids:
            quiet.append(Quiet(item["metric"], states.get(key, "unknown"), key in lost))
    return busy, quiet
