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
from typing import ClassVar

from quota.controller.kube import Obj

# The one-class message these replace had ``op``, ``items``, ``obj`` and ``event_type`` on
# every message; exporter/dra/slices.py still reads them (the exporter is another folder's
# work). The ``op`` tags and the None/"" properties below keep that reader working; remove them
# once it matches on the types like quota/controller/loop.py does.


class _NoItems:
    @property
    def items(self) -> list[Obj] | None:
        return None


class _NoObject:
    @property
    def obj(self) -> Obj | None:
        return None

    @property
    def event_type(self) -> str:
        return ""


@dataclass(frozen=True)
class Listed(_NoObject):
    kind: str
    observed_at: int
    items: list[Obj]
    op: ClassVar[str] = "list"


@dataclass(frozen=True)
class Resync(_NoObject):
    kind: str
    observed_at: int
    items: list[Obj]
    version: str  # the list's resourceVersion ("" if the server gave none)
    op: ClassVar[str] = "resync"


@dataclass(frozen=True)
class Event(_NoItems):
    kind: str
    observed_at: int
    event_type: str
    obj: Obj
    op: ClassVar[str] = "event"


@dataclass(frozen=True)
class Synced(_NoItems, _NoObject):
    op: ClassVar[str] = "synced"


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
