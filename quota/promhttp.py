"""The project's one Prometheus HTTP helper: GET an /api/v1 answer, or one line naming why not.

Used by ``gpuquota report --prometheus`` (quota/report/prometheus.py), the usage ledger's
ingestion (quota/ledger/source.py) and the fleet history (quota/fleet/source.py). A query asked
with a ``scope`` reads one cluster's series only (quota/promscope.py).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import msgspec

from gpuquota.quota.promscope import Scope, scoped


class PrometheusError(Exception):
    """Prometheus unreachable or the query failed: one line naming the problem.
    ``unavailable``: it did not answer (or answered 5xx), as opposed to a wrong answer."""

    def __init__(self, message: str, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


def check_url(base_url: str, flag: str = "--prometheus") -> str:
    """The URL if it is an http(s) URL with a host, else PrometheusError naming it."""
    parsed = urllib.parse.urlsplit(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PrometheusError(
            f"{flag}: {base_url!r} is not an http(s) URL like http://prometheus:9090"
        )
    return base_url


def get_json(url: str, base_url: str, timeout: float) -> dict[str, Any]:
    """The JSON object at ``url`` (a URL under ``base_url``, which messages name)."""
    return _json_object(get_body(url, base_url, timeout), base_url)


def _json_object(raw: bytes, base_url: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise PrometheusError(f"Prometheus at {base_url}: response is not JSON") from exc
    if not isinstance(doc, dict):
        raise PrometheusError(f"Prometheus at {base_url}: unexpected response {doc!r:.80}")
    return doc


def get_body(url: str, base_url: str, timeout: float) -> bytes:
    """The body of a successful GET of ``url`` (a URL under ``base_url``, which messages
    name)."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw: bytes = response.read()
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc.read())
        raise PrometheusError(
            f"Prometheus at {base_url}: HTTP {exc.code}: {detail}", unavailable=exc.code >= 500
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PrometheusError(
            f"cannot reach Prometheus at {base_url}: {reason}", unavailable=True
        ) from exc
    return raw


def _query_url(base_url: str, promql: str, at: float) -> str:
    when = str(int(at)) if float(at).is_integer() else f"{at:.3f}"
    params = urllib.parse.urlencode({"query": promql, "time": when})
    return f"{base_url.rstrip('/')}/api/v1/query?{params}"


def instant_query(
    base_url: str, promql: str, at: float, timeout: float, scope: Scope | None = None
) -> dict[str, Any]:
    """The ``data`` of a successful /api/v1/query of ``promql`` evaluated at unix time ``at``
    (over ``scope``'s series only, when given)."""
    url = _query_url(base_url, scoped(promql, scope), at)
    return _data(get_json(url, base_url, timeout), base_url)


def _data(body: dict[str, Any], base_url: str) -> dict[str, Any]:
    if body.get("status") != "success":
        raise PrometheusError(
            f"Prometheus at {base_url}: query failed: {body.get('error', body.get('status'))}"
        )
    data = body.get("data")
    if not isinstance(data, dict):
        raise PrometheusError(f"Prometheus at {base_url}: answer without data")
    return data


def _error_detail(raw: bytes) -> str:
    try:
        doc = json.loads(raw)
        return f"{doc.get('errorType', 'error')}: {doc.get('error', '')}".strip()
    except ValueError:
        return raw.decode(errors="replace").strip().splitlines()[0] if raw.strip() else "no body"


class MatrixSeries(msgspec.Struct):
    """One series of a range-vector answer: its labels and its (unix time, value) samples."""

    metric: dict[str, str]
    values: list[tuple[float, float]]


class _MatrixData(msgspec.Struct):
    resultType: str  # noqa: N815 (Prometheus' name)
    result: list[MatrixSeries]


class _MatrixAnswer(msgspec.Struct):
    status: str
    data: _MatrixData | None = None
    error: str | None = None


# Decodes an answer straight into float pairs in one pass in C (strict=False: Prometheus
# writes values as strings): a window of a big cluster has millions of samples, and the
# generic path (JSON objects, then float() of each string) costs four times the CPU.
_MATRIX = msgspec.json.Decoder(_MatrixAnswer, strict=False)


def matrix_query(
    base_url: str, promql: str, at: float, timeout: float, scope: Scope | None = None
) -> list[MatrixSeries]:
    """The series of a successful /api/v1/query of the range selector ``promql`` at ``at``
    (``scope``'s series only, when given)."""
    raw = get_body(_query_url(base_url, scoped(promql, scope), at), base_url, timeout)
    try:
        answer = _MATRIX.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        answer = None
    data = answer.data if answer is not None and answer.status == "success" else None
    if data is not None and data.resultType == "matrix":
        return data.result
    # anything else (an error, another shape, values the fast path does not take such as
    # "+Inf", not JSON at all): the generic path decodes it or names what is wrong
    return _matrix_of(_data(_json_object(raw, base_url), base_url), base_url)


def _matrix_of(data: dict[str, Any], base_url: str) -> list[MatrixSeries]:
    """A decoded ``data`` of a range-vector answer as :class:`MatrixSeries`, or
    PrometheusError naming the first thing wrong."""
    if data.get("resultType") != "matrix":
        raise PrometheusError(
            f"Prometheus at {base_url}: expected a matrix result, got {data.get('resultType')!r}"
        )
    out = []
    for item in data.get("result") or []:
        try:
            labels, values = item["metric"], item["values"]
            if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
            ):
                raise TypeError("labels")
            out.append(MatrixSeries(labels, [(float(t), float(v)) for t, v in values]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PrometheusError(
                f"Prometheus at {base_url}: malformed series {item!r:.200}"
            ) from exc
    return out
