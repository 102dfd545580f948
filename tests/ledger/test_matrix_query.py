"""promhttp.matrix_query: Prometheus' range-vector answers decoded straight into float pairs,
and every answer the fast path does not take decoded or refused with a message naming it."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuquota.quota.promhttp import MatrixSeries, PrometheusError, matrix_query


@pytest.fixture
def answer() -> Iterator[tuple[str, list[bytes]]]:
    """A server that answers every GET with the next body put in the list (status 200)."""
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies.pop(0)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()


def _matrix(*values: list[object]) -> bytes:
    result = [{"metric": {"__name__": "m", "uuid": f"GPU-{i}"}, "values": v}
              for i, v in enumerate(values)]  # fmt: skip
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": result}}
    ).encode()


def test_values_come_as_float_pairs(answer: tuple[str, list[bytes]]) -> None:
    url, bodies = answer
    bodies.append(_matrix([[100, "1.5"], [115.25, "3"], [130, "NaN"]]))
    (series,) = matrix_query(url, "m[30s]", 130, 5)
    assert series.metric == {"__name__": "m", "uuid": "GPU-0"}
    assert series.values[:2] == [(100.0, 1.5), (115.25, 3.0)]
    assert math.isnan(series.values[2][1])


def test_infinities_take_the_generic_path(answer: tuple[str, list[bytes]]) -> None:
    url, bodies = answer
    bodies.append(_matrix([[100, "1"]], [[100, "+Inf"], [115, "-Inf"], [130, "2"]]))
    got = matrix_query(url, "m[30s]", 130, 5)
    assert got[0] == MatrixSeries({"__name__": "m", "uuid": "GPU-0"}, [(100.0, 1.0)])
    assert got[1].values == [(100.0, math.inf), (115.0, -math.inf), (130.0, 2.0)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>proxy error</html>", "response is not JSON"),
        (b'{"status": "error", "error": "query timed out"}', "query failed: query timed out"),
        (b'{"status": "success"}', "answer without data"),
        (b'{"status": "success", "data": {"resultType": "vector", "result": []}}',
         "expected a matrix result, got 'vector'"),
        (_matrix([[100, "one"]]), "malformed series"),
        (_matrix([[100]]), "malformed series"),
        (b'{"status": "success", "data": {"resultType": "matrix", "result": [{"values": []}]}}',
         "malformed series"),
    ],
)  # fmt: skip
def test_bad_answers_are_named(answer: tuple[str, list[bytes]], body: bytes, message: str) -> None:
    url, bodies = answer
    bodies.append(body)
    with pytest.raises(PrometheusError, match=message) as caught:
        matrix_query(url, "m[30s]", 130, 5)
    assert url in str(caught.value)
