"""This node's ResourceSlices, indexed: which GPU or MIG UUID each DRA ``(driver, pool, device)`` is.

A DRA driver (NVIDIA's ``gpu.nvidia.com``) describes every device it can hand out in
resource.k8s.io ResourceSlices, with the device's UUID among its attributes. The kubelet's
pod-resources API only names ``(driver, pool, device)``, so the exporter keeps the node's
slices in a :class:`SliceIndex` to turn those names into the UUIDs its snapshots are keyed by.

:class:`SliceIndex` does no I/O: it takes whole lists and watch events (its lock lets the
watcher thread write while the pod-resources thread reads). Only the newest generation of each
pool counts, as in the scheduler: slices of an older generation are leftovers of a driver that
is republishing. A device without a string ``uuid`` attribute is a bad object: logged once,
counted, left out, except a MIG partition with ``parentUUID`` and ``profile`` (the driver's
dynamic MIG mode creates it on allocation, so its UUID is not known in advance: see
exporter/enrich/dra.py). exporter/enrich/slicewatcher.py feeds it from the API server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpuquota.kube.messages import Event, Listed, Message, Resync, Synced

log = logging.getLogger(__name__)

Obj = dict[str, Any]
DEFAULT_DRIVERS = frozenset({"gpu.nvidia.com"})
KIND = "ResourceSlice"
# gpuquota/kube/client.py's names for the slice API, newest first (same object shape)
KINDS = (KIND, "ResourceSlice.v1beta2")


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device a slice lists, with what the exporter needs from its attributes."""

    driver: str
    pool: str
    name: str
    uuid: str  # "" for a MIG partition created on allocation (see partition_key)
    type: str = ""  # NVIDIA's driver: "gpu" or "mig"
    parent_uuid: str | None = None  # MIG devices
    profile: str | None = None  # MIG devices, e.g. "1g.10gb"
    product_name: str | None = None
    slice_name: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


def _attribute(attrs: Any, driver: str, name: str) -> str | None:
    """A string attribute by its short or driver-qualified name (``uuid``, ``<driver>/uuid``)."""
    if not isinstance(attrs, dict):
        return None
    value = attrs.get(name, attrs.get(f"{driver}/{name}"))
    if isinstance(value, dict):
        text = value.get("string")
        return text if isinstance(text, str) and text else None
    return None


def slice_devices(obj: Obj, drivers: frozenset[str]) -> tuple[list[DraDevice], list[str]]:
    """The GPU devices of one slice object, and a message for each device left out."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = str(meta.get("name", "?"))
    driver = spec.get("driver")
    if driver not in drivers:
        return [], []  # another driver's devices (NICs, FPGAs...): not ours to resolve
    pool = (spec.get("pool") or {}).get("name")
    if not isinstance(pool, str) or not pool:
        return [], [f"ResourceSlice {name}: no spec.pool.name; its devices are ignored"]
    found: list[DraDevice] = []
    problems: list[str] = []
    for device in spec.get("devices") or []:
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            problems.append(f"ResourceSlice {name}: a device without a name is ignored")
            continue
        attrs = device.get("attributes")
        uuid = _attribute(attrs, driver, "uuid")
        parent = _attribute(attrs, driver, "parentUUID")
        profile = _attribute(attrs, driver, "profile")
        if uuid is None and parent and profile:
            uuid = ""  # a MIG partition the driver creates on allocation: no UUID before
        if uuid is None:
            problems.append(
                f"ResourceSlice {name}: device {device['name']} has no string 'uuid' "
                "attribute; pods holding it cannot be attributed"
            )
            continue
        found.append(
            DraDevice(
                driver=driver,
                pool=pool,
                name=device["name"],
                uuid=uuid,
                type=_attribute(attrs, driver, "type") or "",
                parent_uuid=parent,
                profile=profile,
                product_name=_attribute(attrs, driver, "productName"),
                slice_name=name,
            )
        )
    return found, problems


def _generation(obj: Obj) -> int:
    gen = ((obj.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return gen if isinstance(gen, int) else 0


def apply_message(index: SliceIndex, msg: Message) -> None:
    """One message of the shared WatchLoop (gpuquota/kube/messages.py) into the index."""
    match msg:
        case Resync(items=items):  # a full list: exactly these slices now
            index.replace_all(items)
        case Listed(items=items):  # facts only: the replayed events close what went away
            for obj in items:
                index.apply("MODIFIED", obj)
        case Event(event_type=event_type, obj=obj):
            index.apply(event_type, obj)
        case Synced():
            pass


class SliceIndex:
    """The node's slices by name, and the (driver, pool, device) -> device lookup over them."""

    def __init__(
        self,
        drivers: Iterable[str] = DEFAULT_DRIVERS,
        on_problem: Callable[[str, str], None] | None = None,
    ) -> None:
        self.drivers = frozenset(drivers)
        self.on_problem = on_problem or (lambda _reason, _message: None)
        self._lock = threading.Lock()
        self._slices: dict[str, Obj] = {}
        self._lookup: dict[tuple[str, str, str], DraDevice] = {}
        self._reported: set[str] = set()  # problems already logged (once each)
        self.synced = False

    def replace_all(self, items: Iterable[Obj]) -> None:
        """A full list: the slices are exactly these now."""
        with self._lock:
            self._slices = {str((o.get("metadata") or {}).get("name")): o for o in items}
            self._rebuild()
            self.synced = True

    def apply(self, event_type: str, obj: Obj) -> None:
        """One watch event (ADDED, MODIFIED, DELETED; BOOKMARK is ignored)."""
        name = str((obj.get("metadata") or {}).get("name"))
        with self._lock:
            if event_type == "DELETED":
                gone = self._slices.pop(name, None)
                if gone is not None and (gone.get("spec") or {}).get("driver") in self.drivers:
                    count = len((gone.get("spec") or {}).get("devices") or [])
                    log.info(
                        "ResourceSlice %s deleted: its %d device(s) no longer resolve", name, count
                    )
            elif event_type in ("ADDED", "MODIFIED"):
                self._slices[name] = obj
            else:
                return
            self._rebuild()

    def _rebuild(self) -> None:
        newest: dict[tuple[str, str], int] = {}
        for obj in self._slices.values():
            spec = obj.get("spec") or {}
            pool_key = (str(spec.get("driver")), str((spec.get("pool") or {}).get("name")))
            newest[pool_key] = max(newest.get(pool_key, 0), _generation(obj))
        lookup: dict[tuple[str, str, str], DraDevice] = {}
        problems: list[str] = []
        for obj in self._slices.values():
            spec = obj.get("spec") or {}
            pool_key = (str(spec.get("driver")), str((spec.get("pool") or {}).get("name")))
            if _generation(obj) < newest[pool_key]:
                continue
            devices, bad = slice_devices(obj, self.drivers)
            problems.extend(bad)
            for device in devices:
                lookup[device.key] = device
        self._lookup = lookup
        for message in problems:
            if message not in self._reported:
                self._reported.add(message)
                log.warning("%s", message)
                self.on_problem("bad_slice", message)

    def lookup(self, driver: str, pool: str, device: str) -> DraDevice | None:
        with self._lock:
            return self._lookup.get((driver, pool, device))

    def devices(self) -> list[DraDevice]:
        with self._lock:
            return sorted(self._lookup.values(), key=lambda d: d.key)
