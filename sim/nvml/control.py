"""Python control of the NVML stand-in: create a simulated node, change it, inject faults.

    node = SimNode.create(Path("/tmp/x/node.state"), "h100x8")
    subprocess.run([...], env={**os.environ, **node.env()})  # or node.preload() in-process
    node.set(0, power_watts=350.0, gpu_utilization_ratio=0.9)
    node.inject_xid(3, 79)

The state lives in a file that the library (built by gpuquota.sim.nvml.build) maps in every process;
a change made here is visible to every NVML caller at once. This module never describes the
file's layout itself: it calls the gqsim_* functions the same library exports, naming fields
by the names in gqsim_state.h.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuquota.sim.nvml import build
from gpuquota.sim.nvml.costs import MAX_FIELD_ID, MODES, QUEUEING, CallCost
from gpuquota.sim.nvml.spec import NodeSpec, load

NVML_SUCCESS = 0
_KINDS = {"compute": 0, "graphics": 1}
_NONE = 0xFFFFFFFF
# Fields the library derives or owns; set() refuses them (energy_joules is the way in).
_INTERNAL = {"energy_base_mj", "energy_base_ns"}
_RATIOS = {
    "gpu_utilization_ratio",
    "memory_utilization_ratio",
    "encoder_utilization_ratio",
    "decoder_utilization_ratio",
    "fan_speed_ratio",
}
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB,
              0x1B, 0x2C, 0x3C, 0x5F, 0x9C, 0xAD, 0xBC, 0xDD)  # fmt: skip


class SimError(RuntimeError):
    """The state file could not be created, opened or changed."""


def library_path() -> Path:
    """The stand-in library: $GPUQUOTA_SIM_LIB, else build/sim/libnvidia-ml.so.1."""
    return Path(os.environ.get("GPUQUOTA_SIM_LIB", build.DEFAULT_OUT)).resolve()


def _load_library(path: Path) -> ctypes.CDLL:
    if not path.is_file():
        raise SimError(
            f"NVML stand-in not built at {path}: run `make build/sim/libnvidia-ml.so.1` "
            "or `python -m gpuquota.sim.nvml.build`"
        )
    lib = ctypes.CDLL(str(path), use_errno=True)
    vp, cp, ci, cu, cd = (
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_double,
    )
    ull = ctypes.c_ulonglong
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "gqsim_create": (vp, [cp]),
        "gqsim_attach": (vp, [cp]),
        "gqsim_detach": (None, [vp]),
        "gqsim_max_gpus": (ci, []),
        "gqsim_num_field": (ci, [cp]),
        "gqsim_str_field": (ci, [cp]),
        "gqsim_num_field_name": (cp, [ci]),
        "gqsim_set_system": (ci, [vp, cp, cp, ci]),
        "gqsim_set_gpu_count": (ci, [vp, ci]),
        "gqsim_gpu_count": (ci, [vp]),
        "gqsim_set_num": (ci, [vp, ci, ci, cd]),
        "gqsim_get_num": (cd, [vp, ci, ci]),
        "gqsim_set_energy": (ci, [vp, ci, cd]),
        "gqsim_energy_mj": (cd, [vp, ci]),
        "gqsim_set_str": (ci, [vp, ci, ci, cp]),
        "gqsim_get_str": (cp, [vp, ci, ci]),
        "gqsim_add_profile": (ci, [vp, ci, cp, cu, cu, cu, cu, cu, cu, cu, cu, ull]),
        "gqsim_add_mig": (ci, [vp, ci, cp, cu, cu, cu, cu]),
        "gqsim_set_mig_memory_used": (ci, [vp, ci, ci, cd]),
        "gqsim_mig_count": (ci, [vp, ci]),
        "gqsim_mig_uuid": (cp, [vp, ci, ci]),
        "gqsim_add_process": (ci, [vp, ci, cu, ull, cu, cu, cu]),
        "gqsim_clear_processes": (ci, [vp, ci]),
        "gqsim_set_nvlink": (ci, [vp, ci, ci, ci, ull, ull, ull, ull]),
        "gqsim_fail_call": (ci, [vp, ci, cp, ci]),
        "gqsim_inject_xid": (ctypes.c_longlong, [vp, ci, ull, cu, cu]),
        "gqsim_gpm_metric": (ci, [cp]),
        "gqsim_gpm_metric_name": (cp, [ci]),
        "gqsim_set_gpm": (ci, [vp, ci, ci, ci, cd]),
        "gqsim_get_gpm": (cd, [vp, ci, ci, ci]),
        "gqsim_set_process_utilization": (ci, [vp, ci, cu, cu, cu, cu, cu]),
        "gqsim_clear_process_utilization": (ci, [vp, ci]),
        "gqsim_costs_reset": (ci, [vp, cu, cu, cd]),
        "gqsim_costs_mode": (ci, [vp, cu, cu]),
        "gqsim_set_cost": (ci, [vp, ci, cp, cd, cu]),
        "gqsim_set_field_cost": (ci, [vp, ci, cd]),
        "gqsim_counter": (cd, [vp, ci, cp]),
        "gqsim_set_counter": (ci, [vp, ci, cp, cd]),
        "gqsim_reason_counter_name": (cp, [ci]),
        "gqsim_call_count": (ull, [vp, cp]),
        "gqsim_charged_ns": (ull, [vp, ci]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def _os_error(what: str, path: Path) -> SimError:
    code = ctypes.get_errno()
    reason = "not a state file of this version" if code == errno.EPROTO else os.strerror(code)
    return SimError(f"{what} {path}: {reason}")


class SimNode:
    """One simulated GPU node, backed by a state file shared with every NVML caller."""

    def __init__(self, path: Path, lib: ctypes.CDLL, state: int, lib_path: Path) -> None:
        self.path = path
        self._lib = lib
        self._state = state
        self._lib_path = lib_path

    # -- life cycle ---------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path | str, spec: str | Mapping[str, Any]) -> SimNode:
        """Writes a fresh state file for `spec` (preset name, YAML, mapping; see spec.py).

        The file is built aside and renamed into place, so a process that opens `path`
        meanwhile sees either the old node or the complete new one.
        """
        node_spec = load(spec)
        path = Path(path).resolve()
        lib_path = library_path()
        lib = _load_library(lib_path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        state = lib.gqsim_create(os.fsencode(tmp))
        if not state:
            raise _os_error("cannot create state file", tmp)
        node = cls(path, lib, state, lib_path)
        try:
            node._populate(node_spec)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            node.close()
            raise
        return node

    @classmethod
    def attach(cls, path: Path | str) -> SimNode:
        """Opens an existing state file (made by create, maybe in another process)."""
        path = Path(path).resolve()
        lib_path = library_path()
        lib = _load_library(lib_path)
        state = lib.gqsim_attach(os.fsencode(path))
        if not state:
            raise _os_error("cannot open state file", path)
        return cls(path, lib, state, lib_path)

    def close(self) -> None:
        """Unmaps the state; the file (and the node) stays for other processes."""
        if self._state:
            self._lib.gqsim_detach(self._state)
            self._state = 0

    def __enter__(self) -> SimNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def env(self) -> dict[str, str]:
        """LD_LIBRARY_PATH and GPUQUOTA_SIM_STATE for a subprocess (merge into os.environ)."""
        ld = [str(self._lib_path.parent)]
        if os.environ.get("LD_LIBRARY_PATH"):
            ld.append(os.environ["LD_LIBRARY_PATH"])
        return {"LD_LIBRARY_PATH": ":".join(ld), "GPUQUOTA_SIM_STATE": str(self.path)}

    def preload(self) -> None:
        """Makes this process's NVML the stand-in, on this node. Call before nvmlInit.

        The library is loaded by absolute path, so pynvml's CDLL("libnvidia-ml.so.1") finds
        it by its soname. A process that switches nodes must nvmlShutdown first.
        """
        ctypes.CDLL(str(self._lib_path), mode=ctypes.RTLD_GLOBAL)
        os.environ["GPUQUOTA_SIM_STATE"] = str(self.path)

    # -- reading ------------------------------------------------------------------------

    @property
    def gpu_count(self) -> int:
        return int(self._lib.gqsim_gpu_count(self._ptr()))

    def uuid(self, i: int) -> str:
        return self._get_str(i, "uuid")

    def serial(self, i: int) -> str:
        return self._get_str(i, "serial")

    def mig_uuids(self, i: int) -> list[str]:
        self._check_gpu(i)
        n = self._lib.gqsim_mig_count(self._ptr(), i)
        return [self._lib.gqsim_mig_uuid(self._ptr(), i, m).decode() for m in range(n)]

    def get(self, i: int, name: str) -> float:
        """The stored value of numeric field `name` on GPU `i` (see fields())."""
        self._check_gpu(i)
        if name == "energy_joules":
            return float(self._lib.gqsim_energy_mj(self._ptr(), i)) / 1000.0
        return float(self._lib.gqsim_get_num(self._ptr(), i, self._num_field(name)))

    def fields(self) -> list[str]:
        """Every keyword set() accepts for numbers (strings: name, serial, vbios_version...)."""
        out = ["energy_joules"]
        n = 0
        while (raw := self._lib.gqsim_num_field_name(n)) is not None:
            if raw.decode() not in _INTERNAL:
                out.append(raw.decode())
            n += 1
        return out

    # -- changing -----------------------------------------------------------------------

    def set(self, i: int, **values: Any) -> None:
        """Sets fields of GPU `i`; names as in exporter/snapshot.py DeviceSnapshot.

        Ratios are 0-1, memory in bytes, clocks in hertz, power in watts, temperatures in
        Celsius, as in the snapshot; the library converts to NVML's units. energy_joules
        restarts the energy counter there; changing power_watts keeps it continuous.
        """
        self._check_gpu(i)
        for name, value in values.items():
            if name in {"name", "serial", "vbios_version", "board_part_number", "uuid"}:
                self._set_str(i, name, str(value))
                continue
            if isinstance(value, bool):
                value = 1.0 if value else 0.0
            if not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, not {value!r}")
            if name == "energy_joules":
                if value < 0:
                    raise ValueError("energy_joules must be >= 0")
                self._lib.gqsim_set_energy(self._ptr(), i, float(value))
                continue
            if name in _RATIOS and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is a ratio between 0 and 1, not {value!r}")
            if value < 0 and name != "nvlink_group":
                raise ValueError(f"{name} must be >= 0, not {value!r}")
            self._lib.gqsim_set_num(self._ptr(), i, self._num_field(name), float(value))

    def set_mig_memory_used(self, i: int, mig: int, used_bytes: int) -> None:
        self._check_gpu(i)
        if self._lib.gqsim_set_mig_memory_used(self._ptr(), i, mig, float(used_bytes)) != 0:
            raise ValueError(f"GPU {i} has no MIG instance {mig}")

    def add_process(
        self,
        i: int,
        pid: int,
        used_memory_bytes: int,
        kind: str = "compute",
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        """Adds (or updates) a process using GPU `i`, optionally on one MIG instance."""
        self._check_gpu(i)
        if kind not in _KINDS:
            raise ValueError(f"kind must be 'compute' or 'graphics', not {kind!r}")
        gi = _NONE if gpu_instance_id is None else gpu_instance_id
        ci = _NONE if compute_instance_id is None else compute_instance_id
        rc = self._lib.gqsim_add_process(
            self._ptr(), i, pid, used_memory_bytes, _KINDS[kind], gi, ci
        )
        if rc != 0:
            raise SimError(f"GPU {i}: process table full")

    def clear_processes(self, i: int) -> None:
        """Removes every process of GPU `i` (and their utilisation samples)."""
        self._check_gpu(i)
        self._lib.gqsim_clear_processes(self._ptr(), i)
        self._lib.gqsim_clear_process_utilization(self._ptr(), i)

    # -- profiling (GPM) and per-process utilisation -----------------------------------

    def gpm_metrics(self) -> list[str]:
        """Every GPM keyword set_gpm() accepts (ratios 0-1 and *_bytes_per_second)."""
        out: list[str] = []
        while (raw := self._lib.gqsim_gpm_metric_name(len(out))) is not None:
            out.append(raw.decode())
        return out

    def set_gpm(self, i: int, mig: int | None = None, **values: float) -> None:
        """Sets GPM rates of GPU `i`, or of its MIG instance at position `mig`.

        GPM samples hold running totals of these rates, so nvmlGpmMetricsGet returns their
        average between two samples (in percent and MiB/s, as NVML does). Only Hopper and
        later GPUs (compute capability 9+) answer GPM calls; on older ones the values are
        kept but never read.
        """
        self._check_gpu(i)
        unit = 0
        if mig is not None:
            count = len(self.mig_uuids(i))
            if not isinstance(mig, int) or not 0 <= mig < count:
                raise ValueError(f"GPU {i} has no MIG instance {mig!r} ({count} instances)")
            unit = 1 + mig
        for name, value in values.items():
            metric = int(self._lib.gqsim_gpm_metric(name.encode()))
            if metric < 0:
                raise ValueError(
                    f"unknown GPM metric {name!r}; known: {', '.join(self.gpm_metrics())}"
                )
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, not {value!r}")
            if not name.endswith("_bytes_per_second") and value > 1.0:
                raise ValueError(f"{name} is a ratio between 0 and 1, not {value!r}")
            self._lib.gqsim_set_gpm(self._ptr(), i, unit, metric, float(value))

    def get_gpm(self, i: int, name: str, mig: int | None = None) -> float:
        self._check_gpu(i)
        metric = int(self._lib.gqsim_gpm_metric(name.encode()))
        if metric < 0:
            raise ValueError(f"unknown GPM metric {name!r}")
        return float(self._lib.gqsim_get_gpm(self._ptr(), i, 0 if mig is None else 1 + mig, metric))

    def set_process_utilization(
        self, i: int, pid: int, sm: float, memory: float, encoder: float = 0.0,
        decoder: float = 0.0,
    ) -> None:  # fmt: skip
        """What nvmlDeviceGetProcessUtilization reports for `pid` on GPU `i` (ratios 0-1,
        NVML reports whole percent). All zero: the process is idle and gets no sample."""
        self._check_gpu(i)
        percents = []
        for name, value in (
            ("sm", sm),
            ("memory", memory),
            ("encoder", encoder),
            ("decoder", decoder),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise ValueError(f"{name} utilisation is a ratio between 0 and 1, not {value!r}")
            percents.append(round(value * 100))
        if pid <= 0:
            raise ValueError(f"pid must be > 0, not {pid}")
        if self._lib.gqsim_set_process_utilization(self._ptr(), i, pid, *percents) != 0:
            raise SimError(f"GPU {i}: process utilisation table full")

    def inject_xid(
        self,
        i: int,
        xid: int,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        """Raises an XID critical error event on GPU `i` for every waiting event set."""
        self._check_gpu(i)
        if xid < 0:
            raise ValueError(f"XID must be >= 0, not {xid}")
        gi = _NONE if gpu_instance_id is None else gpu_instance_id
        ci = _NONE if compute_instance_id is None else compute_instance_id
        self._lib.gqsim_inject_xid(self._ptr(), i, xid, gi, ci)

    def set_lost(self, i: int, lost: bool = True) -> None:
        """Every call on GPU `i` returns NVML_ERROR_GPU_IS_LOST (fell off the bus)."""
        self.set(i, lost=lost)

    def set_reset_required(self, i: int, required: bool = True) -> None:
        """Calls beyond identity queries on GPU `i` return NVML_ERROR_RESET_REQUIRED."""
        self.set(i, reset_required=required)

    def set_nvlink_errors(
        self, i: int, link: int, replay: int = 0, recovery: int = 0, crc_flit: int = 0,
        crc_data: int = 0, active: bool | None = None,
    ) -> None:  # fmt: skip
        """Sets the error counters of one NVLink (and optionally its state)."""
        self._check_gpu(i)
        links = int(self.get(i, "nvlink_count"))
        if not 0 <= link < links:
            raise ValueError(f"GPU {i} has no NVLink {link} ({links} links)")
        if active is None:
            active = self._link_active(i, link)
        self._lib.gqsim_set_nvlink(
            self._ptr(), i, link, int(active), replay, recovery, crc_flit, crc_data
        )

    def fail_call(self, i: int | None, function: str, code: int | None) -> None:
        """Forces NVML `function` to return `code` on GPU `i` (None: system functions such
        as nvmlSystemGetDriverVersion or nvmlInit); code None or 0 clears it."""
        if i is not None:
            self._check_gpu(i)
        if not function.startswith("nvml"):
            raise ValueError(f"not an NVML function name: {function!r}")
        rc = self._lib.gqsim_fail_call(
            self._ptr(), -1 if i is None else i, function.encode(), int(code or 0)
        )
        if rc != 0:
            raise SimError(f"cannot force {function}: failure table full or name too long")

    # -- costs and wall-time counters (sim/nvml/costs.py) ----------------------------------

    def set_costs(self, mode: str | None = None, queueing: str | None = None) -> None:
        """Switches the cost model: mode modelled/instant/default, queueing gpu/library
        (None keeps what the node has)."""
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if queueing is not None and queueing not in QUEUEING:
            raise ValueError(f"queueing must be gpu or library, not {queueing!r}")
        self._lib.gqsim_costs_mode(
            self._ptr(),
            _NONE if mode is None else MODES[mode],
            _NONE if queueing is None else QUEUEING[queueing],
        )

    def set_call_cost(
        self, i: int | None, function: str, ms: float, *, overlap: bool = False
    ) -> None:
        """NVML `function` takes `ms` milliseconds on GPU `i` (None: every GPU) from now on;
        e.g. 30000 to simulate a call that hangs."""
        if i is not None:
            self._check_gpu(i)
        if not function.startswith("nvml") or ms < 0:
            raise ValueError(f"need an NVML function name and ms >= 0, not {function!r}, {ms!r}")
        self._set_cost(-1 if i is None else i, function, CallCost(float(ms), overlap))

    def call_count(self, function: str) -> int:
        """How often `function` (a name in the cost table) was called with costs modelled,
        by every process on this node: benchmarks count another program's rounds with it."""
        return int(self._lib.gqsim_call_count(self._ptr(), function.encode()))

    def charged_ms(self, i: int | None = None) -> float:
        """Milliseconds of modelled NVML time charged so far to GPU `i` (None: every GPU and
        the calls on no GPU), by every process on this node: the sum of the cost table's
        times of the calls made with costs modelled, whatever the wall clock did. The
        difference across a collection round is that round's NVML work, the same on a busy
        machine as on an idle one."""
        if i is not None:
            self._check_gpu(i)
        return int(self._lib.gqsim_charged_ns(self._ptr(), -1 if i is None else i)) / 1e6

    def counter(self, i: int, name: str) -> float:
        """A wall-time counter of GPU `i`: pcie_tx_bytes, pcie_rx_bytes, or nanoseconds
        throttled for a reason in counter_names() (sw_power_cap, ...)."""
        self._check_gpu(i)
        value = float(self._lib.gqsim_counter(self._ptr(), i, name.encode()))
        if value < 0:
            raise ValueError(f"unknown counter {name!r}; known: {', '.join(self.counter_names())}")
        return value

    def set_counter(self, i: int, name: str, value: float) -> None:
        """Restarts a counter at `value`; it then runs on with its rate (PCIe bytes/s, or
        wall time while clock_event_reasons has the reason's bit)."""
        self._check_gpu(i)
        if value < 0 or self._lib.gqsim_set_counter(self._ptr(), i, name.encode(), value) != 0:
            raise ValueError(f"cannot set counter {name!r} to {value!r}")

    def counter_names(self) -> list[str]:
        names = ["pcie_tx_bytes", "pcie_rx_bytes"]
        n = 0
        while (raw := self._lib.gqsim_reason_counter_name(n)) is not None:
            names.append(raw.decode())
            n += 1
        return names

    def _set_cost(self, gpu: int, function: str, cost: CallCost) -> None:
        rc = self._lib.gqsim_set_cost(
            self._ptr(), gpu, function.encode(), cost.ms * 1000.0, int(cost.overlap)
        )
        if rc != 0:
            raise SimError(f"cannot set the cost of {function}: cost table full")

    def _apply_costs(self, spec: NodeSpec) -> None:
        costs = spec.costs
        ptr = self._ptr()
        self._lib.gqsim_costs_reset(
            ptr, MODES[costs.mode], QUEUEING[costs.queueing], costs.default_ms * 1000.0
        )
        for fid in range(MAX_FIELD_ID):
            ms = costs.fields.get(fid, costs.field_default_ms)
            self._lib.gqsim_set_field_cost(ptr, fid, ms * 1000.0)
        for function, cost in costs.calls.items():
            self._set_cost(-1, function, cost)
        for g in spec.gpus:
            for function, cost in g.call_costs.items():
                self._set_cost(g.index, function, cost)

    # -- internals ----------------------------------------------------------------------

    def _ptr(self) -> int:
        if not self._state:
            raise SimError(f"SimNode for {self.path} is closed")
        return self._state

    def _check_gpu(self, i: int) -> None:
        count = self.gpu_count
        if not isinstance(i, int) or not 0 <= i < count:
            raise ValueError(f"no GPU {i!r} on this node ({count} GPUs)")

    def _num_field(self, name: str) -> int:
        fid = int(self._lib.gqsim_num_field(name.encode()))
        if fid < 0 or name in _INTERNAL:
            raise ValueError(f"unknown simulated field {name!r}; see SimNode.fields()")
        return fid

    def _set_str(self, i: int, name: str, value: str) -> None:
        fid = int(self._lib.gqsim_str_field(name.encode()))
        if fid < 0:
            raise ValueError(f"unknown simulated string field {name!r}")
        if self._lib.gqsim_set_str(self._ptr(), i, fid, value.encode()) != 0:
            raise ValueError(f"{name} too long: {value!r}")

    def _get_str(self, i: int, name: str) -> str:
        self._check_gpu(i)
        raw = self._lib.gqsim_get_str(self._ptr(), i, self._lib.gqsim_str_field(name.encode()))
        return bytes(raw or b"").decode()

    def _link_active(self, i: int, link: int) -> bool:
        return self.get(i, "nvlink_group") >= 0

    def _populate(self, spec: NodeSpec) -> None:
        ptr = self._ptr()
        lib = self._lib
        lib.gqsim_set_system(
            ptr, spec.driver_version.encode(), spec.nvml_version.encode(), spec.cuda_driver_version
        )
        n = len(spec.gpus)
        lib.gqsim_set_gpu_count(ptr, n)
        self._apply_costs(spec)
        for g in spec.gpus:
            m = g.model
            i = g.index
            self._set_str(i, "name", m.name)
            self._set_str(i, "uuid", g.uuid)
            self._set_str(i, "serial", g.serial)
            self._set_str(i, "vbios_version", m.vbios_version)
            self._set_str(i, "board_part_number", m.board_part_number)
            for p in m.mig_profiles:
                lib.gqsim_add_profile(
                    ptr, i, p.name.encode(), p.profile_index, p.profile_id, p.slices,
                    p.max_instances, p.multiprocessors, p.copy_engines, p.decoders,
                    p.encoders, p.memory_mb,
                )  # fmt: skip
            for mig in g.mig:
                lib.gqsim_add_mig(
                    ptr, i, mig.uuid.encode(), mig.profile.profile_index, mig.gpu_instance_id,
                    mig.compute_instance_id, mig.placement_start,
                )  # fmt: skip
            mhz = 1e6
            self.set(
                i,
                memory_total_bytes=m.memory_total_bytes,
                memory_used_bytes=m.memory_reserved_bytes,
                memory_reserved_bytes=m.memory_reserved_bytes,
                gpu_temperature_celsius=34.0,
                memory_temperature_celsius=40.0 if m.memory_temperature else 0.0,
                power_watts=m.idle_power_watts,
                power_limit_watts=m.power_limit_watts,
                sm_clock_hertz=m.max_sm_clock_mhz * mhz,
                graphics_clock_hertz=m.max_sm_clock_mhz * mhz,
                max_sm_clock_hertz=m.max_sm_clock_mhz * mhz,
                memory_clock_hertz=m.max_memory_clock_mhz * mhz,
                max_memory_clock_hertz=m.max_memory_clock_mhz * mhz,
                video_clock_hertz=m.video_clock_mhz * mhz,
                pcie_link_gen=m.pcie_generation,
                pcie_link_width=m.pcie_width,
                performance_state=0,
                clock_event_reasons=0x1,  # nvmlClocksEventReasonGpuIdle
                ecc_mode_enabled=m.ecc,
                minor_number=i,
                cc_major=m.compute_capability[0],
                cc_minor=m.compute_capability[1],
                pci_domain=0,
                pci_bus=_PCI_BUSES[i],
                pci_device=0,
                pci_device_id=m.pci_device_id,
                pci_subsystem_id=m.pci_subsystem_id,
                numa_node=(i * 2) // n if n > 1 else 0,
                has_ecc=m.ecc,
                has_fan=m.fan,
                has_encoder=m.encoder,
                has_memory_temperature=m.memory_temperature,
                has_remapping=m.row_remapping,
                has_page_retirement=m.page_retirement,
                has_mig=bool(m.mig_profiles),
                mig_mode_enabled=bool(g.mig),
                nvlink_count=m.nvlinks,
                multiprocessor_count=m.multiprocessors,
                bar1_total_bytes=m.bar1_mib * 2**20,
                bar1_used_bytes=2 * 2**20,
                power_min_watts=m.power_min_watts,
                brand=m.brand,
                persistence_mode=True,
                compute_mode=0,  # NVML_COMPUTEMODE_DEFAULT
                temp_shutdown_celsius=92,
                temp_slowdown_celsius=89,
                temp_memory_max_celsius=95,
                temp_gpu_max_celsius=87,
                energy_joules=0.0,
            )
            lib.gqsim_set_num(ptr, i, self._num_field("nvlink_group"), float(g.nvlink_group))
            for link in range(m.nvlinks):
                lib.gqsim_set_nvlink(ptr, i, link, int(g.nvlink_group >= 0), 0, 0, 0, 0)
            if g.values:
                self.set(i, **dict(g.values))
