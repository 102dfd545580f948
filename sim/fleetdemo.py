"""Act 6 of `make demo`: every GPU's health history by serial, checked against the stand-in's
own record.

Two simulated GPU nodes of two H100s, each with its real `gpu-exporter` (a short health quiet
period), a real Prometheus scraping them every second, and the real `gpuquota controller`
keeping the fleet history (on the usage ledger's windows). The stand-in is then driven:

- gpu-d GPU 0 gets an XID 79 (fenced), recovers after the quiet period (released), and gets
  another XID 79 soon after (fenced again: a relapse), then recovers;
- the board of gpu-d GPU 1 moves to gpu-e (its serial now under gpu-e's second slot, with a new
  UUID and PCI bus id), a spare board taking its old slot; both agents restart, as after a
  node's maintenance.

`gpuquota gpus` then lists the GPUs worst first, and the moved board's and the relapsed
board's history must match what the demo did to the stand-in.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from gpuquota.sim.kubelet.podresources import PodResourcesServer
from gpuquota.sim.ledgerdemo import BIN, DemoNode, LedgerDemo, node_object
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.workload import rfc3339

QUIET_S = 3  # the agents' --health-quiet-period here (production: minutes)


class FleetDemo(LedgerDemo):
    """The two nodes, the programs, the stand-in's record and the check."""

    def build(self) -> None:
        self.exporter_args = [f"--health-quiet-period={QUIET_S}s"]
        self.proc_root.mkdir()  # no pod processes here
        self.api.start()
        self.stack.callback(self.api.stop)
        self.kubeconfig = self.api.write_kubeconfig(self.work / "kubeconfig")
        for name in ("gpu-d", "gpu-e"):
            folder = self.work / name
            folder.mkdir()
            sim = SimNode.create(folder / "node.state", {"name": name, "gpus": [
                {"model": "H100-SXM5-80GB", "count": 2}]})  # fmt: skip
            self.nodes[name] = DemoNode(name, sim, folder)
            self.api.apply("ADDED", node_object(name, {"nvidia.com/gpu.count": "2"},
                                                {"nvidia.com/gpu": "2"}))  # fmt: skip
        for node in self.nodes.values():
            server = PodResourcesServer(node.work / "pod-resources.sock", ()).start()
            self.stack.callback(server.stop)
            node.pod_resources = server

    def where(self, name: str) -> str:
        """A node as the history names it: its name, which its agent puts on its series."""
        return self.nodes[name].name

    def health(self, uuid: str) -> str:
        found = self.query(f'gpu_health_state{{uuid="{uuid}"}} == 1')
        return str(found[0]["metric"]["state"]) if found else ""

    def fence_and_release(self, sim: SimNode, i: int, record: dict[str, Any]) -> None:
        uuid = sim.uuid(i)
        sim.inject_xid(i, 79)
        self.wait("the XID 79 to fence it", lambda: self.health(uuid) == "unhealthy", 20)
        record["fences"] += 1
        self.wait("its release after the quiet period", lambda: self.health(uuid) == "healthy", 30)
        # healthy for a few scrapes before the next XID, so the history shows the stretch (an
        # XID in the release's own second was once read as no relapse: fence_changes in
        # quota/fleet/summary.py now pairs changes in the order they were seen)
        time.sleep(3)

    def run(self) -> None:
        self.build()
        x, y = self.nodes["gpu-d"], self.nodes["gpu-e"]
        boards = {n.sim.serial(i) for n in (x, y) for i in range(2)}
        relapsed = x.sim.serial(0)
        moved = x.sim.serial(1)
        record: dict[str, Any] = {"fences": 0}
        self.start_stack()
        started = int(time.time())
        self.say("2 GPU nodes of 2 H100s, 2 gpu-exporters, Prometheus, the controller keeping "
                 "the fleet history")  # fmt: skip
        self.wait("every GPU in Prometheus", lambda: len(self.query("gpu_info")) == 4, 40)
        self.say(f"XID 79 on {relapsed} (gpu-d GPU 0), released after {QUIET_S} s, XID 79 "
                 "again: a relapse")  # fmt: skip
        for _ in range(2):
            self.fence_and_release(x.sim, 0, record)
        self.say(f"board {moved} moves from gpu-d GPU 1 to gpu-e GPU 1; a spare takes its slot")
        self.stop_exporter(x)
        self.stop_exporter(y)
        spare = "1650000099999"
        y.sim.set(1, serial=moved, uuid="GPU-5e1d9a00-0000-4000-8000-0000000000f1")
        x.sim.set(1, serial=spare, uuid="GPU-5e1d9a00-0000-4000-8000-0000000000f2")
        time.sleep(5)  # longer than --ledger-max-gap (3 s): a gap in what was seen
        self.start_exporter(x)
        self.start_exporter(y)
        self.wait(f"{moved} on gpu-e", lambda: bool(self.query(
            f'gpu_info{{serial="{moved}", node="{self.where("gpu-e")}"}}')), 30)  # fmt: skip
        time.sleep(5)
        final = int(time.time()) + 1
        self.say("waiting for the controller to ingest the history")
        self.wait(
            "the history to reach the end of the run",
            lambda: self.history_until() >= final,
            timeout=60,
        )
        self.check_history(started, final, relapsed, moved, boards | {spare}, record)

    def history_until(self) -> int:
        with sqlite3.connect(self.work / "ledger.db") as conn:
            row = conn.execute("SELECT ingested_until FROM gpu_history_progress").fetchone()
        return int(row[0]) if row else 0

    def gpus(self, args: list[str]) -> str:
        done = subprocess.run(
            [str(BIN / "gpuquota"), "gpus", f"--db={self.db}", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"demo: gpuquota gpus failed: {done.stderr.strip()}")
        return done.stdout

    def check_history(
        self,
        started: int,
        final: int,
        relapsed: str,
        moved: str,
        boards: set[str],
        record: dict[str, Any],
    ) -> None:
        period = [f"--from={rfc3339(started)}", f"--to={rfc3339(final)}"]
        self.say(f"$ gpuquota gpus {' '.join(period)}")
        self.say(self.gpus(period).rstrip())
        doc = {g["serial"]: g for g in json.loads(self.gpus([*period, "--json"]))["gpus"]}
        worst = doc[relapsed]
        checks = [
            ("fences of " + relapsed, len(worst["fences"]), record["fences"]),
            ("relapses of " + relapsed, worst["relapses"], 1),
            ("fenced of " + relapsed + " > 0", worst["fenced_hours"] > 0, True),
            ("XID 79s of " + relapsed, worst["xids"].get("79", 0), record["fences"]),
            ("nodes of " + moved, doc[moved]["nodes"], [self.where("gpu-d"), self.where("gpu-e")]),
            ("unknown hours of " + moved, doc[moved]["unknown_hours"] > 0, True),
            ("fences of " + moved, len(doc[moved]["fences"]), 0),
            ("boards (4 at the start, and the spare)", sorted(doc), sorted(boards)),
        ]
        self.say("\nthe history against the stand-in's record:")
        off = 0
        for what, got, want in checks:
            ok = got == want
            off += not ok
            self.say(f"    {what:<40} {got!s:>20} {want!s:>20}   {'exact' if ok else 'OFF'}")
        if off:
            raise SystemExit(f"demo: the fleet history is off in {off} figures")


def fleet_act(work: Path) -> None:
    """Act 6 of the demo (see the module's docstring)."""
    folder = work / "fleet"
    folder.mkdir(parents=True)
    with ExitStack() as stack:
        FleetDemo(stack, folder, Path("/dev/null")).run()
