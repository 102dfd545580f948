"""`gpu-exporter` as a subprocess against the NVML stand-in (node.env()): end to end, and
every way the command line refuses to start."""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuquota.exporter import cli
from gpuquota.sim.nvml.control import SimNode
from tests.exporter.procs import Exporter, base_env, run_cli
from tests.exporter.scrape import parse, value


def test_end_to_end_scrape_and_clean_shutdown(
    make_node: Callable[..., SimNode], start_exporter: Callable[..., Exporter], promtool: str
) -> None:
    node = make_node("mixed")
    node.set(1, power_watts=250.0)
    exporter = start_exporter(node, "--interval", "200ms", "--hostname", "gpu-node-9")
    status, body = exporter.get("/metrics")
    assert status == 200
    samples = parse(body)
    assert value(samples, "gpu_power_watts", uuid=node.uuid(1)) == 250
    assert value(samples, "gpuquota_exporter_devices", kind="gpu") == 4
    assert value(samples, "gpuquota_exporter_devices", kind="mig") == 3
    check = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert exporter.get("/healthz")[0] == 200

    exporter.proc.send_signal(signal.SIGTERM)
    exporter.proc.wait(timeout=10)
    assert exporter.proc.returncode == 0, exporter.log.read_text()


def test_compat_dcgm_and_pod_labels_flags(
    make_node: Callable[..., SimNode], start_exporter: Callable[..., Exporter]
) -> None:
    node = make_node("l4x2")
    exporter = start_exporter(node, "--compat", "dcgm", "--pod-labels", "--hostname", "n-1")
    samples = parse(exporter.get("/metrics")[1])
    labels = {"gpu": "0", "UUID": node.uuid(0), "Hostname": "n-1", "device": "nvidia0"}
    assert value(samples, "DCGM_FI_DEV_GPU_TEMP", **labels) > 0
    assert value(samples, "DCGM_FI_DEV_FB_FREE", modelName="NVIDIA L4", **labels) > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compat", "foo"], "invalid compat mode 'foo' (choose from dcgm)"),
        (["--interval", "-1"], "invalid duration '-1'"),
        (["--interval", "10ms"], "below the minimum of 100ms"),
        (["--interval", "soon"], "invalid duration 'soon'"),
        (["--listen", "9400"], "invalid listen address '9400'"),
        (["--listen", ":99999"], "invalid listen address ':99999'"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--liveness-timeout", "soon"], "invalid duration 'soon'"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("gpu-exporter: error: ")
    assert message in err


def test_slow_interval_below_interval_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--interval", "2s", "--slow-interval", "1s"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--slow-interval 1s is shorter than --interval 2s" in err


def test_bad_web_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "web.yml"
    config.write_text("basic_auth_users:\n  prom: hunter2\n")
    assert cli.main(["--web.config.file", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "must be a bcrypt hash" in err


@pytest.mark.parametrize("value", ["2x", "1s"])
def test_liveness_timeout_shorter_than_readiness_exits_2(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--interval", "1s", "--liveness-timeout", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--liveness-timeout" in err and "3 x --interval" in err


def test_liveness_timeout_is_a_duration_or_a_multiple_of_the_interval() -> None:
    assert cli.liveness_timeout(None, 0.5) == 10.0  # 10 intervals, at least 10 s
    assert cli.liveness_timeout(None, 2.0) == 20.0
    args = cli.build_parser().parse_args(["--liveness-timeout", "12x"])
    assert cli.liveness_timeout(args.liveness_timeout, 2.0) == 24.0
    args = cli.build_parser().parse_args(["--liveness-timeout", "1m30s"])
    assert cli.liveness_timeout(args.liveness_timeout, 2.0) == 90.0


def test_missing_nvml_library_says_what_to_do() -> None:
    result = run_cli(env=base_env(LD_LIBRARY_PATH="/nonexistent"))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    for hint in ("libnvidia-ml.so.1", "install the NVIDIA driver", "mount the driver", "make demo"):
        assert hint in result.stderr


def test_no_gpus(make_node: Callable[..., SimNode]) -> None:
    node = make_node({"gpus": []})
    result = run_cli(env=base_env(**node.env()))
    assert result.returncode == 1
    assert "NVML reports no GPUs" in result.stderr


def test_port_in_use(make_node: Callable[..., SimNode]) -> None:
    node = make_node("l4x2")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("--listen", f"127.0.0.1:{port}", env=base_env(**node.env()))
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        f"cannot listen on 127.0.0.1:{port}: the port is already in use"
    )


def test_nvml_init_failure(make_node: Callable[..., SimNode]) -> None:
    node = make_node("l4x2")
    node.fail_call(None, "nvmlInit", 9)  # NVML_ERROR_DRIVER_NOT_LOADED
    result = run_cli(env=base_env(**node.env()))
    assert result.returncode == 1
    assert "kernel driver is not loaded" in result.stderr


@pytest.mark.parametrize(
    ("flags", "env", "needle"),
    [
        # not in a cluster and no kubeconfig at all
        ([], {"KUBECONFIG": "/nonexistent/kubeconfig", "HOME": "/nonexistent"}, "Kubernetes API"),
        (["--kubeconfig", "/nonexistent"], {}, "kubeconfig /nonexistent"),
    ],
    ids=["no-kubeconfig", "missing-kubeconfig"],
)
def test_node_condition_without_kubernetes_is_one_line(
    make_node: Callable[..., SimNode], flags: list[str], env: dict[str, str], needle: str
) -> None:
    node = make_node("l4x2")
    result = run_cli(
        "--node-condition", "--node-name", "n1", *flags, env=base_env(**node.env(), **env)
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("gpu-exporter: error: --node-taint/--node-condition need")
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_interval_is_logged_in_the_duration_grammar(
    make_node: Callable[..., SimNode], start_exporter: Callable[..., Exporter]
) -> None:
    exporter = start_exporter(make_node("l4x2"), "--interval", "1h30m")
    exporter.proc.send_signal(signal.SIGTERM)
    exporter.proc.wait(timeout=10)
    log = exporter.log.read_text()
    assert "collecting every 1h30m" in log, log
