"""A big range selector asked of Prometheus in pieces: every raw sample of some metrics in
[lo, hi], as answers of about ``max_samples`` samples each.

One answer for a window of a big cluster holds millions of samples: decoding it holds the
interpreter lock for seconds (the controller's other threads stall meanwhile) and takes
hundreds of MB. So a count comes first (``sum(count_over_time(...))`` per metric), then the samples in
shards of devices (by the last two characters of the ``uuid`` label) and, when that is not
enough, slices of time. Each piece is decoded straight into float pairs
(promhttp.matrix_query). Used by the usage ledger (quota/ledger/source.py) and the fleet
history (quota/fleet/source.py); each merges the pieces into what one query would give: a
series asked in several slices comes in several pieces, and a sample on the edge between
two slices comes twice (``sorted_unique`` drops the second).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from gpuquota.quota import promhttp
from gpuquota.quota.promhttp import MatrixSeries, PrometheusError
from gpuquota.quota.promscope import Scope

# samples per query (about 35 bytes of JSON each): decoding 5,000 holds the interpreter lock for
# a few milliseconds (up to 15 on a loaded 2-core machine)
MAX_SAMPLES_PER_QUERY = 5_000
SHARD_COUNTS = (1, 4, 16, 64, 256)
STEP = 15  # no slice is shorter than a usual scrape interval


def selector(metrics: Sequence[str], matchers: str = "") -> str:
    """The instant selector of ``metrics`` (and more ``,label=~"..."`` matchers)."""
    return f'{{__name__=~"{"|".join(metrics)}"{matchers}}}'


def shards(count: int) -> list[str]:
    """Matchers splitting the series by the device UUID's last two characters (hex, as
    NVIDIA's UUIDs are): ``count`` shards (1, 4, 16, 64 or 256) and one for the rest (other
    UUIDs, and series without one)."""
    if count <= 1:
        return [""]
    digits = "0123456789abcdef"

    def groups(n: int) -> list[str]:
        size = 16 // n
        return [
            f"[{digits[k * size : (k + 1) * size]}{digits[k * size : (k + 1) * size].upper()}]"
            for k in range(n)
        ]

    last = groups(min(count, 16))
    before = groups(count // 16) if count > 16 else ["[0-9a-fA-F]"]
    out = [f',uuid=~".*{b}{c}"' for b in before for c in last]
    out.append(',uuid!~".*[0-9a-fA-F][0-9a-fA-F]"')
    return out


def plan(
    total: float, lo: int, hi: int, max_samples: int, by_device: bool = True
) -> tuple[int, list[int]]:
    """How to ask for ``total`` samples in [lo, hi]: the number of device shards, and the
    edges of the time slices (``lo`` first, ``hi`` last). Devices first (a series asked in
    several slices repeats its labels in each), then time; time only without
    ``by_device``."""
    span = hi - lo
    pieces = max(1, math.ceil(total / max_samples))
    count = next((n for n in SHARD_COUNTS if pieces <= n), SHARD_COUNTS[-1]) if by_device else 1
    slices = min(max(1, math.ceil(pieces / count)), max(1, span // STEP))
    return count, [lo + (span * i) // slices for i in range(slices + 1)]


def count_query(metrics: Sequence[str], lo: int, hi: int, matchers: str = "") -> str:
    """The PromQL, evaluated at ``hi``, of how many samples of ``metrics`` are in [lo, hi]."""
    # one count per metric, added up: count_over_time drops the metric's name, so two
    # metrics with the same labels (gpu_row_remap_pending and _failure of one GPU) would be
    # one labelset twice in a single count, which Prometheus refuses (HTTP 422)
    return " + ".join(
        f"(sum(count_over_time({selector([m], matchers)}[{hi - lo + 1}s])) or vector(0))"
        for m in metrics
    )


def count_samples(
    base_url: str,
    metrics: Sequence[str],
    lo: int,
    hi: int,
    timeout: float,
    matchers: str = "",
    scope: Scope | None = None,
) -> float:
    """How many samples of ``metrics`` (with more ``matchers``, of ``scope``'s cluster)
    Prometheus holds in [lo, hi]."""
    promql = count_query(metrics, lo, hi, matchers)
    data = promhttp.instant_query(base_url, promql, hi, timeout, scope)
    try:
        return float(data["result"][0]["value"][1]) if data.get("result") else 0.0
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise PrometheusError(f"Prometheus at {base_url}: malformed count {data!r:.200}") from exc


def queries(
    metrics: Sequence[str],
    lo: int,
    hi: int,
    total: float,
    max_samples: int,
    matchers: str = "",
    by_device: bool = True,
) -> list[tuple[str, int]]:
    """The range selectors, each with the time to evaluate it at, that ask for the ``total``
    samples of ``metrics`` in [lo, hi] in pieces of about ``max_samples``: the shards one
    after the other, each shard's slices in time order (``plan``)."""
    count, edges = plan(total, lo, hi, max_samples, by_device)
    out = []
    for shard in shards(count):
        for i in range(len(edges) - 1):
            # the first slice reaches back to lo itself (a range excludes its start in
            # Prometheus 3; Prometheus 2 includes it, so a sample on an edge comes twice)
            length = edges[i + 1] - edges[i] + (1 if i == 0 else 0)
            out.append((f"{selector(metrics, matchers + shard)}[{length}s]", edges[i + 1]))
    return out


def pieces(
    base_url: str,
    metrics: Sequence[str],
    lo: int,
    hi: int,
    timeout: float,
    *,
    max_samples: int = MAX_SAMPLES_PER_QUERY,
    matchers: str = "",
    scope: Scope | None = None,
) -> Iterator[list[MatrixSeries]]:
    """Every raw sample of ``metrics`` in [lo, hi], as the series of answers of about
    ``max_samples`` samples each (``queries``); ``matchers`` (``,label=~"..."``) narrow them,
    and ``scope`` to one cluster's (quota/promscope.py). A series comes once per slice where
    it has samples, and one on a slice's edge may come in both slices."""
    total = count_samples(base_url, metrics, lo, hi, timeout, matchers, scope)
    if total <= 0:
        if scope:
            check_label(base_url, metrics, lo, hi, timeout, scope)
        return
    for promql, at in queries(metrics, lo, hi, total, max_samples, matchers):
        yield promhttp.matrix_query(base_url, promql, at, timeout, scope)


def check_label(
    base_url: str, metrics: Sequence[str], lo: int, hi: int, timeout: float, scope: Scope
) -> None:
    """PrometheusError when ``metrics`` have samples in [lo, hi] but none carries ``scope``'s
    label at all: the endpoint does not see it (a Prometheus' own external labels are put only
    on what leaves it), and every window would look empty. A cluster whose series are merely
    absent (no GPU ran) passes."""
    if count_samples(base_url, metrics, lo, hi, timeout, f',{scope.label}!=""'):
        return
    without = count_samples(base_url, metrics, lo, hi, timeout)
    if without:
        raise PrometheusError(
            f"Prometheus at {base_url}: no series of {', '.join(metrics)} carries the label "
            f"{scope.label!r} (--prometheus-cluster-label), though it holds {without:.0f} samples "
            "without it: an external label of that Prometheus itself is only put on what leaves "
            "it (ask the Thanos, Mimir or federating Prometheus that sees it), or the label is "
            "named otherwise there"
        )


def sorted_unique(samples: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``samples`` in time order, each time once (sorts in place): the pieces of one series,
    or of several series that are one."""
    samples.sort()
    return [s for i, s in enumerate(samples) if i == 0 or s[0] != samples[i - 1][0]]
