"""`make demo` is a deliverable: run it whole and check that each act shows what it promises."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_demo_runs_every_act_end_to_end() -> None:
    # a short folder: the kubelet's unix sockets live in it (108 bytes at most per path)
    tmp_path = Path(tempfile.mkdtemp(prefix="gqd", dir="/tmp"))
    try:
        check_demo(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def check_demo(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuquota.sim.demo", "--work", str(tmp_path / "demo")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    # act 1: pod-attributed GPU series
    assert 'gpu_pod_info{gpu="0"' in out and 'namespace="ml-training"' in out
    # act 2: unhealthy in all three channels, then healthy again
    assert "health endpoint: unhealthy - xid_79" in out
    assert 'state="unhealthy"} 1' in out
    assert "Unhealthy\n" in out and "Healthy again" in out
    # act 3: the controller filled the store
    assert "the store caught up with the API server" in out
    # the controller ran on the simulated cluster's clock, not today's
    assert "on the simulated cluster's clock, which starts at 2026-01-01T00:00:00Z" in out
    assert re.search(r"quota admission refused [1-9]\d* pod creations", out)
    # act 4: every view of the calendar month matches the generator's truth (issue 18: the
    # heartbeat, a label change and a node deletion carried today's date, so the month's
    # figures were off and only the demo's own 8-hour window was checked)
    assert "TOTAL" in out and "   OFF" not in out
    assert "the month 2026-01, every view against the generator's truth" in out
    checked = [line for line in out.splitlines() if line.endswith("   exact")]
    assert len([x for x in checked if "cost-center cc-3" in x]) == 2  # before and after relabel
    assert len([x for x in checked if re.match(r" +NVIDIA-L4 / l4 ", x)]) == 1  # node deleted
    assert len([x for x in checked if x.lstrip().startswith("quota ")]) >= 8
    assert len(checked) >= 25
    # a rate card prices, it never measures; the idle table's allocated GPU-h are the usage
    # table's (issue 36: 182.77 against 181.95)
    assert any(x.lstrip().startswith("physical GPU-h: usage table") for x in checked)
    # quota, the namesake: per namespace and resource, in the workload's own clock
    assert "Quota use" in out and "nvidia.com/mig-1g.10gb" in out
    # DRA: a namespace whose GPUs came through ResourceClaims, beside device-plugin usage, its
    # device-class quota, and the DRA node's devices as idle capacity
    assert "claim_allocations" in out and "gpuquota_namespace_dra_gpus_allocated" in out
    assert re.search(r"team-dra +dra +\d", out) and re.search(r"team-a +device-plugin +\d", out)
    assert "gpu.nvidia.com.deviceclass.resource.k8s.io/devices" in out
    assert re.search(r"NVIDIA-H100-80GB-HBM3 +h100-dra +[1-9]", out)
    # exact commands to rerun on the kept store
    assert "gpuquota report --db=sqlite:///" in out and "--month=2026-01" in out
    assert (tmp_path / "demo" / "gpuquota.db").is_file()
    # act 5 (issue 19): the usage ledger against the stand-in's truth, through a real
    # Prometheus and a restarted exporter and controller
    ledger = out[out.index("== 5. The usage ledger") :]
    within = re.findall(r"^ +(inference|vision|research) .* within 1 %$", ledger, re.M)
    assert sorted(within) == ["inference", "research", "vision"], ledger
    assert re.search(r"^ +ml .* coverage shown$", ledger, re.M), ledger
    assert "gpu-a's exporter restarted" in ledger and "restarting the controller" in ledger
    assert "used GPU-h" in ledger and "energy kWh" in ledger and "coverage %" in ledger
    assert "vision/notebook-idle: idle since" in ledger
    # act 6 (issue 29): every GPU's health history by serial against the stand-in's record:
    # a relapse, a board moved to another node, a spare in its slot
    fleet = out[out.index("== 6. Every GPU's health history") :]
    exact = [line for line in fleet.splitlines() if line.endswith("   exact")]
    assert len(exact) == 8 and "OFF" not in fleet, fleet
    assert any(line.lstrip().startswith("relapses of") for line in exact)
    # issue 37: the relapse on the scrape after the release (no healthy pause before it), and
    # the command shown runs as shown (with its store)
    assert "again on the scrape after the release" in fleet
    assert re.search(r"\$ gpuquota gpus --db=sqlite:///\S+ --from=", fleet), fleet
    assert any(line.lstrip().startswith("nodes of") for line in exact)
