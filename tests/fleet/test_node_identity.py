"""The fleet history knows a node by the agent's own node label (issue 38): real gpu-exporters
on the NVML stand-in, restarted on another address and port (as a new agent pod gets a new IP),
scraped by a real Prometheus with no relabeling (deploy/base's annotation scraping), the history
ingested from it into a real store. Before the agent said its node, the history's node was the
scrape target's IP:port and every restart recorded every board as moved."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import yaml

from gpuquota.quota.fleet import ingest
from gpuquota.quota.fleet.write import FleetStore
from gpuquota.quota.ledger.ingest import LedgerSettings
from gpuquota.quota.store.db import open_store
from gpuquota.sim.harness import free_port, stop_process, wait_for
from gpuquota.sim.ledgerdemo import node_object
from gpuquota.sim.nvml.control import SimNode
from gpuquota.sim.promserver import serving
from tests.exporter.procs import base_env
from tests.fleet.test_history import dump, events

NODE = "gpu-node-7"
WINDOW = 60
# two agent pods of one node, one after the other: a new address and port each (127.0.0.2 is
# loopback too)
ADDRESSES = ("127.0.0.1", "127.0.0.2")


def start_agent(work: Path, node: SimNode, address: str) -> tuple[subprocess.Popen[bytes], str]:
    """An agent with the DaemonSet's NODE_NAME on ``address``, serving, and its target. A port
    free when chosen may be taken before the agent binds it (other tests run beside this one):
    the agent then exits, and another port is tried."""
    for _ in range(3):
        port = free_port()
        log = work / f"agent-{port}.log"
        with log.open("wb") as out:
            agent = subprocess.Popen(
                [sys.executable, "-m", "gpuquota.exporter.cli", f"--listen={address}:{port}",
                 "--interval=1", "--pod-resources-socket="],
                env=base_env(**node.env(), NODE_NAME=NODE), stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_for(
            lambda a=agent, p=port: a.poll() is not None or _serving(address, p), 30, "the agent"
        )  # type: ignore[misc]
        if agent.poll() is None:
            return agent, f"{address}:{port}"
    raise AssertionError(f"no agent started on {address}: {log.read_text()}")


def _serving(address: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=2):
            return True
    except OSError:
        return False


def test_an_agent_restarted_on_a_new_address_moves_no_board(
    tmp_path: Path, db_url: str, cluster: str
) -> None:
    # the targets in a file Prometheus watches: each agent's port is chosen when it starts
    listed = tmp_path / "targets.json"
    listed.write_text("[]")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "gpu-exporter",
                            "file_sd_configs": [{"files": [str(listed)], "refresh_interval": "1s"}]}],
    }))  # fmt: skip
    began = int(time.time())
    with ExitStack() as stack:
        node = stack.enter_context(
            SimNode.create(tmp_path / "nvml.state", {"gpus": [{"model": "H100-SXM5-80GB", "count": 2}]})
        )  # fmt: skip
        prometheus = stack.enter_context(serving(config, tmp_path / "tsdb"))

        def scraped(target: str) -> bool:
            """Both GPUs' health read from ``target`` in three scrapes at least."""
            promql = f'count_over_time(gpu_health_state{{instance="{target}", state="healthy"}}[1m]) >= 3'
            query = urllib.parse.urlencode({"query": f"count({promql})"})
            with urllib.request.urlopen(f"{prometheus.url}/api/v1/query?{query}", timeout=5) as r:
                result = yaml.safe_load(r)["data"]["result"]
            return bool(result) and result[0]["value"][1] == "2"

        ran = []  # (from, to) of each agent
        for address in ADDRESSES:
            agent, target = start_agent(tmp_path, node, address)
            stack.callback(stop_process, agent)
            listed.write_text(json.dumps([{"targets": [target]}]))
            start = time.time()
            wait_for(lambda t=target: scraped(t), timeout=30, what=f"{target} scraped")  # type: ignore[misc]
            stop_process(agent)
            ran.append((start, time.time()))
        ended = int(time.time()) + 1
        # the history of every window the agents ran in, as the controller's ledger ingests it
        settings = LedgerSettings(prometheus_url=prometheus.url, window=WINDOW, lookback=0)
        with open_store(db_url) as store:
            fleet = FleetStore(store, cluster)
            for start in range(began - began % WINDOW, ended, WINDOW):
                ingest.ingest_window(fleet, settings, start)

    history = dump(db_url, cluster)
    assert len(history["boards"]) == 2
    # every stretch on the agent's node, none on a scrape target's address, and the history
    # holds both agents' readings
    assert {stretch[4] for stretch in history["stretches"]} == {NODE}
    for lo, hi in ran:
        assert any(s[1] <= hi and s[2] >= lo for s in history["stretches"]), (lo, hi, history)
    for serial, *_ in history["boards"]:
        moves = events(history, serial, "identity")
        assert len(moves) == 1, moves  # first seen; never moved

    # `gpuquota gpus --by pool`: the pool of the controller's record of the Node (its pool
    # label, --node-pool-label), found by the node's name in the same cluster (here replayed,
    # as the controller records it); with the scrape target's IP:port as the node, (unknown)
    recorded = tmp_path / "node.jsonl"
    node_event = {
        "type": "ADDED",
        "object": node_object(NODE, {"karpenter.sh/nodepool": "h100-a"}, {"nvidia.com/gpu": "2"}),
    }
    recorded.write_text(json.dumps(node_event) + "\n")
    replayed = subprocess.run(
        [sys.executable, "-m", "gpuquota.quota.cli", "replay", "--db", db_url, "--cluster", cluster, str(recorded)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    by_pool = subprocess.run(
        [sys.executable, "-m", "gpuquota.quota.cli", "gpus", "--db", db_url, "--cluster", cluster,
         "--by", "pool", "--json", "--last", "1h"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert by_pool.returncode == 0, by_pool.stderr
    groups = json.loads(by_pool.stdout)["groups"]
    assert [(g["group"], g["gpus"]) for g in groups] == [("h100-a", 2)], groups
