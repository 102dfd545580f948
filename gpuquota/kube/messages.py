"""What the watch loops hand the controller loop, one type per meaning.

- :class:`Listed`: the objects of a kind, listed when resuming a watch from a stored version;
  facts only, nothing closes (the replayed watch events close what went away).
- :class:`Resync`: a full list and its resourceVersion; whatever is known but missing from it
  vanished while unwatched.
- :class:`Event`: one watch event (ADDED, MODIFIED, DELETED, or a real BOOKMARK).
- :class:`Synced`: every kind has been listed once; sent after the last initial list.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: importers (exporter/dra/slices.py) skip the client
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


@dataclass(frozen=True)
class Event:
    kind: str
    observed_at: int
    event_type: str
    obj: Obj


@dataclass(frozen=True)
class Synced:
    """Every kind has been listed once."""


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
