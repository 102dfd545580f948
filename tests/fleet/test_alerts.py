"""The fleet-health alerts (GPURelapsed, GPUFencedRepeatedly) fire as their promtool unit
tests say: per board serial, across a move to another node and an agent restart."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.deploy.test_deploy import rule_groups

TESTS = Path(__file__).with_name("fleet_alerts_test.yaml")


def test_fleet_alerts_fire_per_serial(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool (Debian prometheus) is part of the suite"
    groups = [g for g in rule_groups() if g["name"] == "gpu-fleet-health"]
    assert [r["alert"] for r in groups[0]["rules"]] == ["GPURelapsed", "GPUFencedRepeatedly"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(json.dumps({"groups": groups}))
    tests = tmp_path / "tests.yaml"
    tests.write_text(TESTS.read_text().replace("RULES_FILE", str(rules)))
    done = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
