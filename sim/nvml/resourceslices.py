"""The ResourceSlices NVIDIA's DRA driver (``gpu.nvidia.com``) would publish for a node spec.

On a DRA node the driver's kubelet plugin describes every allocatable device in
resource.k8s.io/v1 ResourceSlices: one pool named after the node, devices named
``gpu-<minor>`` for whole GPUs and ``gpu-<minor>-mig-<profile>-<profile id>-<placement start>`` for MIG
devices, each with the attributes below (``type`` "gpu" or "mig", ``uuid``, ``productName``,
``brand``, ``architecture``, versions of the compute capability and drivers, ``pcieBusID``;
MIG devices also ``parentUUID`` and ``profile``) and capacities (``memory``; for MIG devices
also multiprocessors and engines). The UUIDs are the ones the NVML stand-in reports for the
same spec, so the exporter can resolve a pod-resources ``(driver, pool, device)`` to the
device its snapshots know.

Tests and the demo apply these objects to the API server stand-in
(``ApiServer.apply("ADDED", slice)``); ``python -m gpuquota.sim.nvml.resourceslices SPEC NODE`` prints
them as a JSON list.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from gpuquota.sim.nvml.control import _PCI_BUSES
from gpuquota.sim.nvml.spec import GpuSpec, MigSpec, NodeSpec, load

DRIVER = "gpu.nvidia.com"
_SLICE_NAMESPACE = uuid.UUID("0f6e1c52-4b7a-4d0e-8a55-2d9a1e3c7b64")
# compute capability major -> the architecture name the driver reports
_ARCHITECTURES = {7: "Volta", 8: "Ampere", 9: "Hopper", 10: "Blackwell"}
_ADA = (8, 9)  # 8.9 is Ada Lovelace, not Ampere

Obj = dict[str, Any]


def gpu_device_name(gpu: GpuSpec) -> str:
    """The driver's canonical name of a whole GPU: ``gpu-<minor number>``."""
    return f"gpu-{gpu.index}"


def mig_device_name(gpu: GpuSpec, mig: MigSpec) -> str:
    """The driver's canonical name of a MIG device: parent minor, profile without its dot,
    GPU instance profile id and placement start, e.g. ``gpu-2-mig-1g5gb-19-6``."""
    profile = mig.profile.name.replace(".", "")
    return f"gpu-{gpu.index}-mig-{profile}-{mig.profile.profile_id}-{mig.placement_start}"


def _string(value: str) -> Obj:
    return {"string": value}


def _version(value: str) -> Obj:
    return {"version": value}


def _common_attributes(spec: NodeSpec, gpu: GpuSpec) -> dict[str, Obj]:
    m = gpu.model
    major, minor = m.compute_capability
    arch = "Ada Lovelace" if (major, minor) == _ADA else _ARCHITECTURES.get(major, "unknown")
    cuda = spec.cuda_driver_version
    return {
        "productName": _string(m.name),
        "brand": _string("Tesla" if m.brand == 2 else "Nvidia"),
        "architecture": _string(arch),
        "cudaComputeCapability": _version(f"{major}.{minor}.0"),
        "driverVersion": _version(spec.driver_version),
        "cudaDriverVersion": _version(f"{cuda // 1000}.{cuda % 1000 // 10}.0"),
        "pcieBusID": _string(f"00000000:{_PCI_BUSES[gpu.index]:02X}:00.0"),
    }


def devices(spec: NodeSpec, dynamic_mig: bool = False) -> list[Obj]:
    """The slice's ``devices``: each GPU without MIG as a whole, each MIG device on its own.

    ``dynamic_mig``: MIG devices as the driver's dynamic MIG mode announces them, before it
    creates them on allocation: without a ``uuid`` attribute."""
    out: list[Obj] = []
    for gpu in spec.gpus:
        common = _common_attributes(spec, gpu)
        if not gpu.mig:
            out.append(
                {
                    "name": gpu_device_name(gpu),
                    "attributes": {
                        "type": _string("gpu"),
                        "uuid": _string(gpu.uuid),
                        **common,
                    },
                    "capacity": {"memory": {"value": str(gpu.model.memory_total_bytes)}},
                }
            )
            continue
        for mig in gpu.mig:
            p = mig.profile
            out.append(
                {
                    "name": mig_device_name(gpu, mig),
                    "attributes": {
                        "type": _string("mig"),
                        **({} if dynamic_mig else {"uuid": _string(mig.uuid)}),
                        "parentUUID": _string(gpu.uuid),
                        "profile": _string(p.name),
                        **common,
                    },
                    "capacity": {
                        "multiprocessors": {"value": str(p.multiprocessors)},
                        "copyEngines": {"value": str(p.copy_engines)},
                        "decoders": {"value": str(p.decoders)},
                        "encoders": {"value": str(p.encoders)},
                        "memory": {"value": str(p.memory_mb * 1024 * 1024)},
                    },
                }
            )
    return out


def resource_slices(
    spec: NodeSpec, node_name: str, generation: int = 1, dynamic_mig: bool = False
) -> list[Obj]:
    """The node's ResourceSlices as the driver publishes them (one slice, pool = node name)."""
    name = f"{node_name}-{DRIVER}-" + uuid.uuid5(_SLICE_NAMESPACE, node_name).hex[:5]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid5(_SLICE_NAMESPACE, name)),
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": node_name,
                        "uid": str(uuid.uuid5(_SLICE_NAMESPACE, f"node/{node_name}")),
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": DRIVER,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
                "devices": devices(spec, dynamic_mig),
            },
        }
    ]


def device_uuids(spec: NodeSpec) -> dict[str, str]:
    """Device name -> UUID for every device the slices list (what a resolver must find)."""
    out = {}
    for gpu in spec.gpus:
        if not gpu.mig:
            out[gpu_device_name(gpu)] = gpu.uuid
        for mig in gpu.mig:
            out[mig_device_name(gpu, mig)] = mig.uuid
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="a preset name, YAML text or a spec file")
    parser.add_argument("node", help="the node name (also the pool name)")
    args = parser.parse_args(argv)
    try:
        node_spec = load(args.spec)
    except ValueError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    json.dump(resource_slices(node_spec, args.node), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
