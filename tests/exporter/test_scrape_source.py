"""The scrape source (issue 20): what /metrics, /healthz and /readyz answer, without an HTTP
server: the collect loop's latest snapshot, the verdict of the moment, rendered bytes shared by
concurrent scrapes and rendered ahead for a steady scraper. Real collect loop, real NVML
stand-in, real renderer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gpuquota.exporter.collect.loop import CollectLoop
from gpuquota.exporter.collect.nvml import NvmlApi
from gpuquota.exporter.expose.render import CONTENT_TYPE, Renderer
from gpuquota.exporter.expose.scrape import ScrapeSource
from gpuquota.exporter.health.verdict import NodeHealth
from gpuquota.sim.nvml.control import SimNode

NvmlOn = Callable[[Any], tuple[SimNode, NvmlApi]]


def test_the_source_answers_from_the_latest_snapshot_and_verdict(nvml_on: NvmlOn) -> None:
    _node, api = nvml_on("h100x8")
    loop = CollectLoop(api, interval=1.0)
    renderer = Renderer()
    source = ScrapeSource(loop, renderer)
    try:
        assert source.metrics()[0] == 503 and source.readyz()[0] == 503  # nothing collected
        assert source.healthz()[0] == 503  # the collect thread is not running
        first = loop.collect_once()
        asked: list[int] = []

        def verdict() -> NodeHealth | None:
            asked.append(1)
            return None

        source.set_verdict_source(verdict)

        async def scrapes() -> list[tuple[int, str, bytes]]:
            return list(await asyncio.gather(*(source.scrape(False) for _ in range(5))))

        answers = asyncio.run(scrapes())
        assert {(status, kind) for status, kind, _ in answers} == {(200, CONTENT_TYPE)}
        assert len({id(body) for _, _, body in answers}) == 1  # one render, shared
        assert b"gpu_info{" in answers[0][2] and asked  # the verdict of the moment was asked
        assert source.readyz()[0] == 200
        # a plain scrape since the last snapshot: the next one is rendered ahead, in the
        # collect thread, before anyone scrapes it (and gzip, never asked for, is not)
        second = loop.collect_once()
        assert second is not first
        assert renderer.peek(second) is not None
        assert renderer.peek(second, gzipped=True) is None
    finally:
        source.close()
