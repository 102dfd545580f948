"""Reading the exporter's HTTP answers in tests: GET a route, parse the exposition."""

from __future__ import annotations

import http.client
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuquota.exporter.expose.server import ExporterServer


def get(
    server: ExporterServer, path: str, headers: dict[str, str] | None = None, **kw: Any
) -> tuple[int, bytes, http.client.HTTPResponse]:
    host, port = server.address
    if server.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=5, context=kw.get("context")
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read(), response
    finally:
        conn.close()


def parse(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    """metric sample name -> [(labels, value)] via prometheus_client's own parser.

    TYPE lines are dropped first: the parser renames counters without ``_total`` (dcgm's).
    """
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    lines = [line for line in text.decode().splitlines() if not line.startswith("# TYPE")]
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(samples: dict, name: str, _exact: bool = False, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels`` (or equal them)."""
    matches = [
        v
        for lbl, v in samples.get(name, [])
        if (lbl == labels if _exact else labels.items() <= lbl.items())
    ]
    assert len(matches) == 1, f"{name}{labels}: {matches}"
    return matches[0]
