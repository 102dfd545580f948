"""Benchmark: the node agent's memory with every production feature on, to size its request.

Runs ``gpu-exporter`` with the arguments of the DaemonSet that ``kubectl kustomize
deploy/examples/production`` builds (device plugin, node taint and condition, pod usage and
its counters, TLS and basic auth; DRA attribution with ``--dra``: the build's DRA variant)
over the stand-ins of one 8-GPU H100 node with one pod per GPU, each with a process: the NVML
stand-in, the kubelet's pod-resources API, the API server listing the node's pods, a /proc
tree. It is scraped over HTTPS with basic auth every second for ``--seconds``; then VmRSS and
the peak VmHWM come from /proc/<pid>/status. Paths, the listen address and the kubeconfig
are the only arguments changed (as in tests/deploy/test_composition.py).

    .venv/bin/python -m bench.agent_memory                      # this checkout
    git archive 4b1b947 | tar -x -C /tmp/gq-main && .venv/bin/python -m bench.agent_memory --tree /tmp/gq-main

``--tree`` runs another checkout's exporter code (its gpuquota package on PYTHONPATH; the
compiled kubelet API stubs are this checkout's) with the same arguments.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpuquota.sim.apiserver import ApiServer
from gpuquota.sim.harness import free_port, stop_process
from gpuquota.sim.kubelet.podresources import Assignment, PodResourcesServer
from gpuquota.sim.ledgerdemo import DemoPod, pod_object
from gpuquota.sim.nvml.control import SimNode

ROOT = Path(__file__).resolve().parents[1]
NODE = "bench-node"


def production_args(dra: bool) -> list[str]:
    """The gpu-exporter arguments of the production build (or its DRA variant)."""
    kubectl = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
    folder = ROOT / "deploy" / "examples" / "production"
    with tempfile.TemporaryDirectory() as tmp:
        if dra:  # the example's comment: dra instead of device-plugin on DRA nodes
            copy = Path(tmp) / "deploy"
            shutil.copytree(ROOT / "deploy", copy)
            text = (copy / "examples/production/kustomization.yaml").read_text()
            (copy / "examples/production/kustomization.yaml").write_text(
                text.replace("components/device-plugin", "components/dra")
            )
            folder = copy / "examples" / "production"
        out = subprocess.run(
            [kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=True
        ).stdout
    for doc in yaml.safe_load_all(out):
        if doc and doc["kind"] == "DaemonSet" and doc["metadata"]["name"] == "gpu-exporter":
            return list(doc["spec"]["template"]["spec"]["containers"][0]["args"])
    raise SystemExit("no gpu-exporter DaemonSet in the production build")


def memory_mb(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    values = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M))
    return int(values["VmRSS"]) / 1024, int(values["VmHWM"]) / 1024


def secrets(folder: Path) -> tuple[str, str]:
    """The tls-auth Secrets' files (generate.py) in ``folder``; (user, password)."""
    subprocess.run(
        [sys.executable, str(ROOT / "deploy/components/tls-auth/generate.py"), "--out",
         str(folder)], check=True, capture_output=True,
    )  # fmt: skip
    return (folder / "username").read_text(), (folder / "password").read_text()


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gqm-", dir="/tmp"))
    try:
        web = work / "web"
        user, password = secrets(web)
        plugins = work / "device-plugins"
        plugins.mkdir()
        proc_root = work / "proc"
        node = SimNode.create(work / "nvml.state", "h100x8")
        port = free_port()
        checkpoint = plugins / "kubelet_internal_checkpoint"  # the pods' UIDs, as the kubelet
        with (
            ApiServer() as api,
            PodResourcesServer(work / "kubelet.sock", checkpoint=checkpoint) as kubelet,
        ):
            assignments = []
            for i in range(node.gpu_count):
                uid = f"be0c0000-0000-4000-8000-{i:012x}"
                cid = f"{i:x}".rjust(64, "c")
                pod = DemoPod("team", f"train-{i}", uid, NODE, "nvidia.com/gpu",
                              (node.uuid(i),), cid)  # fmt: skip
                api.apply("ADDED", pod_object(pod, time.time() - 60))
                assignments.append(
                    Assignment("team", pod.name, "main", pod.resource, pod.device_ids, uid)
                )
                (proc_root / str(5000 + i)).mkdir(parents=True)
                (proc_root / str(5000 + i) / "cgroup").write_text(f"0::/kubepods/pod{uid}/{cid}\n")
                node.add_process(i, 5000 + i, 8 * 2**30)
                node.set_process_utilization(i, 5000 + i, sm=0.9, memory=0.3)
                node.set_gpm(i, sm_activity=0.9)
            kubelet.set_assignments(assignments)
            argv = []
            for arg in production_args(args.dra):
                flag = arg.split("=", 1)[0]
                arg = {
                    "--listen": f"--listen=127.0.0.1:{port}",
                    "--pod-resources-socket": f"--pod-resources-socket={work / 'kubelet.sock'}",
                    "--web.config.file": f"--web.config.file={web / 'web-config.yml'}",
                    "--device-checkpoint": f"--device-checkpoint={checkpoint}",
                }.get(flag, arg)
                argv.append(arg)
            argv += [f"--kubeconfig={api.write_kubeconfig(work / 'kubeconfig')}",
                     f"--proc-root={proc_root}", f"--device-plugin-dir={plugins}",
                     f"--node-name={NODE}"]  # fmt: skip
            env = {**os.environ, **node.env()}
            if args.tree:
                env["PYTHONPATH"] = str(args.tree)
            log = (work / "exporter.log").open("wb")
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuquota.exporter.cli", *argv],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=args.tree or ROOT,
            )  # fmt: skip
            context = ssl.create_default_context(cafile=str(web / "ca.crt"))
            context.check_hostname = False  # the certificate names the Service, not 127.0.0.1
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            request = urllib.request.Request(
                f"https://127.0.0.1:{port}/metrics", headers={"Authorization": f"Basic {token}"}
            )
            scrapes, body = 0, b""
            deadline = time.monotonic() + args.seconds
            try:
                while time.monotonic() < deadline:
                    if proc.poll() is not None:
                        raise SystemExit(f"exporter exited: {(work / 'exporter.log').read_text()}")
                    try:
                        with urllib.request.urlopen(request, timeout=5, context=context) as answer:
                            body = answer.read()
                            scrapes += 1
                    except OSError:
                        pass
                    time.sleep(1)
                rss, hwm = memory_mb(proc.pid)
            finally:
                stop_process(proc)
                log.close()
        counters = len(re.findall(rb"^gpu_pod_used_seconds_total\{", body, re.M))
        if not scrapes or counters < node.gpu_count:
            raise SystemExit(f"the agent did not serve every feature ({counters} counters); "
                             f"log: {(work / 'exporter.log').read_text()[-2000:]}")  # fmt: skip
        return {"rss_mb": rss, "hwm_mb": hwm, "scrapes": scrapes, "args": argv}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long it runs, scraped")
    parser.add_argument("--tree", type=Path, help="another checkout's exporter code")
    parser.add_argument("--dra", action="store_true", help="the production build's DRA variant")
    args = parser.parse_args(argv)
    result = run(args)
    flags = " ".join(a for a in result["args"] if not a.startswith(("--kubeconfig", "--proc-root",
                                                                      "--device-plugin-dir",
                                                                      "--device-checkpoint",
                                                                      "--pod-resources-socket",
                                                                      "--web.config", "--listen")))  # fmt: skip
    print(f"gpu-exporter {flags}: VmRSS {result['rss_mb']:.1f} MB, peak VmHWM "
          f"{result['hwm_mb']:.1f} MB after {result['scrapes']} scrapes over TLS + basic auth")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
