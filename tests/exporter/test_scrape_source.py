"""The scrape source (issue 20): what /metrics, /healthz and /readyz answer, without an HTTP
server: the collect loop's latest snapshot, the verdict of the moment, rendered bytes shared by
concurrent scrapes and rendered ahead for a steady scraper. Real collect loop, real NVML
stand-in, real renderer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from gpuquota.exporter.collect.loop import CollectLoop
from gpuquota.exporter.collect.nvml import NvmlApi
from gpuquota.exporter.expose.render import CONTENT_TYPE, Renderer
from gpuquota.exporter.expose.scrape import ScrapeSource
from gpuquota.exporter.health.publishing import PublisherStatus
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


def test_the_publishers_state_is_read_when_scraped_not_carried_by_a_snapshot(
    nvml_on: NvmlOn,
) -> None:
    """A kubelet restart unregisters the device plugin between two collections: the next scrape
    shows it, from the publishers' state, on the same snapshot (issue 20: no publisher writes
    into a snapshot)."""
    _node, api = nvml_on("h100x8")
    loop = CollectLoop(api, interval=1.0)
    source = ScrapeSource(loop, Renderer())
    try:
        snapshot = loop.collect_once()
        assert not {"device_plugin", "api_writers"} & {f.name for f in fields(snapshot)}
        registered = {"nvidia.com/gpu": True}
        source.set_publisher_source(lambda: PublisherStatus(device_plugin=dict(registered)))
        name = b"gpuquota_exporter_device_plugin_registered"
        assert name + b'{resource="nvidia.com/gpu"} 1\n' in asyncio.run(source.scrape(False))[2]
        assert source.readyz()[0] == 200
        registered["nvidia.com/gpu"] = False  # no new collection in between
        assert loop.latest() is snapshot
        assert name + b'{resource="nvidia.com/gpu"} 0\n' in asyncio.run(source.scrape(False))[2]
        # not ready while unregistered: a surge rollout keeps the agent it replaces till then
        status, _, body = source.readyz()
        assert status == 503 and b"device plugin not registered" in body, body
    finally:
        source.close()
