"""When gpu-exporter turns DRA support on, and how bad DRA flags are reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuquota.exporter.app import KubeConfigUnavailableError, build_dra
from gpuquota.exporter.cli import build_parser
from gpuquota.sim.apiserver import ApiServer


def args(*argv: str):
    return build_parser().parse_args(list(argv))


def test_dra_support_is_off_without_an_api_server_or_when_told(monkeypatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert build_dra(args("--node-name=n")) is None  # auto, no API server
    assert build_dra(args("--dra=off", "--node-name=n")) is None
    # in a pod without a service account token (the base DaemonSet): off, not fatal
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert build_dra(args("--node-name=n")) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--dra=off", "--dra-device-taints"), "--dra-device-taints needs DRA support"),
        (("--dra=on",), "need --node-name"),
        (("--dra=on", "--node-name=n", "--dra-drivers=,"), "--dra-drivers"),
    ],
)
def test_bad_dra_settings_name_the_flag(argv: tuple[str, ...], message: str, monkeypatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(ValueError, match=message):
        build_dra(args(*argv))


def test_an_unusable_kubeconfig_is_an_environment_error() -> None:
    with pytest.raises(
        KubeConfigUnavailableError, match=r"--dra needs the Kubernetes API: .*nonexistent"
    ):
        build_dra(args("--dra=on", "--node-name=n", "--kubeconfig=/nonexistent"))


def test_bad_taint_effect_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        args("--dra-taint-effect=PreferNoSchedule")
    assert exc.value.code == 2
    assert "--dra-taint-effect" in capsys.readouterr().err


def test_dra_on_with_a_kubeconfig_builds_the_node_side(tmp_path: Path) -> None:
    with ApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        dra = build_dra(args("--node-name=n", f"--kubeconfig={kubeconfig}", "--dra-device-taints"))
        assert dra is not None and dra.taints is not None
        assert set(dra.watcher.kube.field_selectors.values()) == {"spec.nodeName=n"}
