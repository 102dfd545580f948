"""Two clusters' agents in one Prometheus (Thanos, Mimir, VictoriaMetrics or a shared
Prometheus tell them apart by a ``cluster`` label): the controller's usage ledger and fleet
history, told the label (``--prometheus-cluster-label cluster``), store of their own cluster
exactly what they store from a Prometheus holding that cluster alone; told nothing, they count
the other cluster's pods and boards too.

The scenario (tests/fleet/scenario.py) is served twice: as ``east``, and as ``west`` with other
serials, GPU UUIDs and pod UIDs but the same namespaces and pod names."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from gpuquota.quota.fleet import ingest
from gpuquota.quota.ledger.ingest import Ingester
from gpuquota.quota.promhttp import PrometheusError
from tests.fleet import scenario
from tests.fleet.scenario import D
from tests.fleet.test_history import dump, settings
from tests.ledger.test_ingest import rows
from tests.prometheus import Prometheus, create_blocks, serving

RUN = uuid.uuid4().hex[:8]  # the clusters' names in the shared store are this run's
EAST, WEST = f"east-{RUN}", f"west-{RUN}"
TURNS = (ingest.turn,)  # as the controller passes it


def labelled(openmetrics: str, cluster: str) -> str:
    """Every sample of ``openmetrics`` with a ``cluster`` label, as Thanos' external labels
    or a shared Prometheus' target labels give it."""
    return re.sub(r"^([a-z_:]+)\{", rf'\1{{cluster="{cluster}",', openmetrics, flags=re.M)


def west(openmetrics: str) -> str:
    """Another cluster's agents: other boards, GPUs and pods, in namespaces and under pod names
    that the first cluster uses too."""
    for old, new in (('serial="S', 'serial="W'), ('uuid="GPU-', 'uuid="GPU-W'), ('_uid="u-', '_uid="w-')):  # fmt: skip
        openmetrics = openmetrics.replace(old, new)
    return openmetrics


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("shared")
    text = scenario.openmetrics()
    create_blocks(labelled(text, EAST), work / "tsdb", work)
    create_blocks(labelled(west(text), WEST), work / "tsdb", work)
    with serving(work / "tsdb", work) as prometheus:
        yield prometheus


def run(db_url: str, cluster: str, url: str, label: str = "") -> Ingester:
    """The controller's ledger process, one turn over every window (ledger, then history)."""
    with_label = replace(settings(url), cluster_label=label)
    ingester = Ingester(db_url, cluster, with_label, clock=lambda: D + 300, turns=TURNS)
    try:
        assert ingester.run_once() == 4
    finally:
        ingester.stop()
    return ingester


def test_each_cluster_reads_its_own_series_of_a_shared_prometheus(
    shared: Prometheus, fleet_prometheus: Prometheus, db_url: str, cluster: str
) -> None:
    alone = f"{cluster}-alone"  # the scenario in a Prometheus of its own, no cluster label
    run(db_url, alone, fleet_prometheus.url)
    run(db_url, EAST, shared.url, "cluster")
    history, usage = dump(db_url, alone), rows(db_url, alone)
    assert history["boards"] and usage  # there is something to compare
    assert dump(db_url, EAST) == history
    assert rows(db_url, EAST) == usage
    # the other cluster's: its own boards and pods, none of the first's
    run(db_url, WEST, shared.url, "cluster")
    assert {b[0] for b in dump(db_url, WEST)["boards"]} == {"W1", "W2", "W3"}
    assert {uid for uid, _, _ in rows(db_url, WEST)} == {"w-train", "w-eval"}


def test_without_the_label_one_cluster_counts_the_others_pods(
    shared: Prometheus, db_url: str, cluster: str
) -> None:
    """What the label is for: unscoped, a cluster's ledger and history hold both clusters'."""
    run(db_url, cluster, shared.url)
    assert {b[0] for b in dump(db_url, cluster)["boards"]} == {"S1", "S2", "S3", "W1", "W2", "W3"}
    assert {uid for uid, _, _ in rows(db_url, cluster)} >= {"u-train", "w-train"}


def test_a_label_no_series_carries_is_refused(
    shared: Prometheus, db_url: str, cluster: str
) -> None:
    """A label the queried endpoint does not see (a Prometheus' own external labels are
    added only to what leaves it: federation, remote write, Thanos' sidecar) would select
    nothing, and the ledger would record empty windows as if nothing ran: refused instead,
    naming the label."""
    ingester = Ingester(
        db_url,
        cluster,
        replace(settings(shared.url), cluster_label="region"),
        clock=lambda: D + 300,
        turns=TURNS,
    )
    try:
        with pytest.raises(PrometheusError, match=r"no series.* the label 'region'"):
            ingester.run_once()
    finally:
        ingester.stop()
