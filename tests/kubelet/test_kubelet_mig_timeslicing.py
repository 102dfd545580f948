"""MIG (mixed strategy) and time-sliced replicas through the kubelet stand-in, end to end:
gpu-exporter (the real CLI, a subprocess) on the NVML stand-in's ``mixed`` node serves the
device plugin, the stand-in kubelet counts capacity and allocatable per resource, admits pods
through GetPreferredAllocation and Allocate, reports them on pod-resources (the exporter
attributes them) and turns ListAndWatch health into each pod's ``allocatedResourcesStatus``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import poll
from gpuquota.sim.kubelet.registration import KubeletStandIn
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.nvml.spec import load as load_spec
from tests.kubelet.exporter_proc import Exporter, pod_info

GPU = "nvidia.com/gpu"
MIG_RESOURCES = ("nvidia.com/mig-3g.20gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-1g.5gb")
SMALL = "nvidia.com/mig-1g.5gb"
QUIET_S = 1.0
WAIT_S = 10.0
PODS = {"infer-0": "inference", "infer-1": "inference", "infer-2": "inference"}


def pod(name: str, namespace: str) -> dict[str, object]:
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "main"}]}, "status": {}}  # fmt: skip


def test_mig_and_time_sliced_replicas_as_the_kubelet_counts_them(
    dirs: tuple[Path, Path], make_kubelet: Callable[..., KubeletStandIn]
) -> None:
    plugin_dir, root_dir = dirs
    spec = load_spec("mixed")  # GPUs 0, 1, 3 whole; GPU 2 split into 3g.20gb, 2g.10gb, 1g.5gb
    small = next(m for m in spec.gpus[2].mig if m.profile.name == "1g.5gb")
    with ApiServer() as api, SimNode.create(plugin_dir.parent / "nvml.state", "mixed") as node:
        api.apply("ADDED", {"kind": "Node", "apiVersion": "v1",
                            "metadata": {"name": "node-a", "uid": "uid-node-a"}, "status": {}})  # fmt: skip
        for name, namespace in {**PODS, "notebook": "research"}.items():
            api.apply("ADDED", pod(name, namespace))
        kubelet = make_kubelet(api=api)
        exporter = Exporter(
            node, root_dir / "pod-resources" / "kubelet.sock",
            "--device-plugin", f"--device-plugin-dir={plugin_dir}", "--time-slicing-replicas=2",
            f"--health-quiet-period={QUIET_S}",
        )  # fmt: skip
        try:
            uuid = [node.uuid(i) for i in range(4)]
            gpus = kubelet.wait_for_plugin(GPU, timeout=WAIT_S)
            assert gpus is not None and gpus.wait_for(lambda d: len(d) == 6, timeout=WAIT_S)
            for resource in MIG_RESOURCES:
                mig = kubelet.wait_for_plugin(resource, timeout=WAIT_S)
                assert mig is not None and mig.wait_for(lambda d: len(d) == 1, timeout=WAIT_S)

            # Capacity: each replica counts as one nvidia.com/gpu, each MIG instance as one of
            # its profile; the MIG-enabled GPU is not a whole GPU.
            status = kubelet.sync_node_status()
            everything = {GPU: 6, **dict.fromkeys(MIG_RESOURCES, 1)}
            assert status.capacity == status.allocatable == everything

            # Allocation: one replica per pod, spread over the three whole GPUs (not stacked
            # on the best-connected one); the container sees the GPU, not the replica.
            held: dict[str, str] = {}
            for name, namespace in PODS.items():
                answer = kubelet.admit(namespace, name, {"main": {GPU: 1}})["main"][GPU]
                [replica] = kubelet.allocated(namespace, name)["main"][GPU]
                held[name] = replica
                assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == replica.split("::")[0]
            assert sorted(r.split("::")[0] for r in held.values()) == sorted(
                uuid[i] for i in (0, 1, 3)
            )
            answer = kubelet.admit("research", "notebook", {"main": {SMALL: 1}})["main"][SMALL]
            assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == small.uuid

            # Attribution through pod-resources: replicas to their GPU, the instance to itself.
            want = {(r.split("::")[0], "inference", n) for n, r in held.items()}
            want.add((small.uuid, "research", "notebook"))
            assert poll(lambda: pod_info(exporter.port) == want, WAIT_S), pod_info(exporter.port)

            def resource_status(name: str, namespace: str) -> dict[str, str]:
                obj = api.get("pods", name, namespace) or {}
                [container] = obj["status"]["containerStatuses"]
                return {
                    r["resourceID"]: r["health"]
                    for group in container["allocatedResourcesStatus"]
                    for r in group["resources"]
                }

            # Health per replica: XID 79 on infer-0's GPU withdraws both its replicas; the
            # pod's status names its own replica Unhealthy, the other pods stay Healthy.
            bad = uuid.index(held["infer-0"].split("::")[0])
            node.inject_xid(bad, 79)
            infer0_sick = {held["infer-0"]: "Unhealthy"}
            assert poll(lambda: resource_status("infer-0", "inference") == infer0_sick, WAIT_S)
            assert resource_status("infer-1", "inference") == {held["infer-1"]: "Healthy"}
            status = kubelet.sync_node_status()
            assert (status.capacity[GPU], status.allocatable[GPU]) == (6, 4)

            # Health per instance: an uncontained error (XID 95) on the MIG GPU withdraws every
            # instance of every profile on it.
            node.inject_xid(2, 95, small.gpu_instance_id, small.compute_instance_id)
            assert poll(
                lambda: resource_status("notebook", "research") == {small.uuid: "Unhealthy"},
                WAIT_S,
            )
            status = kubelet.sync_node_status()
            assert {r: status.allocatable[r] for r in MIG_RESOURCES} == dict.fromkeys(
                MIG_RESOURCES, 0
            )
            assert {r: status.capacity[r] for r in MIG_RESOURCES} == dict.fromkeys(MIG_RESOURCES, 1)

            # Recovery after the quiet period, on every count.
            assert poll(
                lambda: resource_status("infer-0", "inference") == {held["infer-0"]: "Healthy"},
                QUIET_S + WAIT_S,
            )
            assert poll(
                lambda: resource_status("notebook", "research") == {small.uuid: "Healthy"},
                QUIET_S + WAIT_S,
            )
            assert poll(lambda: kubelet.sync_node_status().allocatable == everything, WAIT_S)
        finally:
            exporter.stop()
