"""What the watch loops hand the controller loop, one type per meaning.

- :class:`Listed`: the objects of a kind, listed when resuming a watch from a stored version;
  facts only, nothing closes (the replayed watch events close what went away).
- :class:`Resync`: a full list and its resourceVersion; whatever is known but missing from it
  vanished while unwatched. ``gap_from`` (unix seconds) is set when the kind was not followed
  from then until the list (a 410 Gone, or a first list after a restart): a gap in the record.
- :class:`Event`: one watch event (ADDED, MODIFIED, DELETED, or a BOOKMARK: a real one, or one
  carrying only the version of events the loop ignored).
- :class:`Synced`: every kind is current (listed, or its resumed watch proven); sent once.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: importers (exporter/enrich/slicewatcher.py) skip the client
    from gpuquota.kube.client import Obj


@dataclass(frozen=True)
class Listed:
    kind: str
    observed_at: int
    items: list[Obj]


@dataclass(frozen=True)
class Resync:
    kind: str
    observed_at: int
    items: list[Obj]
    version: str  # the list's resourceVersion ("" if the server gave none)
    gap_from: int | None = None  # not followed since then: nothing known in between


@dataclass(frozen=True)
class Event:
    kind: str
    observed_at: int
    event_type: str
    obj: Obj


@dataclass(frozen=True)
class Synced:
    """Every kind is current (listed, or its resumed watch proven)."""


Message = Listed | Resync | Event | Synced


def put(out: queue.Queue[Message], msg: Message, stop: threading.Event) -> bool:
    """Put ``msg``, waiting while the queue is full; False if stopped meanwhile."""
    while not stop.is_set():
        try:
            out.put(msg, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False
