"""Spec validation, the spec file forms, SimNode argument checks and the control CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuquota.sim.nvml import cli
from gpuquota.sim.nvml.control import SimError, SimNode
from gpuquota.sim.nvml.spec import load


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"model": "B200", "count": 1}, "unknown GPU model 'B200'"),
        ({"model": "A100-SXM4-40GB", "mig": ["9g.99gb"]}, "unknown MIG profile '9g.99gb'"),
        ({"model": "L4", "mig": ["1g.5gb"]}, "L4 does not support MIG"),
        ({"model": "A100-SXM4-40GB", "mig": ["4g.20gb", "4g.20gb"]}, "need 8 slices"),
        ({"model": "A100-SXM4-40GB", "mig": ["1g.5gb"] * 8}, "at most 7"),
        ({"model": "L4", "count": 0}, "count must be a positive integer"),
        ({"model": "L4", "count": 17}, "at most 16"),
        ({"gpus": "L4"}, "a list of {model, count} entries"),
        ({"gpus": [{"model": "L4", "colour": "red"}]}, "unknown key(s): colour"),
        ({"model": "L4", "nvlink": "some"}, "nvlink must be"),
        ({"model": "L4", "count": 2, "nvlink": [[0, 1]]}, "GPU 0 (L4) has no NVLink"),
        ({"model": "H100-SXM5-80GB", "count": 2, "nvlink": [[0, 5]]}, "no GPU with index 5"),
        ("no-such-preset", "unknown preset 'no-such-preset'"),
        ({"model": "L4", "turbo": True}, "unknown spec key(s): turbo"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(spec, message):
    with pytest.raises(ValueError) as err:
        load(spec)
    assert message in str(err.value)


def test_spec_from_yaml_text_and_files(tmp_path):
    text = "model: A100-SXM4-40GB\ncount: 2\nmig: [3g.20gb, 3g.20gb]\n"
    from_text = load(text)
    path = tmp_path / "node.yaml"
    path.write_text(text)
    from_file = load(str(path))
    json_path = tmp_path / "node.json"
    json_path.write_text(
        json.dumps({"model": "A100-SXM4-40GB", "count": 2, "mig": ["3g.20gb"] * 2})
    )
    assert from_text == from_file == load(str(json_path))
    assert [m.placement_start for m in from_text.gpus[0].mig] == [0, 4]
    with pytest.raises(ValueError, match="does not exist"):
        load(str(tmp_path / "missing.yaml"))


def test_set_refuses_unknown_fields_and_bad_values(make_node):
    node = make_node("l4x2")
    with pytest.raises(ValueError, match="unknown simulated field 'wattage'"):
        node.set(0, wattage=3)
    with pytest.raises(ValueError, match="ratio between 0 and 1"):
        node.set(0, gpu_utilization_ratio=87)
    with pytest.raises(ValueError, match="no GPU 2"):
        node.set(2, power_watts=1)
    with pytest.raises(ValueError, match="must be a number"):
        node.set(0, power_watts="hot")
    node.set(0, power_watts=40, gpu_utilization_ratio=0.5)
    assert node.get(0, "power_watts") == 40.0
    assert "gpu_utilization_ratio" in node.fields()


def test_attach_sees_changes_made_through_another_handle(make_node, tmp_path):
    node = make_node("l4x2")
    with SimNode.attach(node.path) as other:
        other.set(1, gpu_temperature_celsius=77)
        assert node.get(1, "gpu_temperature_celsius") == 77
        assert other.uuid(1) == node.uuid(1)
    bogus = tmp_path / "bogus.state"
    bogus.write_text("not a state file")
    with pytest.raises(SimError, match="not a state file"):
        SimNode.attach(bogus)
    with pytest.raises(SimError, match="No such file"):
        SimNode.attach(tmp_path / "absent.state")


def test_cli_drives_a_node(tmp_path, sim_library, capsys):
    state = str(tmp_path / "cli.state")
    assert cli.main([state, "create", "mixed"]) == 0
    assert cli.main([state, "set", "0", "power_watts=321", "clock_event_reasons=0x20"]) == 0
    assert cli.main([state, "lose", "3"]) == 0
    assert cli.main([state, "fail", "system", "nvmlSystemGetDriverVersion", "999"]) == 0
    assert cli.main([state, "process", "1", "77", "1024"]) == 0
    assert cli.main([state, "xid", "2", "43", "--gi", "1", "--ci", "0"]) == 0
    with SimNode.attach(state) as node:
        assert node.get(0, "power_watts") == 321
        assert node.get(0, "clock_event_reasons") == 0x20
        assert node.get(3, "lost") == 1
    capsys.readouterr()
    assert cli.main([state, "show"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 4 and shown[3].endswith("lost") and "MIG x3" in shown[2]
    assert cli.main([state, "set", "0", "volts=3"]) == 2
    assert "unknown simulated field 'volts'" in capsys.readouterr().err
    assert cli.main([state, "create", "nonsense"]) == 2


def test_cli_runs_as_a_module(tmp_path, sim_library):
    state = str(tmp_path / "m.state")
    out = subprocess.run(
        [sys.executable, "-m", "gpuquota.sim.nvml", state, "create", "l4x2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0 and "2 GPUs" in out.stdout
    env = subprocess.run(
        [sys.executable, "-m", "gpuquota.sim.nvml", state, "env"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"GPUQUOTA_SIM_STATE={state}" in env.stdout


@pytest.mark.parametrize(
    "content",
    [b"gpus: [\n", b"- 1\n", "\u00ff\u00fe".encode("latin-1") + bytes(range(40))],
    ids=["unclosed-yaml", "not-a-mapping", "binary"],
)
def test_malformed_spec_file_is_one_line(tmp_path: Path, content: bytes) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_bytes(content)
    result = subprocess.run(
        [sys.executable, "-m", "gpuquota.sim.nvml", str(tmp_path / "state"), "create", str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"python -m gpuquota.sim.nvml: error: spec file {spec}")


def test_stand_in_lives_outside_site_packages_when_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuquota.sim.nvml import build

    assert build.default_out() == build.REPO_ROOT / "build" / "sim" / build.SONAME
    # as from an installed wheel: the package's parents are site-packages, not a checkout
    monkeypatch.setattr(build, "REPO_ROOT", tmp_path / "lib" / "python3.11")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert build.default_out() == tmp_path / "cache" / "gpuquota" / "sim" / build.SONAME
