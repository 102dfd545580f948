"""What each simulated GPU model is: its NVML identity, limits, features and MIG profiles.

The single source of these facts for the stand-in. gpuquota.sim.nvml.spec turns a spec into GPUs of
these models, and gpuquota.sim.nvml.control writes them into the state file, where the C library
reads them. A feature flagged False makes the matching NVML functions answer
NVML_ERROR_NOT_SUPPORTED, as they do on that model.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile as nvmlDeviceGetGpuInstanceProfileInfo describes it."""

    name: str  # "1g.5gb", as in the resource name nvidia.com/mig-1g.5gb
    profile_index: int  # NVML_GPU_INSTANCE_PROFILE_* (the argument of the profile query)
    profile_id: int  # the id NVML reports (nvidia-smi mig -lgip "ID")
    slices: int
    max_instances: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    memory_mb: int


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str  # spec name, e.g. "H100-SXM5-80GB"
    name: str  # what nvmlDeviceGetName returns
    memory_total_bytes: int
    memory_reserved_bytes: int
    power_limit_watts: float
    power_min_watts: float
    idle_power_watts: float
    compute_capability: tuple[int, int]
    multiprocessors: int
    max_sm_clock_mhz: int
    max_memory_clock_mhz: int
    video_clock_mhz: int
    pci_device_id: int  # device id << 16 | vendor id
    pci_subsystem_id: int
    pcie_generation: int
    pcie_width: int
    bar1_mib: int
    vbios_version: str
    brand: int  # nvmlBrandType_t: 2 Tesla (Volta), 14 NVIDIA (later data-centre boards)
    board_part_number: str
    nvlinks: int = 0
    ecc: bool = True
    fan: bool = False  # passively cooled data-centre boards report no fan
    encoder: bool = False  # NVENC: absent on A100 and H100 SXM
    memory_temperature: bool = True  # HBM reports its temperature, GDDR does not
    row_remapping: bool = True  # Ampere and later with HBM
    page_retirement: bool = False  # Volta and older; replaced by row remapping
    mig_profiles: tuple[MigProfile, ...] = ()
    # NVML call costs (ms) where this model differs from the H100 table in sim/nvml/costs.py
    nvml_costs: tuple[tuple[str, float], ...] = ()

    def profile(self, name: str) -> MigProfile:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.mig_profiles) or "none (no MIG support)"
        raise ValueError(f"unknown MIG profile {name!r} for {self.key}; known: {known}")


def _p(name: str, index: int, pid: int, slices: int, count: int, sms: int, mem: int) -> MigProfile:
    return MigProfile(name, index, pid, slices, count, sms, max(1, slices), slices, 0, mem)


H100_SXM5_80GB = GpuModel(
    key="H100-SXM5-80GB",
    name="NVIDIA H100 80GB HBM3",
    memory_total_bytes=81559 * MIB,
    memory_reserved_bytes=566 * MIB,
    power_limit_watts=700.0,
    power_min_watts=200.0,
    idle_power_watts=72.0,
    compute_capability=(9, 0),
    multiprocessors=132,
    max_sm_clock_mhz=1980,
    max_memory_clock_mhz=2619,
    video_clock_mhz=1545,
    pci_device_id=0x233010DE,
    pci_subsystem_id=0x16C110DE,
    pcie_generation=5,
    pcie_width=16,
    bar1_mib=131072,
    vbios_version="96.00.99.00.01",
    brand=14,
    board_part_number="692-2G520-0200-000",
    nvlinks=18,
    mig_profiles=(
        _p("1g.10gb", 0, 19, 1, 7, 16, 9856),
        _p("1g.20gb", 9, 15, 1, 4, 26, 19968),
        _p("2g.20gb", 1, 14, 2, 3, 32, 19968),
        _p("3g.40gb", 2, 9, 3, 2, 60, 40192),
        _p("4g.40gb", 3, 5, 4, 1, 64, 40192),
        _p("7g.80gb", 4, 0, 7, 1, 132, 81152),
    ),
)

A100_SXM4_40GB = GpuModel(
    key="A100-SXM4-40GB",
    name="NVIDIA A100-SXM4-40GB",
    memory_total_bytes=40960 * MIB,
    memory_reserved_bytes=429 * MIB,
    power_limit_watts=400.0,
    power_min_watts=100.0,
    idle_power_watts=54.0,
    compute_capability=(8, 0),
    multiprocessors=108,
    max_sm_clock_mhz=1410,
    max_memory_clock_mhz=1215,
    video_clock_mhz=1275,
    pci_device_id=0x20B010DE,
    pci_subsystem_id=0x134F10DE,
    pcie_generation=4,
    pcie_width=16,
    bar1_mib=65536,
    vbios_version="92.00.19.00.10",
    brand=14,
    board_part_number="692-2G506-0200-002",
    nvlinks=12,
    mig_profiles=(
        _p("1g.5gb", 0, 19, 1, 7, 14, 4864),
        _p("1g.10gb", 7, 20, 1, 4, 14, 9856),
        _p("2g.10gb", 1, 14, 2, 3, 28, 9856),
        _p("3g.20gb", 2, 9, 3, 2, 42, 19968),
        _p("4g.20gb", 3, 5, 4, 1, 56, 19968),
        _p("7g.40gb", 4, 0, 7, 1, 98, 40192),
    ),
)

L4 = GpuModel(
    key="L4",
    name="NVIDIA L4",
    memory_total_bytes=23034 * MIB,
    memory_reserved_bytes=301 * MIB,
    power_limit_watts=72.0,
    power_min_watts=40.0,
    idle_power_watts=16.0,
    compute_capability=(8, 9),
    multiprocessors=58,
    max_sm_clock_mhz=2040,
    max_memory_clock_mhz=6251,
    video_clock_mhz=1770,
    pci_device_id=0x27B810DE,
    pci_subsystem_id=0x16CA10DE,
    pcie_generation=4,
    pcie_width=16,
    bar1_mib=32768,
    vbios_version="95.04.29.00.06",
    brand=14,
    board_part_number="900-2G193-0000-001",
    ecc=False,
    encoder=True,
    memory_temperature=False,
    row_remapping=False,
)

V100_SXM2_32GB = GpuModel(
    key="V100-SXM2-32GB",
    name="Tesla V100-SXM2-32GB",
    memory_total_bytes=32768 * MIB,
    memory_reserved_bytes=0,
    power_limit_watts=300.0,
    power_min_watts=150.0,
    idle_power_watts=42.0,
    compute_capability=(7, 0),
    multiprocessors=80,
    max_sm_clock_mhz=1530,
    max_memory_clock_mhz=877,
    video_clock_mhz=1372,
    pci_device_id=0x1DB510DE,
    pci_subsystem_id=0x124910DE,
    pcie_generation=3,
    pcie_width=16,
    bar1_mib=32768,
    vbios_version="88.00.80.00.01",
    brand=2,
    board_part_number="900-2G503-0430-000",
    nvlinks=6,
    encoder=True,
    row_remapping=False,
    page_retirement=True,
)

MODELS: dict[str, GpuModel] = {
    m.key: m for m in (H100_SXM5_80GB, A100_SXM4_40GB, L4, V100_SXM2_32GB)
}


def model(key: str) -> GpuModel:
    """The model named `key`; ValueError naming it (and the known ones) otherwise."""
    try:
        return MODELS[key]
    except KeyError:
        raise ValueError(f"unknown GPU model {key!r}; known: {', '.join(MODELS)}") from None
