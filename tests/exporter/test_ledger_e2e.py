"""The usage counters end to end: the exporter as ``gpu-exporter`` assembles it (exporter/app.py)
over the NVML stand-in, the kubelet's pod-resources stand-in, the API server stand-in listing
this node's pods and a proc tree in tmp; the test holds known activity and power, scrapes
/metrics and compares the counters with the stand-in's own integral.

The last test has a real Prometheus scrape the real exporter process and store the counters
with their labels."""

from __future__ import annotations

import itertools
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuquota.exporter.app import build
from gpuquota.exporter.cli import build_parser
from gpuquota.exporter.snapshot import NodeSnapshot
from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import wait_for
from gpuquota.sim.kubelet.podresources import ClaimAssignment, PodResourcesServer
from gpuquota.sim.nvml import spec
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.resourceslices import DRIVER, resource_slices
from tests.exporter.procs import Exporter
from tests.exporter.scrape import parse, value
from tests.prometheus import running

NODE = "gpu-node-1"
SPEC = {
    "gpus": [
        {"model": "H100-SXM5-80GB", "count": 2},
        {"model": "H100-SXM5-80GB", "count": 1, "mig": ["1g.10gb", "3g.40gb"]},
        {"model": "L4", "count": 2},
    ]
}
# pod -> (namespace, uid, pid of its one process)
PODS = {
    "train": ("team-a", "11111111-1111-4111-8111-111111111111", 101),
    "nb1": ("team-b", "22222222-2222-4222-8222-222222222222", 201),
    "nb2": ("team-c", "33333333-3333-4333-8333-333333333333", 301),
    "mig": ("team-a", "44444444-4444-4444-8444-444444444444", 401),
    "infer": ("team-b", "55555555-5555-4555-8555-555555555555", 501),
}
SMALL = 1  # the stand-in lists a GPU's MIG instances largest first: 3g.40gb, 1g.10gb
POWER = {0: 500.0, 1: 400.0, 2: 700.0, 3: 70.0, 4: 30.0}


def _proc(root: Path, name: str) -> None:
    _namespace, uid, pid = PODS[name]
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(f"0::/kubepods/pod{uid}/{pid:064x}\n")


def _cluster(node: SimNode, tmp_path: Path, kubelet: PodResourcesServer) -> None:
    """GPU 0: one pod (GPM); GPU 1: two pods time-sliced (per-process SM); GPU 2: MIG, its 1g
    instance held, its 3g instance not; GPU 3 (L4, no GPM): one pod; GPU 4: nobody."""
    proc = tmp_path / "proc"
    for name in PODS:
        _proc(proc, name)
    for i, watts in POWER.items():
        node.set(i, power_watts=watts)
    node.set_gpm(0, sm_activity=0.8)
    node.set_gpm(2, mig=SMALL, sm_activity=1.0)
    node.set_gpm(2, mig=0, sm_activity=0.5)  # the 3g instance: busy, but nobody's
    node.set(3, gpu_utilization_ratio=0.5)
    for pid, sm in ((201, 0.6), (301, 0.2)):
        node.add_process(1, pid, 2**30)
        node.set_process_utilization(1, pid, sm=sm, memory=0.1)
    uid = {name: u for name, (_ns, u, _pid) in PODS.items()}  # in the kubelet's checkpoint
    gpu = "nvidia.com/gpu"
    kubelet.assign("team-a", "train", "main", gpu, node.uuid(0), uid=uid["train"])
    kubelet.assign("team-b", "nb1", "main", gpu, f"{node.uuid(1)}::0", uid=uid["nb1"])
    kubelet.assign("team-c", "nb2", "main", gpu, f"{node.uuid(1)}::1", uid=uid["nb2"])
    mig = node.mig_uuids(2)[SMALL]
    kubelet.assign("team-a", "mig", "main", "nvidia.com/mig-1g.10gb", mig, uid=uid["mig"])
    kubelet.assign("team-b", "infer", "main", gpu, node.uuid(3), uid=uid["infer"])


@pytest.fixture
def cluster(
    make_node: Callable[..., SimNode], tmp_path: Path
) -> Iterator[tuple[SimNode, Path, list[str]]]:
    """(node, kubeconfig, the exporter's pod flags)."""
    node = make_node(SPEC)
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    with (
        PodResourcesServer(tmp_path / "kubelet.sock", checkpoint=checkpoint) as kubelet,
        ApiServer() as server,
    ):
        server.forbid("pods")  # the agent names pods from the node alone (issue 35)
        _cluster(node, tmp_path, kubelet)
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        flags = [
            "--pod-resources-socket", str(tmp_path / "kubelet.sock"),
            "--pod-resources-interval", "100ms", "--device-checkpoint", str(checkpoint),
            "--pod-usage", "--node-name", NODE, "--proc-root", str(tmp_path / "proc"),
            "--kubeconfig", str(kubeconfig), "--dra", "off",
        ]  # fmt: skip
        yield node, kubeconfig, flags


