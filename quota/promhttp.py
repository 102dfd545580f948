"""The project's one Prometheus HTTP helper: GET an /api/v1 answer, or one line naming why not.

Used by ``gpuquota report --prometheus`` (quota/report/prometheus.py) and by the usage ledger's
ingestion (quota/ledger/source.py).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


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
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
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
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise PrometheusError(f"Prometheus at {base_url}: response is not JSON") from exc
    if not isinstance(doc, dict):
        raise PrometheusError(f"Prometheus at {base_url}: unexpected response {doc!r:.80}")
    return doc


def instant_query(base_url: str, promql: str, at: float, timeout: float) -> dict[str, Any]:
    """The ``data`` of a successful /api/v1/query of ``promql`` evaluated at unix time ``at``."""
    when = str(int(at)) if float(at).is_integer() else f"{at:.3f}"
    params = urllib.parse.urlencode({"query": promql, "time": when})
    body = get_json(f"{base_url.rstrip('/')}/api/v1/query?{params}", base_url, timeout)
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
