"""Building the pairwise topology from NVML's per-link view."""

from __future__ import annotations

from gpuquota.exporter.deviceplugin.topology import build_topology, normalize_bus_id
from gpuquota.exporter.snapshot import LINK_GPU, LINK_SWITCH, GpuLinks


def bus(i: int) -> str:
    return f"00000000:{0x10 + i:02X}:00.0"


def test_bus_ids_compare_across_formats() -> None:
    assert normalize_bus_id("00000000:1A:00.0") == normalize_bus_id("0000:1a:00.0")
    assert normalize_bus_id("junk") == "junk"


def test_nvswitch_node_links_every_pair() -> None:
    gpus = [
        GpuLinks(f"GPU-{i}", bus(i), tuple(("0000:ff:00.0", LINK_SWITCH) for _ in range(18)))
        for i in range(8)
    ]
    topo = build_topology(gpus, {}, {"GPU-0": 0, "GPU-7": 1})
    assert topo.nvlinks[("GPU-0", "GPU-7")] == 18
    assert topo.numa_node == {"GPU-0": 0, "GPU-7": 1}
    assert len(topo.nvlinks) == 28


def test_direct_links_counted_once_per_link() -> None:
    # 0 <-> 1 with 2 links, 1 <-> 2 with 1 link, 3 linked to nothing we know.
    gpus = [
        GpuLinks(
            "GPU-0",
            bus(0),
            ((bus(1), LINK_GPU), (bus(1).lower().replace("00000000", "0000"), LINK_GPU)),
        ),
        GpuLinks("GPU-1", bus(1), ((bus(0), LINK_GPU), (bus(0), LINK_GPU), (bus(2), LINK_GPU))),
        GpuLinks("GPU-2", bus(2), ((bus(1), LINK_GPU),)),
        GpuLinks("GPU-3", bus(3), (("0000:99:00.0", LINK_GPU),)),
    ]
    topo = build_topology(gpus, {("GPU-1", "GPU-0"): 20})
    assert topo.nvlinks == {("GPU-0", "GPU-1"): 2, ("GPU-1", "GPU-2"): 1}
    assert topo.pcie_level == {("GPU-0", "GPU-1"): 20}
    assert (
        topo.score("GPU-1", "GPU-0") > topo.score("GPU-1", "GPU-2") > topo.score("GPU-0", "GPU-3")
    )
