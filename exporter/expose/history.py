"""The node agent's own count of changes to what the fleet history reads, per GPU
(``gpu_history_changes_total``, issue 37). Pure: no I/O, no clock.

The fleet history (quota/fleet/) asks the time-series store which GPUs changed in a window.
Asking ``changes()`` of every series it reads costs the store a pass over every sample of
about two dozen series per GPU; asking it of one counter per GPU costs one. The counter is
made from the very values the agent renders: each rendering's series of the history rows
(metrics.HISTORY: name, labels and value as written) are a GPU's *fingerprint*, and the
count goes up by one whenever a GPU's fingerprint differs from the one of the rendering
before (a value changed, a series appeared or went). The count is rendered with the values
it was made from, so any two scrapes whose history series differ have different counts: a
GPU whose count did not change between two scrapes said the same in both (the count only
grows between renderings of one process). A restart begins again from zero, and the store
sees the agent's new start time; the fleet treats a restart as a change.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

LabelPairs = tuple[tuple[str, str], ...]
# one rendered history series of a GPU: (metric, labels, value as written)
Rendered = tuple[str, LabelPairs, str]
Fingerprint = tuple[Rendered, ...]


def fingerprints(rendered: Iterable[Rendered]) -> dict[str, Fingerprint]:
    """Each GPU's (its ``uuid`` label's) rendered history series, in a fixed order (the
    store sees a set of series, so the order they were written in is no change)."""
    by_uuid: dict[str, list[Rendered]] = {}
    for name, pairs, value in rendered:
        uuid = next((v for k, v in pairs if k == "uuid"), None)
        if uuid is not None:
            by_uuid.setdefault(uuid, []).append((name, pairs, value))
    return {uuid: tuple(sorted(series)) for uuid, series in by_uuid.items()}


class ChangeCounter:
    """The count per GPU over one agent's renderings, in the order they are made. A GPU
    seen for the first time starts at 0; one that goes from a rendering and comes back is
    compared with its last fingerprint (its counter series was missing meanwhile, which the
    store sees as well)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, Fingerprint] = {}
        self._counts: dict[str, int] = {}

    def update(self, prints: Mapping[str, Fingerprint]) -> dict[str, int]:
        """Take one rendering's fingerprints; the counts to render with it."""
        with self._lock:
            for uuid, fingerprint in prints.items():
                last = self._last.get(uuid)
                if last is None:
                    self._counts.setdefault(uuid, 0)
                elif last != fingerprint:
                    self._counts[uuid] += 1
                self._last[uuid] = fingerprint
            return {uuid: self._counts[uuid] for uuid in prints}