def test_scraped_counters_match_the_stand_ins_integral(
    cluster: tuple[SimNode, Path, list[str]],
) -> None:
    node, _kubeconfig, flags = cluster
    node.preload()
    args = build_parser().parse_args(
        ["--listen", "127.0.0.1:0", "--interval", "200ms", "--slow-interval", "1s", *flags]
    )
    app = build(args)
    seen: list[NodeSnapshot] = []
    app.collector.subscribe(seen.append)
    # The per-process answers are stamped with whole seconds and average the time since the
    # stamp before: start in a second after the one the processes became busy in, so that
    # every answer after the first (a baseline) covers busy time only.
    time.sleep(1.0 - time.time() % 1.0 + 0.01)
    app.start()
    try:
        # the counters start once every holder's UID is known
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            latest = app.collector.latest()
            if latest is not None and len(latest.usage_totals) == 4:
                break
            time.sleep(0.05)
        assert latest is not None and len(latest.usage_totals) == 4, latest
        # more than 8 s of rounds: until a round ends more than 8 s after the first (a fixed
        # 8 s sleep can end before that round when a loaded machine delays the rounds)
        wait_for(
            lambda: seen[-1].collected_at - seen[0].collected_at > 8,
            timeout=60,
            what="more than 8 s between the first and the last round",
        )
        app.collector.stop()
        port = app.server.address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            scraped = parse(answer.read())
    finally:
        app.stop()
    last = seen[-1]
    first = seen[0]
    span = last.collected_at - first.collected_at
    assert span > 8

    def used(name: str, uuid: str, activity: str) -> float:
        namespace, uid, _pid = PODS[name]
        return value(scraped, "gpu_pod_used_seconds_total", uuid=uuid, namespace=namespace,
                     pod=name, pod_uid=uid, activity=activity)  # fmt: skip

    def energy(name: str, uuid: str) -> float:
        namespace, uid, _pid = PODS[name]
        return value(scraped, "gpu_pod_energy_joules_total", uuid=uuid, namespace=namespace,
                     pod=name, pod_uid=uid)  # fmt: skip

    def truth_energy(i: int) -> float:
        """The stand-in's energy counter between the exporter's first and last readings of
        it (the slow tier reads it), checked against power x the wall-clock time between."""
        uuid = node.uuid(i)
        reads = {}
        for snap in seen:
            for d in snap.devices:
                if d.uuid == uuid and d.energy_joules is not None:
                    reads.setdefault(d.energy_joules, dict(d.read_at)["slow"])
        (first_j, first_t), (last_j, last_t) = min(reads.items()), max(reads.items())
        assert last_j - first_j == pytest.approx(POWER[i] * (last_t - first_t), rel=0.01)
        return last_j - first_j

    def gpm_span(uuid: str) -> float:
        """GPM is a sample pair taken on each GPU's slow turn (exporter/collect/tiers.py): its
        activity is known from the round that completes the first pair, whose step counts."""
        for before, snap in itertools.pairwise(seen):
            if any(d.uuid == uuid and d.gpm is not None for d in snap.devices):
                return last.collected_at - before.collected_at
        raise AssertionError(f"no GPM sample of {uuid}")

    rel = 0.01
    # GPU 0, one pod: GPM SM activity 0.8 for the whole span, all the GPU's energy
    assert used("train", node.uuid(0), "sm_active") == pytest.approx(
        0.8 * gpm_span(node.uuid(0)), rel=rel
    )
    assert energy("train", node.uuid(0)) == pytest.approx(truth_energy(0), rel=rel)

    def covered(name: str, uuid: str, attributed: bool = False) -> float:
        """The seconds NVML's per-process answers covered for the pod's process: the first
        answer is a baseline, each later one covers the time since the one before, in whole
        seconds of the driver's clock (so within a second or so of the rounds' span).
        ``attributed``: only rounds that already knew the pod held the GPU and the process was
        the pod's (the agent learns these from the kubelet and /proc, which a loaded machine
        can delay a round or two)."""
        namespace, _uid, pid = PODS[name]
        return sum(
            u.sampled_seconds
            for snap in seen
            for d in snap.devices
            if d.uuid == uuid
            and (
                not attributed
                or (any(p.namespace == namespace and p.pod == name
                        for p in snap.pod_usage.get(uuid, ()))
                    and any(r.namespace == namespace and r.pod == name
                            for r in snap.pods.get(uuid, ())))
            )
            for u in d.process_utilization or ()
            if u.pid == pid
        )  # fmt: skip

    # GPU 1, time-sliced: per-process SM 0.6 / 0.2, energy split 3:1
    for name, sm in (("nb1", 0.6), ("nb2", 0.2)):
        assert covered(name, node.uuid(1)) == pytest.approx(span, abs=1.5)
        assert used(name, node.uuid(1), "process_sm") == pytest.approx(
            sm * covered(name, node.uuid(1), attributed=True), rel=rel
        )
    assert energy("nb1", node.uuid(1)) == pytest.approx(0.75 * truth_energy(1), rel=rel)
    assert energy("nb2", node.uuid(1)) == pytest.approx(0.25 * truth_energy(1), rel=rel)
    # GPU 2, MIG: the 1g instance at 100 % counts 1/7 of a GPU; 6/7 of the energy is unheld
    mig = node.mig_uuids(2)[SMALL]
    assert used("mig", mig, "sm_active") == pytest.approx(gpm_span(mig) / 7, rel=rel)
    assert energy("mig", mig) == pytest.approx(truth_energy(2) / 7, rel=rel)
    unallocated = {lbl["uuid"]: v for lbl, v in scraped["gpu_unallocated_energy_joules_total"]}
    assert unallocated[node.uuid(2)] == pytest.approx(truth_energy(2) * 6 / 7, rel=rel)
    # GPU 3 (L4, no GPM): the utilisation ratio
    assert used("infer", node.uuid(3), "utilization") == pytest.approx(0.5 * span, rel=rel)
    # GPU 4, nobody: all its energy is unallocated; held GPUs have none
    assert unallocated[node.uuid(4)] == pytest.approx(truth_energy(4), rel=rel)
    assert unallocated[node.uuid(0)] == 0.0
    assert set(unallocated) == {node.uuid(i) for i in range(5)}  # physical GPUs only
    assert "gpu_claim_used_seconds_total" not in scraped  # no DRA claims here


