"""Every build whose agent is the kubelet device plugin rolls it out with a surge (issue 38):
the new agent starts beside the old one and is Ready only once registered, and only then does
the old one go. With maxUnavailable the node had no plugin between the two, and a GPU pod
admitted in that gap failed for good with UnexpectedAdmissionError (tests/deviceplugin/
test_end_to_end.py::test_surge_rollout_keeps_the_gpus_schedulable runs the agents' side)."""

from __future__ import annotations

import pytest

from tests.deploy.manifests import OVERLAYS, built, components_of, find, needs_kubectl

PLUGIN_BUILDS = [f for f in OVERLAYS if "device-plugin" in components_of(f)]


def test_some_builds_serve_the_device_plugin() -> None:
    assert "examples/production" in PLUGIN_BUILDS


@needs_kubectl
@pytest.mark.parametrize("folder", PLUGIN_BUILDS)
def test_a_device_plugin_agent_rolls_out_with_a_surge(folder: str) -> None:
    daemonset = find(built(folder), "DaemonSet", "gpu-exporter")
    assert "--device-plugin" in daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    strategy = daemonset["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}, folder
