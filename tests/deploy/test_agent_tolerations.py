"""The agent tolerates its own taint, every effect, in every build (issue 38): it is what lifts
the taint, so it must run on a fenced node. The taint key is read from the code that sets it."""

from __future__ import annotations

from typing import Any

import pytest

from gpuquota.exporter.nodestatus.status import TAINT_EFFECTS, TAINT_KEY, TAINT_VALUE
from tests.deploy.manifests import OVERLAYS, built, find, needs_kubectl

# every effect a taint can have (Kubernetes core/v1 TaintEffect), not only those we set today
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def tolerates(toleration: dict[str, Any], key: str, value: str, effect: str) -> bool:
    """Kubernetes' ToleratesTaint: an empty effect matches every effect, an empty key with
    Exists every key; Exists ignores the value, Equal (the default) compares it. A NoExecute
    toleration with tolerationSeconds tolerates only for that long: not here."""
    if toleration.get("effect") and toleration["effect"] != effect:
        return False
    if toleration.get("key", "") not in ("", key):
        return False
    if effect == "NoExecute" and "tolerationSeconds" in toleration:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("key")) and toleration.get("value", "") == value


def test_the_effects_we_set_are_effects_kubernetes_knows() -> None:
    assert set(TAINT_EFFECTS) <= set(EFFECTS)


@needs_kubectl
@pytest.mark.parametrize("folder", OVERLAYS)
def test_the_agent_tolerates_its_own_taint_with_every_effect(folder: str) -> None:
    pod = find(built(folder), "DaemonSet", "gpu-exporter")["spec"]["template"]["spec"]
    for effect in EFFECTS:
        assert any(
            tolerates(t, TAINT_KEY, TAINT_VALUE, effect) for t in pod.get("tolerations", [])
        ), f"{folder}: gpu-exporter does not tolerate {TAINT_KEY}={TAINT_VALUE}:{effect}"


def test_the_matcher_follows_kubernetes() -> None:
    key, value = TAINT_KEY, TAINT_VALUE
    assert tolerates({"key": key, "operator": "Exists"}, key, value, "NoExecute")
    assert tolerates({"operator": "Exists"}, key, value, "PreferNoSchedule")
    assert not tolerates(
        {"key": key, "operator": "Exists", "effect": "NoSchedule"}, key, value, "NoExecute"
    )
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Exists"}, key, value, "NoSchedule")
    assert tolerates({"key": key, "value": value}, key, value, "NoSchedule")
    assert not tolerates({"key": key, "value": "false"}, key, value, "NoSchedule")
    assert not tolerates(
        {"key": key, "operator": "Exists", "tolerationSeconds": 30}, key, value, "NoExecute"
    )