@pytest.mark.prometheus
@pytest.mark.slow
def test_prometheus_stores_the_counters_with_their_labels(
    cluster: tuple[SimNode, Path, list[str]],
    start_exporter: Callable[..., Exporter],
    tmp_path: Path,
) -> None:
    node, _kubeconfig, flags = cluster
    exporter = start_exporter(node, "--interval", "200ms", *flags)
    (tmp_path / "prom").mkdir()
    with running(tmp_path / "prom", {"gpu": [exporter.port]}) as prom:
        found = prom.wait_for("gpu_pod_used_seconds_total > 0", lambda r: len(r) == 5)
        labels = {(s["metric"]["pod"], s["metric"]["activity"]): s["metric"] for s in found}
        assert set(labels) == {("train", "sm_active"), ("nb1", "process_sm"),
                               ("nb2", "process_sm"), ("mig", "sm_active"),
                               ("infer", "utilization")}  # fmt: skip
        train = labels[("train", "sm_active")]
        assert (train["namespace"], train["pod_uid"], train["uuid"], train["gpu"]) == (
            "team-a", PODS["train"][1], node.uuid(0), "0")  # fmt: skip
        mig = labels[("mig", "sm_active")]
        assert (mig["mig_profile"], mig["uuid"]) == ("1g.10gb", node.mig_uuids(2)[SMALL])
        energy = prom.wait_for(
            "sum by (namespace) (rate(gpu_pod_energy_joules_total[10s]))",
            lambda r: {s["metric"].get("namespace") for s in r} == {"team-a", "team-b", "team-c"},
        )
        assert all(float(s["value"][1]) > 0 for s in energy)
        unheld = prom.query("gpu_unallocated_energy_joules_total")
        assert {s["metric"]["uuid"] for s in unheld} == {node.uuid(i) for i in range(5)}


