"""GetPreferredAllocation's choice on NVLink and mixed topologies, without gRPC."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuquota.exporter.deviceplugin.preferred import PreferenceError, Topology, preferred_allocation

G = [f"GPU-{i}" for i in range(8)]


def topo(
    nvlinks: dict[tuple[int, int], int], levels: dict[tuple[int, int], int] | None = None
) -> Topology:
    def key(a: int, b: int) -> tuple[str, str]:
        return (G[a], G[b]) if G[a] <= G[b] else (G[b], G[a])

    return Topology(
        nvlinks={key(a, b): n for (a, b), n in nvlinks.items()},
        pcie_level={key(a, b): lv for (a, b), lv in (levels or {}).items()},
    )


def gpu_of(ids: list[str]) -> dict[str, str]:
    return {i: i.split("::")[0] for i in ids}


# 8 x H100 SXM on NVSwitch: every pair has the same NVLink bandwidth; two CPU sockets, and
# pairs of GPUs behind one PCIe switch.
def socket_levels() -> dict[tuple[int, int], int]:
    levels = {}
    for a, b in combinations(range(8), 2):
        if a // 2 == b // 2:
            levels[(a, b)] = 20  # same PCIe switch (MULTIPLE)
        elif a // 4 == b // 4:
            levels[(a, b)] = 40  # same NUMA node
        else:
            levels[(a, b)] = 50  # across sockets
    return levels


H100X8 = topo({pair: 18 for pair in combinations(range(8), 2)}, socket_levels())

# DGX-1 style hybrid cube-mesh: two fully linked quads plus i <-> i+4.
CUBE = topo(
    {
        **{p: 1 for p in combinations(range(4), 2)},
        **{p: 1 for p in combinations(range(4, 8), 2)},
        **{(i, i + 4): 1 for i in range(4)},
    }
)

# Mixed: NVLink bridges join 0-1 and 2-3 only; 4-7 are plain PCIe.
BRIDGES = topo({(0, 1): 4, (2, 3): 4}, socket_levels())


def pick(t: Topology, available: list[int], size: int, must: list[int] = ()) -> list[int]:  # type: ignore[assignment]
    ids = [G[i] for i in available]
    out = preferred_allocation(ids, [G[i] for i in must], size, gpu_of(G), t)
    return sorted(int(i.split("-")[1]) for i in out)


def test_nvswitch_node_prefers_the_closest_pcie_pairs() -> None:
    assert pick(H100X8, list(range(8)), 2) == [0, 1]
    assert pick(H100X8, list(range(8)), 4) == [0, 1, 2, 3]
    assert pick(H100X8, list(range(8)), 2, must=[5]) == [4, 5]
    assert pick(H100X8, [0, 2, 3, 5, 6, 7], 2) == [2, 3]
    assert pick(H100X8, list(range(8)), 8) == list(range(8))


def test_cube_mesh_prefers_a_fully_linked_quad() -> None:
    assert pick(CUBE, list(range(8)), 4) == [0, 1, 2, 3]
    assert pick(CUBE, list(range(1, 8)), 4) == [4, 5, 6, 7]
    assert pick(CUBE, list(range(8)), 2, must=[6]) == [2, 6]  # lowest linked peer of 6


def test_mixed_topology_prefers_nvlink_bridges_then_pcie() -> None:
    assert pick(BRIDGES, [1, 2, 3, 4], 2) == [2, 3]
    assert pick(BRIDGES, [0, 2, 4, 5], 2) == [4, 5]  # no bridge available: same PCIe switch
    assert pick(BRIDGES, [0, 3, 4, 6], 2, must=[6]) == [4, 6]  # same socket beats across sockets
    assert pick(BRIDGES, [1, 2, 3, 4], 2, must=[4]) == [1, 4]  # all across sockets: lowest index
    assert pick(BRIDGES, list(range(8)), 4) == [0, 1, 2, 3]


def test_no_topology_falls_back_to_index_order() -> None:
    assert pick(Topology(), [3, 1, 2], 2) == [1, 2]


def test_replicas_spread_over_gpus_first() -> None:
    ids = [f"{g}::{n}" for g in G[:2] for n in range(4)]
    t = topo({(0, 1): 4})
    out = preferred_allocation(ids, [], 2, gpu_of(ids), t)
    assert sorted(out) == ["GPU-0::0", "GPU-1::0"]
    out = preferred_allocation(ids, ["GPU-1::2"], 3, gpu_of(ids), t)
    assert (
        out[0] == "GPU-1::2"
        and len(set(out)) == 3
        and {o.split("::")[0] for o in out} == {"GPU-0", "GPU-1"}
    )
    assert len(preferred_allocation(ids, [], 8, gpu_of(ids), t)) == 8


def test_time_sliced_pods_go_to_the_least_shared_gpus() -> None:
    # Four GPUs x 4 replicas; GPU-0 already runs three pods, GPU-1 one, GPU-2 and GPU-3 none.
    every = [f"{g}::{n}" for g in G[:4] for n in range(4)]
    taken = {"GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-1::0"}
    free = [i for i in every if i not in taken]
    t = topo({(0, 1): 4})  # NVLink joins 0-1 only
    [one] = preferred_allocation(free, [], 1, gpu_of(every), t)
    assert one.split("::")[0] == "GPU-2"  # idle, lowest index; never the GPU three pods share
    # a pair with no interconnect to choose by goes to the idle GPUs...
    two = preferred_allocation(free, [], 2, gpu_of(every), Topology())
    assert sorted(o.split("::")[0] for o in two) == ["GPU-2", "GPU-3"]
    # ...but a multi-GPU container still gets its NVLink first
    linked = preferred_allocation(free, [], 2, gpu_of(every), t)
    assert sorted(o.split("::")[0] for o in linked) == ["GPU-0", "GPU-1"]
    # a fresh node fills GPU after GPU in turn: one pod per GPU before any doubles up
    placed: set[str] = set()
    for _ in range(4):
        [got] = preferred_allocation([i for i in every if i not in placed], [], 1, gpu_of(every), t)
        placed.add(got)
    assert sorted(p.split("::")[0] for p in placed) == G[:4]


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        ([G[0]], [], 0, "must be positive"),
        ([G[0]], [], 2, "exceeds the 1 available"),
        ([G[0], G[1]], [G[2]], 1, "not among the available"),
        ([G[0], "GPU-x"], [], 1, "unknown device ID(s): GPU-x"),
        ([G[0], G[0]], [], 1, "duplicates"),
        ([G[0], G[1]], [G[0], G[1]], 1, "exceed the allocation size"),
    ],
)
def test_bad_requests(available: list[str], must: list[str], size: int, message: str) -> None:
    with pytest.raises(PreferenceError) as err:
        preferred_allocation(available, must, size, gpu_of(G), H100X8)
    assert message in str(err.value)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_answer_is_valid_and_optimal_on_small_sets(data: st.DataObject) -> None:
    available = data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True))
    size = data.draw(st.integers(1, len(available)))
    must = data.draw(st.lists(st.sampled_from(available), max_size=size, unique=True))
    out = pick(CUBE, available, size, must)
    assert len(out) == size and set(must) <= set(out) <= set(available)

    def score(s: list[int]) -> int:
        return sum(CUBE.score(G[a], G[b]) for a, b in combinations(s, 2))

    others = [c for c in combinations(sorted(available), size) if set(must) <= set(c)]
    assert score(out) == max(score(list(c)) for c in others)
