"""The accounting rules (docs/accounting.md), one behaviour per test."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from gpuquota.quota import accounting as acc
from tests.accounting.objects import container, namespace, node, pod, quota


def units(p: dict[str, Any]) -> dict[str, int]:
    return acc.effective_units(p)


# --- timestamps and quantities ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("2026-01-01T00:00:00Z", 1767225600),
        ("2026-01-01T00:00:00.999999Z", 1767225600),
        ("2026-01-01T01:00:00+01:00", 1767225600),
        (1767225600, 1767225600),
        (None, None),
    ],
)
def test_parse_time(text: object, seconds: int | None) -> None:
    assert acc.parse_time(text, "t") == seconds
    if isinstance(seconds, int):
        assert acc.parse_time(acc.format_time(seconds), "t") == seconds


@pytest.mark.parametrize("bad", ["yesterday", "2026-13-01T00:00:00Z", True, {"a": 1}])
def test_parse_time_rejects_garbage_naming_the_field(bad: object) -> None:
    with pytest.raises(acc.AccountingError, match=r"status\.startTime"):
        acc.parse_time(bad, "status.startTime")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", 2),
        (3, 3),
        ("500m", Decimal("0.5")),
        ("1Gi", 2**30),
        ("1k", 1000),
        ("1e3", 1000),
        ("0.5", Decimal("0.5")),
    ],
)
def test_parse_quantity(text: object, value: object) -> None:
    assert acc.parse_quantity(text, "q") == value


@pytest.mark.parametrize("bad", ["two", "1Xi", "", None, True, "--1"])
def test_parse_quantity_rejects_garbage(bad: object) -> None:
    with pytest.raises(acc.AccountingError, match="q"):
        acc.parse_quantity(bad, "q")


def test_bad_gpu_quantity_in_a_pod_names_the_container() -> None:
    p = pod()
    p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "lots"
    with pytest.raises(
        acc.AccountingError, match=r"spec\.containers\[0\]\.resources\.requests\['nvidia.com/gpu'\]"
    ):
        acc.pod_facts(p)


# --- which resources are GPUs ------------------------------------------------------------------


def test_default_gpu_resources() -> None:
    config = acc.DEFAULT_CONFIG
    for name in (
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-3g.40gb",
        "amd.com/gpu",
    ):
        assert config.is_gpu(name)
    for name in ("cpu", "memory", "nvidia.com/gpumem", "example.com/fpga", "ephemeral-storage"):
        assert not config.is_gpu(name)


def test_configured_gpu_resources() -> None:
    config = acc.AccountingConfig(gpu_resources=("example.com/tpu",), gpu_resource_prefixes=())
    p = pod(containers=[container(gpus=2, resource="example.com/tpu"), container("b", gpus=1)])
    assert acc.effective_units(p, config) == {"example.com/tpu": 2}


# --- effective request -------------------------------------------------------------------------


def test_regular_containers_add_up() -> None:
    p = pod(containers=[container("a", 1), container("b", 2), container("c", 0)])
    assert units(p) == {"nvidia.com/gpu": 3}


def test_request_falls_back_to_limit_only_when_absent() -> None:
    p = pod(containers=[container("a", 2, limits_only=True)])
    assert units(p) == {"nvidia.com/gpu": 2}
    p = pod(containers=[container("a", 1)])
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "4"  # request wins
    assert units(p) == {"nvidia.com/gpu": 1}


def test_init_container_peak_wins_over_smaller_app() -> None:
    p = pod(containers=[container("a", 1)], init_containers=[container("init", 4)])
    assert units(p) == {"nvidia.com/gpu": 4}


def test_sidecars_add_to_app_and_to_later_init_containers() -> None:
    p = pod(
        containers=[container("app", 1)],
        init_containers=[
            container("setup", 2),  # runs alone: 2
            container("proxy", 1, restart_policy="Always"),  # sidecar, keeps running
            container("warmup", 3),  # runs next to the proxy: 4
        ],
    )
    assert units(p) == {"nvidia.com/gpu": 4}
    p = pod(
        containers=[container("app", 4)],
        init_containers=[container("warmup", 3), container("proxy", 1, restart_policy="Always")],
    )
    assert units(p) == {"nvidia.com/gpu": 5}  # app 4 + sidecar 1 beats init peak 3


def test_overhead_is_added_and_per_resource_independent() -> None:
    p = pod(
        containers=[container("a", 1), container("m", 2, "nvidia.com/mig-1g.10gb")],
        init_containers=[container("i", 3, "nvidia.com/mig-1g.10gb")],
        overhead={"nvidia.com/gpu": "1", "cpu": "250m"},
    )
    assert units(p) == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 3}


def test_pod_without_gpus() -> None:
    assert units(pod(gpus=0)) == {}
    assert units({"kind": "Pod", "metadata": {"uid": "x", "name": "y"}}) == {}


# --- QoS and the BestEffort warning ----------------------------------------------------------


def test_gpu_only_pod_is_best_effort_and_flagged() -> None:
    request = acc.pod_request(pod(cpu=None))
    assert request.qos_class == "BestEffort"
    assert request.best_effort_gpu
    assert request.warnings and "BestEffort" in request.warnings[0]


def test_pod_with_cpu_request_is_not_flagged() -> None:
    request = acc.pod_request(pod(cpu="1"))
    assert request.qos_class == "Burstable"
    assert not request.best_effort_gpu
    assert request.warnings == ()


def test_guaranteed_and_served_qos_class() -> None:
    p = pod(cpu=None)
    p["spec"]["containers"][0]["resources"]["limits"].update({"cpu": "1", "memory": "1Gi"})
    assert acc.qos_class(p) == "Guaranteed"
    p["status"]["qosClass"] = "Burstable"  # the API server's word wins
    assert acc.qos_class(p) == "Burstable"
    assert not acc.pod_request(pod(gpus=0, cpu=None)).best_effort_gpu  # no GPUs: no warning


# --- the quota view ----------------------------------------------------------------------------


def test_quota_view_counts_pending_and_unscheduled_pods() -> None:
    assert acc.in_quota_view(acc.pod_facts(pod(phase="Pending", node=None, start=None)), 5000)
    assert acc.in_quota_view(acc.pod_facts(pod()), 5000)


def test_quota_view_drops_terminal_pods() -> None:
    assert not acc.in_quota_view(acc.pod_facts(pod(phase="Succeeded", finished=1200)), 1300)
    assert not acc.in_quota_view(acc.pod_facts(pod(phase="Failed")), 1300)


def test_quota_view_keeps_terminating_pods_until_deletion_plus_grace() -> None:
    facts = acc.pod_facts(pod(deletion=2000, grace=30))
    assert acc.in_quota_view(facts, 2030)
    assert not acc.in_quota_view(facts, 2031)


# --- the billing view --------------------------------------------------------------------------


def end(p: dict[str, Any], observed_at: int = 0, **evidence: int) -> acc.BillingEnd | None:
    facts = acc.pod_facts(p)
    assert facts.started_at is not None
    merged = acc.observed_evidence(facts, observed_at).merge(acc.EndEvidence(**evidence))
    return acc.billing_end(facts.started_at, merged)


def test_running_pod_has_no_end() -> None:
    assert end(pod(), 1500) is None


def test_terminal_pod_ends_at_latest_finished_at() -> None:
    p = pod(phase="Succeeded", finished=1500)
    p["status"]["initContainerStatuses"] = [
        {"name": "sidecar", "state": {"terminated": {"finishedAt": acc.format_time(1502)}}},
        {"name": "init", "state": {"terminated": {"finishedAt": acc.format_time(1015)}}},
    ]
    assert end(p, 1600) == acc.BillingEnd(1502, acc.END_TERMINATED, False)


def test_terminal_pod_without_finished_at_ends_when_observed() -> None:
    assert end(pod(phase="Failed"), 1600) == acc.BillingEnd(1600, acc.END_TERMINATED, False)


def test_restarts_do_not_end_the_interval() -> None:
    p = pod()
    p["status"]["containerStatuses"] = [
        {
            "name": "main",
            "restartCount": 3,
            "state": {"running": {"startedAt": acc.format_time(1400)}},
            "lastState": {"terminated": {"finishedAt": acc.format_time(1390)}},
        }
    ]
    assert end(p, 1500) is None


def test_earliest_of_deletion_timestamp_deleted_event_and_node_deletion() -> None:
    p = pod(deletion=2000)
    assert end(p, 1900) == acc.BillingEnd(2000, acc.END_DELETION_TIMESTAMP, False)
    assert end(p, 1900, deleted_at=1950) == acc.BillingEnd(1950, acc.END_DELETED, False)
    assert end(p, 1900, deleted_at=1950, node_deleted_at=1940) == acc.BillingEnd(
        1940, acc.END_NODE_DELETED, False
    )
    done = pod(deletion=2000, phase="Succeeded", finished=1930)
    assert end(done, 1935, deleted_at=1950) == acc.BillingEnd(1930, acc.END_TERMINATED, False)


def test_vanished_is_an_estimate_that_any_observation_overrides() -> None:
    assert end(pod(), 1500, vanished_at=1800) == acc.BillingEnd(1800, acc.END_VANISHED, True)
    assert end(pod(), 1500, vanished_at=1800, deleted_at=1900) == acc.BillingEnd(
        1900, acc.END_DELETED, False
    )


def test_end_before_start_is_an_empty_interval() -> None:
    assert end(pod(start=1010, deletion=1000), 1005) == acc.BillingEnd(
        1010, acc.END_DELETION_TIMESTAMP, False
    )


def test_facts_of_a_pod() -> None:
    facts = acc.pod_facts(
        pod(
            owner=("ReplicaSet", "web-5d4f8c"),
            labels={"pod-template-hash": "5d4f8c"},
            deletion=1900,
            grace=5,
        )
    )
    assert (facts.owner_kind, facts.owner_name) == ("Deployment", "web")
    assert (
        facts.started_at,
        facts.created_at,
        facts.deletion_at,
        facts.deletion_grace_seconds,
    ) == (1010, 1000, 1900, 5)
    facts = acc.pod_facts(pod(owner=("Job", "nightly")))
    assert (facts.owner_kind, facts.owner_name) == ("Job", "nightly")
    with pytest.raises(acc.AccountingError, match=r"metadata\.uid: missing"):
        acc.pod_facts({"metadata": {"name": "x"}})


# --- physical-GPU equivalents ------------------------------------------------------------------


def test_whole_gpu_node() -> None:
    gpus = acc.node_gpus(node())
    assert (gpus.gpu_model, gpus.gpu_count, gpus.node_pool, gpus.allocatable) == (
        "NVIDIA-H100-80GB-HBM3",
        8,
        "h100",
        {"nvidia.com/gpu": 8},
    )
    assert acc.physical_gpus("nvidia.com/gpu", 2, gpus) == 2.0


def test_time_slicing_replica_is_a_fraction_and_shared_suffix_is_stripped() -> None:
    gpus = acc.node_gpus(
        node(
            product="NVIDIA-A10G-SHARED",
            count=2,
            allocatable={"nvidia.com/gpu": 8},
            replicas=4,
            sharing="time-slicing",
        )
    )
    assert gpus.gpu_model == "NVIDIA-A10G"
    share = acc.physical_share("nvidia.com/gpu", gpus)
    assert (share.per_unit, share.replicas, share.sharing_strategy) == (0.25, 4, "time-slicing")
    renamed = acc.node_gpus(
        node(
            product="Tesla-T4",
            count=1,
            allocatable={"nvidia.com/gpu.shared": 2},
            replicas=2,
            sharing="mps",
        )
    )
    assert acc.physical_share("nvidia.com/gpu.shared", renamed) == acc.PhysicalShare(0.5, 2, "mps")


def test_shared_suffix_without_replicas_label_derives_replicas_from_capacity() -> None:
    gpus = acc.node_gpus(
        node(product="NVIDIA-L4-SHARED", count=2, allocatable={"nvidia.com/gpu": 6})
    )
    assert gpus.replicas == 3
    assert acc.physical_gpus("nvidia.com/gpu", 3, gpus) == pytest.approx(1.0)


def test_mig_profiles_are_compute_slices_of_seven() -> None:
    assert acc.physical_gpus("nvidia.com/mig-1g.10gb", 1, None) == pytest.approx(1 / 7)
    assert acc.physical_gpus("nvidia.com/mig-3g.40gb", 2, None) == pytest.approx(6 / 7)
    assert acc.physical_gpus("nvidia.com/mig-7g.80gb", 1, None) == 1.0
    assert acc.physical_gpus("nvidia.com/mig-1g.10gb+me", 1, None) == pytest.approx(1 / 7)
    override = acc.AccountingConfig(mig_profile_share={"1g.10gb": 0.125})
    assert acc.physical_gpus("nvidia.com/mig-1g.10gb", 2, None, override) == 0.25
    assert acc.physical_gpus("nvidia.com/mig-weird", 1, None) == 1.0


def test_single_strategy_mig_node_exposes_mig_as_nvidia_gpu() -> None:
    gpus = acc.node_gpus(
        node(product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", count=28, mig_strategy="single")
    )
    assert (gpus.gpu_model, gpus.mig_profile) == ("NVIDIA-A100-SXM4-40GB", "1g.5gb")
    assert acc.physical_gpus("nvidia.com/gpu", 7, gpus) == pytest.approx(1.0)
    assert acc.physical_share("nvidia.com/gpu", gpus).mig_profile == "1g.5gb"
    assert acc.physical_share("nvidia.com/mig-2g.20gb", None).mig_profile == "2g.20gb"
    assert acc.physical_share("nvidia.com/gpu", None).mig_profile is None


def test_unknown_node_counts_whole_gpus_and_amd() -> None:
    assert acc.physical_gpus("nvidia.com/gpu", 3, None) == 3.0
    amd = acc.node_gpus(node(product=None, count=None, allocatable={"amd.com/gpu": 8}))
    assert acc.physical_gpus("amd.com/gpu", 2, amd) == 2.0


def test_hand_typed_bad_labels_do_not_stop_accounting() -> None:
    n = node(replicas=4)
    n["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "four"
    assert acc.node_gpus(n).replicas is None


# --- namespaces, quotas, time ------------------------------------------------------------------


def test_namespace_labels() -> None:
    assert acc.namespace_labels(namespace("ml", {"team": "x"}, created=5)) == (
        "ml",
        {"team": "x"},
        5,
        None,
    )


def test_quota_gpu_lines_and_scopes() -> None:
    q = quota(hard=8, used=3, scopes=["NotBestEffort"])
    q["status"]["hard"]["requests.nvidia.com/mig-1g.10gb"] = "4"
    q["spec"]["scopeSelector"] = {
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]
    }
    facts = acc.quota_facts(q)
    assert facts.scopes == ("NotBestEffort", "PriorityClass In high")
    assert facts.figures == (
        acc.QuotaFigure("requests.nvidia.com/gpu", 8.0, 3.0),
        acc.QuotaFigure("requests.nvidia.com/mig-1g.10gb", 4.0, None),
    )


def test_quota_spec_hard_until_status_catches_up() -> None:
    q = quota(hard=None, used=None)
    q["spec"]["hard"] = {"requests.nvidia.com/gpu": "2"}
    assert acc.quota_facts(q).figures == (acc.QuotaFigure("requests.nvidia.com/gpu", 2.0, None),)


def test_latest_timestamp_of_an_object() -> None:
    p = pod(start=1010, finished=1500, phase="Succeeded")
    p["metadata"]["managedFields"] = [{"time": acc.format_time(9999)}]
    assert acc.latest_timestamp(p) == 1500
    assert acc.latest_timestamp({"kind": "Pod"}) is None