def test_a_dra_claim_shared_by_two_pods_is_charged_once(
    make_node: Callable[..., SimNode], tmp_path: Path
) -> None:
    """Two pods share one ResourceClaim on GPU 0 (GPM 0.5, 300 W): one claim series with the
    claim's UID, no pod series for them, and GPU 1, unheld, all unallocated."""
    two = {"gpus": [{"model": "H100-SXM5-80GB", "count": 2}]}
    node = make_node(two)
    node.set(0, power_watts=300.0)
    node.set(1, power_watts=100.0)
    node.set_gpm(0, sm_activity=0.5)
    claim_uid = "66666666-6666-4666-8666-666666666666"
    pod_uids = {"p1": "77777777-7777-4777-8777-777777777771",
                "p2": "77777777-7777-4777-8777-777777777772"}  # fmt: skip
    (tmp_path / "proc" / "601").mkdir(parents=True)
    (tmp_path / "proc" / "601" / "cgroup").write_text(
        f"0::/kubepods/pod{pod_uids['p1']}/{'d' * 64}\n"
    )
    node.add_process(0, 601, 2**30)
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet, ApiServer() as server:
        for obj in resource_slices(spec.load(two), NODE):
            server.apply("ADDED", obj)
        server.apply("ADDED", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "shared", "namespace": "team-d", "uid": claim_uid},
            "spec": {"devices": {"requests": []}},
            "status": {"reservedFor": [{"resource": "pods", "name": p, "uid": u}
                                       for p, u in pod_uids.items()]},
        })  # fmt: skip
        server.forbid("pods")  # the claim's reservation names p1's process (issue 35)
        for pod in ("p1", "p2"):
            device = ((DRIVER, NODE, "gpu-0"),)
            kubelet.assign_claim(ClaimAssignment("team-d", pod, "main", "shared", "team-d", device))
        node.preload()
        args = build_parser().parse_args([
            "--listen", "127.0.0.1:0", "--interval", "200ms", "--slow-interval", "200ms",
            "--pod-resources-socket", str(tmp_path / "kubelet.sock"),
            "--pod-resources-interval", "100ms", "--pod-usage", "--node-name", NODE,
            "--proc-root", str(tmp_path / "proc"), "--dra", "on",
            "--kubeconfig", str(server.write_kubeconfig(tmp_path / "kubeconfig")),
        ])  # fmt: skip
        app = build(args)
        seen: list[NodeSnapshot] = []
        app.collector.subscribe(seen.append)
        app.start()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not (seen and seen[-1].usage_totals):
                time.sleep(0.05)
            time.sleep(5)
            app.collector.stop()
            with urllib.request.urlopen(
                f"http://127.0.0.1:{app.server.address[1]}/metrics", timeout=5
            ) as answer:
                scraped = parse(answer.read())
        finally:
            app.stop()
    (used,) = scraped["gpu_claim_used_seconds_total"]
    labels, seconds = used
    assert (labels["namespace"], labels["claim"], labels["claim_uid"], labels["activity"]) == (
        "team-d", "shared", claim_uid, "sm_active")  # fmt: skip
    assert labels["uuid"] == node.uuid(0)
    # the UID arrived a few rounds in: the usage before it is in the value; the span is the
    # whole run from the first collection that saw the claim
    held = [s for s in seen if s.claims.get(node.uuid(0))]
    # activity counts from the step that ends in the first held round with a GPM pair (under
    # load a round can miss its pair: GPM needs 100 ms between the samples)
    first = next(
        i
        for i, snap in enumerate(seen)
        if i > 0
        and snap.claims.get(node.uuid(0))
        and any(d.uuid == node.uuid(0) and d.gpm is not None for d in snap.devices)
    )
    since = seen[first - 1].collected_at
    assert seconds == pytest.approx(0.5 * (held[-1].collected_at - since), rel=0.01)
    ((_, joules),) = scraped["gpu_claim_energy_joules_total"]
    # the energy counter's step into the first held round is the claim's (its power then)
    # (the first snapshot's reading is the baseline: nothing before it counts)
    energy_since = seen[max(seen.index(held[0]) - 1, 0)].collected_at
    assert joules == pytest.approx(300.0 * (held[-1].collected_at - energy_since), rel=0.02)
    assert "gpu_pod_used_seconds_total" not in scraped  # the pods hold it through the claim
    (mine,) = [lbl for lbl, _ in scraped["gpu_pod_memory_used_bytes"] if lbl["owner"] == "pod"]
    assert (mine["namespace"], mine["pod"], mine["pod_uid"]) == ("team-d", "p1", pod_uids["p1"])
    unallocated = {lbl["uuid"]: v for lbl, v in scraped["gpu_unallocated_energy_joules_total"]}
    # before the claim was seen GPU 0 was nobody's: every joule is someone's, or unallocated
    total = 300.0 * (held[-1].collected_at - seen[0].collected_at)
    assert unallocated[node.uuid(0)] + joules == pytest.approx(total, rel=0.02)
    assert unallocated[node.uuid(0)] <= 300.0 * (energy_since - seen[0].collected_at) + 1.0
    assert unallocated[node.uuid(1)] > 0
