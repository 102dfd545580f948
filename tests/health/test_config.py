"""The health configuration file: overrides, additions, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuquota.exporter.health.config import (
    RulesConfigError,
    defaults,
    load_config,
    parse_config,
    parse_defaults,
)
from gpuquota.exporter.health.engine import DeviceTracker
from gpuquota.exporter.health.verdict import Action, State
from tests.health.factory import gpu, node

YAML = """
quiet_period_seconds: 30
xids:
  13: {state: healthy, action: none}
  999: {state: unhealthy, action: reset_gpu, description: vendor specific}
unknown_xid: {state: unhealthy, action: reset_gpu}
conditions:
  nvlink_errors: {state: healthy, action: none}
  hw_slowdown: {state: unhealthy}
"""


def test_defaults_without_a_file() -> None:
    config = load_config(None)
    assert config.quiet_period_s == defaults().quiet_period_s == 300
    assert config.xid_rule(79).state is State.UNHEALTHY


def test_file_overrides_and_adds(tmp_path: Path) -> None:
    path = tmp_path / "health.yaml"
    path.write_text(YAML)
    config = load_config(path)
    assert config.quiet_period_s == 30
    assert (config.xid_rule(13).state, config.xid_rule(13).action) == (State.HEALTHY, Action.NONE)
    assert config.xid_rule(13).mnemonic == "ROBUST_CHANNEL_GR_EXCEPTION"  # untouched fields kept
    assert config.xid_rule(999).description == "vendor specific"
    assert config.xid_rule(12345).state is State.UNHEALTHY
    assert config.conditions["hw_slowdown"].state is State.UNHEALTHY
    assert config.conditions["hw_slowdown"].action is Action.NONE
    assert config.xid_rule(48).state is State.UNHEALTHY  # untouched rows kept


def test_overrides_drive_the_state_machine(tmp_path: Path) -> None:
    path = tmp_path / "health.yaml"
    path.write_text(YAML)
    t = DeviceTracker(load_config(path))
    t.observe_snapshot(node(gpu(0)), now=0)
    assert t.observe_xid("GPU-00000000", 13, at=1).devices[0].state is State.HEALTHY
    h = t.observe_xid("GPU-00000000", 999, at=2)
    assert h.devices[0].state is State.UNHEALTHY
    assert t.expire(32).devices[0].state is State.HEALTHY  # quiet period from the file


def test_flag_wins_over_file(tmp_path: Path) -> None:
    path = tmp_path / "health.yaml"
    path.write_text(YAML)
    assert load_config(path, quiet_period_s=5).quiet_period_s == 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("xids: {48: {state: broken}}", "xids.48.state: unknown health state 'broken'"),
        ("xids: {48: {action: explode}}", "xids.48.action: unknown action 'explode'"),
        ("xids: {forty: {state: healthy}}", "xids.forty: an XID must be an integer"),
        ("xids: {777: {state: unhealthy}}", "xids.777: a new XID needs both state and action"),
        ("xids: {48: {colour: red}}", "xids.48: unknown key(s) ['colour']"),
        ("xids: [1, 2]", "xids: expected a mapping"),
        (
            "conditions: {overheating: {state: healthy}}",
            "conditions.overheating: unknown condition",
        ),
        ("quiet_period_seconds: soon", "quiet_period_seconds: not a number"),
        ("quiet_period_seconds: -1", "quiet period must be > 0"),
        ("quiet_period_seconds: 0", "quiet period must be > 0"),
        ("colour: red", "unknown key(s) ['colour']"),
        ("- just a list", "expected a mapping"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "health.yaml"
    path.write_text(text)
    with pytest.raises(RulesConfigError) as err:
        load_config(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(RulesConfigError, match="cannot read health config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("xids: {48: [unclosed")
    with pytest.raises(RulesConfigError, match="not valid YAML") as info:
        load_config(bad)
    # issue 18 (fails on 6c36c52: PyYAML's five-line excerpt): one line, with the position
    assert "\n" not in str(info.value) and "line 1, column " in str(info.value)


def test_empty_file_is_defaults() -> None:
    assert parse_config(None).xid_rule(79).action is Action.REBOOT_NODE


DEFAULTS_HEAD = """
quiet_period_seconds: 300
catalog_actions:
  IGNORE: {state: healthy, action: none}
  RESET_GPU: {state: unhealthy, action: reset_gpu}
unknown_xid: {state: degraded, action: none}
conditions: {}
"""


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("62: {mnemonic: PMU, description: halt, catalog: RESET_GPU, state: unhealthy}",
         "xids.62: state/action repeat what catalog_actions gives RESET_GPU: leave them out"),
        ("45: {mnemonic: X, description: y, catalog: WORKFLOW_XID_45, state: healthy}",
         "xids.45: catalog bucket WORKFLOW_XID_45 has no verdict in catalog_actions"),
        ("8: {mnemonic: X, catalog: IGNORE}", "xids.8: description is missing"),
        ("8: {mnemonic: X, description: y, catalog: IGNORE, colour: red}", "unknown key(s) ['colour']"),
    ],
)  # fmt: skip
def test_the_defaults_name_a_verdict_only_where_it_differs_from_the_bucket(
    rows: str, message: str
) -> None:
    data = yaml.safe_load(DEFAULTS_HEAD + "xids:\n  " + rows + "\n")
    with pytest.raises(RulesConfigError) as err:
        parse_defaults(data, "defaults.yaml")
    assert message in str(err.value)


def test_the_defaults_take_the_bucket_verdict_or_their_own() -> None:
    rows = (
        "  62: {mnemonic: PMU, description: halt, catalog: RESET_GPU}\n"
        "  92: {mnemonic: SBE, description: sbe, catalog: IGNORE, state: degraded}\n"
        "  45: {mnemonic: X, description: y, catalog: WORKFLOW_XID_45, state: healthy, action: none}\n"
    )
    config = parse_defaults(yaml.safe_load(DEFAULTS_HEAD + "xids:\n" + rows))
    verdicts = {x: (r.state, r.action) for x, r in config.xid_rules.items()}
    assert verdicts == {
        62: (State.UNHEALTHY, Action.RESET_GPU),
        92: (State.DEGRADED, Action.NONE),
        45: (State.HEALTHY, Action.NONE),
    }


def test_shipped_conditions_read_from_clock_event_bits_are_the_slowdowns() -> None:
    assert defaults().clock_event_bits() == {
        "hw_slowdown": 0x8,
        "sw_thermal_slowdown": 0x20,
        "hw_thermal_slowdown": 0x40,
        "hw_power_brake_slowdown": 0x80,
    }
