"""The renderer renders a snapshot once, even when scrape-time views hand it a fresh (but
equal) NodeSnapshot per scrape, and renders again as soon as anything in it changes."""

from __future__ import annotations

import dataclasses

from exporter.render import Renderer
from exporter.snapshot import PodRef
from tests.exporter.factories import gpu, node


def test_an_equal_snapshot_reuses_the_rendered_bytes() -> None:
    renderer = Renderer()
    snapshot = node(gpu(0), gpu(1))
    first = renderer.exposition(snapshot)
    # what a view does on every scrape: a new NodeSnapshot with the same field values
    again = renderer.exposition(dataclasses.replace(snapshot))
    assert again is first


def test_a_changed_snapshot_is_rendered_again() -> None:
    renderer = Renderer()
    snapshot = node(gpu(0))
    first = renderer.exposition(snapshot)
    uuid = snapshot.devices[0].uuid
    changed = dataclasses.replace(snapshot, pods={uuid: (PodRef("ns", "p", "c"),)})
    second = renderer.exposition(changed)
    assert second is not first
    assert b'pod="p"' in second and b'pod="p"' not in first
