"""Node specs for the NVML stand-in: presets, and the dict/YAML form they are written in.

A spec names the GPUs of one simulated node::

    {"name": "gpu-node-1",                       # optional; seeds the UUIDs
     "gpus": [{"model": "H100-SXM5-80GB", "count": 8}],
     "nvlink": "all"}                             # "all", "none" or [[0, 1], [2, 3]]

    {"model": "A100-SXM4-40GB", "count": 4, "mig": ["1g.5gb"] * 7}   # one model: short form

Each GPU entry may also carry "mig" (profile names, one GPU instance each) and "values"
(initial SimNode.set() keywords). Optional top-level keys: "driver_version",
"cuda_driver_version" (e.g. 12040), "nvml_costs" (what each NVML call costs; see
sim/nvml/costs.py, and a GPU entry may carry its own "nvml_costs" overrides). Everything is validated here; a bad spec raises
ValueError naming the problem.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuquota.sim.nvml.costs import CallCost, NodeCosts, parse_call_costs
from gpuquota.sim.nvml.costs import parse as parse_costs
from gpuquota.sim.nvml.models import GpuModel, MigProfile, model

MAX_GPUS = 16  # GQ_MAX_GPUS in gqsim_state.h
MAX_MIG = 7  # GQ_MAX_MIG

PRESETS: dict[str, dict[str, Any]] = {
    "h100x8": {"gpus": [{"model": "H100-SXM5-80GB", "count": 8}], "nvlink": "all"},
    "a100-mig": {"gpus": [{"model": "A100-SXM4-40GB", "count": 4, "mig": ["1g.5gb"] * 7}]},
    "l4x2": {"gpus": [{"model": "L4", "count": 2}]},
    "mixed": {
        "gpus": [
            {"model": "H100-SXM5-80GB", "count": 2},
            {"model": "A100-SXM4-40GB", "count": 1, "mig": ["3g.20gb", "2g.10gb", "1g.5gb"]},
            {"model": "L4", "count": 1},
        ],
        "nvlink": [[0, 1]],
    },
}

_UUID_NAMESPACE = uuid.UUID("6b1d2f0e-3c1a-4f5e-9d7b-0a8c4e2f1b3d")
_TOP_KEYS = {"name", "gpus", "nvlink", "driver_version", "cuda_driver_version", "nvml_costs"}
_SHORT_KEYS = {"model", "count", "mig", "values"}
_GPU_KEYS = {"model", "count", "mig", "values", "nvml_costs"}
# slices -> (allowed placement starts, memory slices occupied)
_PLACEMENTS: dict[int, tuple[tuple[int, ...], int]] = {
    1: ((0, 1, 2, 3, 4, 5, 6), 1),
    2: ((0, 2, 4), 2),
    3: ((0, 4), 4),
    4: ((0,), 4),
    7: ((0,), 8),
}


@dataclass(frozen=True, slots=True)
class MigSpec:
    profile: MigProfile
    gpu_instance_id: int
    compute_instance_id: int
    placement_start: int
    uuid: str


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    model: GpuModel
    uuid: str
    serial: str
    nvlink_group: int  # -1: no NVLink peers
    mig: tuple[MigSpec, ...] = ()
    values: Mapping[str, Any] = field(default_factory=dict)
    call_costs: Mapping[str, CallCost] = field(default_factory=dict)  # this GPU's overrides


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...]
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040
    costs: NodeCosts = field(default_factory=NodeCosts)

    @property
    def nvml_version(self) -> str:
        return f"{self.cuda_driver_version // 1000}.{self.driver_version}"


def load(spec: str | Mapping[str, Any]) -> NodeSpec:
    """A preset name, a path to a YAML/JSON file, YAML text, or a mapping -> NodeSpec."""
    if isinstance(spec, str):
        if spec in PRESETS:
            return parse(PRESETS[spec], default_name=spec)
        path = Path(spec)
        if path.suffix in {".yaml", ".yml", ".json"} or path.is_file():
            if not path.is_file():
                raise ValueError(f"spec file {spec} does not exist")
            try:
                loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
                reason = " ".join(str(exc).split())
                raise ValueError(f"spec file {spec}: not a YAML/JSON node spec: {reason}") from None
            if not isinstance(loaded, Mapping):
                raise ValueError(f"spec file {spec}: expected a mapping with 'gpus'")
        else:
            try:
                loaded = yaml.safe_load(spec)
            except yaml.YAMLError as exc:
                raise ValueError(f"spec is neither a preset nor valid YAML: {exc}") from None
        if not isinstance(loaded, Mapping):
            raise ValueError(
                f"unknown preset {spec!r}; presets: {', '.join(PRESETS)} "
                "(or give a mapping / YAML file)"
            )
        return parse(loaded)
    return parse(spec)


def parse(raw: Mapping[str, Any], default_name: str = "sim-node") -> NodeSpec:
    if not isinstance(raw, Mapping):
        raise ValueError(f"spec must be a mapping, not {type(raw).__name__}")
    if "model" in raw:
        unknown = set(raw) - _SHORT_KEYS - _TOP_KEYS
        if unknown:
            raise ValueError(f"unknown spec key(s): {', '.join(sorted(unknown))}")
        entry = {k: raw[k] for k in _SHORT_KEYS if k in raw}
        raw = {**{k: raw[k] for k in _TOP_KEYS if k in raw}, "gpus": [entry]}
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise ValueError(f"unknown spec key(s): {', '.join(sorted(unknown))}")
    name = str(raw.get("name", default_name))
    entries = raw.get("gpus")
    # an empty list is allowed: a node whose driver sees no GPU (the exporter must say so)
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        raise ValueError("spec needs 'gpus': a list of {model, count} entries")
    expanded: list[tuple[GpuModel, list[str], Mapping[str, Any]]] = []
    gpu_costs: list[dict[str, CallCost]] = []
    for n, entry in enumerate(entries):
        more = _expand_entry(n, entry)
        expanded.extend(more)
        own = parse_call_costs(entry.get("nvml_costs", {}), f"gpus[{n}].nvml_costs")
        for m, _, _ in more:
            gpu_costs.append({**{f: CallCost(ms) for f, ms in m.nvml_costs}, **own})
    if len(expanded) > MAX_GPUS:
        raise ValueError(
            f"spec has {len(expanded)} GPUs; the stand-in simulates at most {MAX_GPUS}"
        )
    groups = _nvlink_groups(raw.get("nvlink", "none"), expanded)
    gpus = []
    for index, (m, mig_names, values) in enumerate(expanded):
        gpu_uuid = "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{name}/{index}/{m.key}"))
        serial = str(1650000000000 + uuid.uuid5(_UUID_NAMESPACE, gpu_uuid).int % 10**9)
        gpus.append(
            GpuSpec(
                index=index,
                model=m,
                uuid=gpu_uuid,
                serial=serial,
                nvlink_group=groups.get(index, -1),
                mig=_mig_instances(m, mig_names, gpu_uuid),
                values=values,
                call_costs=gpu_costs[index],
            )
        )
    driver = str(raw.get("driver_version", "550.54.15"))
    cuda = raw.get("cuda_driver_version", 12040)
    if not isinstance(cuda, int) or cuda <= 0:
        raise ValueError(f"cuda_driver_version must be a positive integer like 12040, not {cuda!r}")
    return NodeSpec(
        name=name,
        gpus=tuple(gpus),
        driver_version=driver,
        cuda_driver_version=cuda,
        costs=parse_costs(raw.get("nvml_costs")),
    )


def _expand_entry(n: int, entry: Any) -> list[tuple[GpuModel, list[str], Mapping[str, Any]]]:
    if not isinstance(entry, Mapping):
        raise ValueError(f"gpus[{n}] must be a mapping with 'model' and 'count'")
    unknown = set(entry) - _GPU_KEYS
    if unknown:
        raise ValueError(f"gpus[{n}]: unknown key(s): {', '.join(sorted(unknown))}")
    if "model" not in entry:
        raise ValueError(f"gpus[{n}] has no 'model'")
    m = model(str(entry["model"]))
    count = entry.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"gpus[{n}]: count must be a positive integer, not {count!r}")
    mig = entry.get("mig", [])
    if isinstance(mig, str) or not isinstance(mig, Sequence):
        raise ValueError(f"gpus[{n}]: mig must be a list of profile names like ['1g.5gb']")
    mig_names = [str(p) for p in mig]
    values = entry.get("values", {})
    if not isinstance(values, Mapping):
        raise ValueError(f"gpus[{n}]: values must be a mapping of SimNode.set() keywords")
    return [(m, mig_names, values)] * count


def _mig_instances(m: GpuModel, names: list[str], gpu_uuid: str) -> tuple[MigSpec, ...]:
    if not names:
        return ()
    if not m.mig_profiles:
        raise ValueError(f"{m.key} does not support MIG (asked for {', '.join(names)})")
    profiles = [m.profile(n) for n in names]
    if len(profiles) > MAX_MIG:
        raise ValueError(f"{len(profiles)} MIG instances on {m.key}; at most {MAX_MIG} fit")
    used = sum(p.slices for p in profiles)
    if used > 7:
        raise ValueError(f"MIG instances {', '.join(names)} need {used} slices; {m.key} has 7")
    for p in {p.name: p for p in profiles}.values():
        if sum(q.name == p.name for q in profiles) > p.max_instances:
            raise ValueError(f"at most {p.max_instances} x {p.name} fit on {m.key}")
    # Larger instances first, each at the lowest free start NVML allows for its size (A100
    # and H100 place by memory slice: 8 of them, a 3g instance takes 4). GPU instance ids
    # count up from 1 in creation order, as on a freshly partitioned GPU.
    taken: set[int] = set()
    out = []
    for gi, p in enumerate(sorted(profiles, key=lambda p: -p.slices), start=1):
        starts, size = _PLACEMENTS[p.slices]
        start = next(
            (s for s in starts if not taken & set(range(s, s + size))),
            None,
        )
        if start is None:
            raise ValueError(f"MIG instances {', '.join(names)} do not fit together on {m.key}")
        taken |= set(range(start, start + size))
        mig_uuid = "MIG-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{gpu_uuid}/{gi}/0"))
        out.append(MigSpec(p, gi, 0, start, mig_uuid))
    return tuple(out)


def _nvlink_groups(
    raw: Any, gpus: list[tuple[GpuModel, list[str], Mapping[str, Any]]]
) -> dict[int, int]:
    """GPU index -> NVLink group; GPUs of one group reach each other over NVLink."""
    capable = [i for i, (m, _, _) in enumerate(gpus) if m.nvlinks > 0]
    if raw in (None, "none", False):
        return {}
    if raw == "all":
        return {i: 0 for i in capable} if len(capable) > 1 else {}
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ValueError(f"nvlink must be 'all', 'none' or a list of index groups, not {raw!r}")
    groups: dict[int, int] = {}
    for g, members in enumerate(raw):
        if not isinstance(members, Sequence) or isinstance(members, str) or len(members) < 2:
            raise ValueError(f"nvlink[{g}] must list at least two GPU indices")
        for i in members:
            if not isinstance(i, int) or not 0 <= i < len(gpus):
                raise ValueError(f"nvlink[{g}]: no GPU with index {i!r}")
            if i not in capable:
                raise ValueError(f"nvlink[{g}]: GPU {i} ({gpus[i][0].key}) has no NVLink")
            if i in groups:
                raise ValueError(f"nvlink: GPU {i} is in two groups")
            groups[i] = g
    return groups
