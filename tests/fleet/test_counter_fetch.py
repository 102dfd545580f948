"""The fleet history's fetch through the agents' own change counter
(gpu_history_changes_total, issue 37), on a real Prometheus and a real VictoriaMetrics serving
series written here: the counter decides which GPUs are busy for the agents that say it, the
agents' silences and restarts make all their GPUs busy, agents without it are asked the old
way, and the history is the one every sample gives.

Agents (one per node, scraped every 15 s; the window [T, T + 300), max_gap 60):

- q: one GPU, nothing changes (quiet);
- c: its correctable remapped rows go from 0 to 1 at T + 100 (its counter 0 -> 1);
- l: a reason appears at T + 100 but its counter says no change: the counter decides (an
  agent that lies about its changes is believed; here it shows what is read);
- o: an agent without the counter (older): GPU o1 gets a reason at T + 100, o2 nothing;
- s: silent in [T + 100, T + 220) (two minutes);
- r: restarts at T + 150 without a silence (a new start time; its counter from 0 again);
- g: two GPUs; g2 goes at T + 200 while the agent goes on reporting g1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gpuquota.quota.fleet import changes, rules, source
from gpuquota.sim import vmserver
from tests.fleet import counted
from tests.fleet import test_silences as silences
from tests.fleet.test_history import dump
from tests.prometheus import create_blocks, serving

STEP = 15
WINDOW = 300
MAX_GAP = 60
T = (int(time.time()) // 3600 - 3) * 3600
BORN, END = T - 600, T + 1200
CHANGE = T + 100
GPUS = {"q": ("q",), "c": ("c",), "l": ("l",), "o": ("o1", "o2"), "s": ("s",), "r": ("r",), "g": ("g1", "g2")}  # fmt: skip
BUSY = {"GPU-c", "GPU-o1", "GPU-s", "GPU-r", "GPU-g2"}
QUIET = {"GPU-q", "GPU-l", "GPU-o2", "GPU-g1"}


def openmetrics() -> str:
    families: dict[str, tuple[str, list[str]]] = {}
    lying: list[str] = []  # the liar's reason, left out of what its counter counts

    def add(name: str, kind: str, labels: dict[str, str], value: float, t: int) -> str:
        family = name.removesuffix("_total") if kind == "counter" else name
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        line = f"{name}{{{text}}} {float(value):.17g} {t}"
        families.setdefault(family, (kind, []))[1].append(line)
        return line

    for t in range(BORN, END, STEP):
        for agent, gpus in GPUS.items():
            if agent == "s" and CHANGE <= t < CHANGE + 120:
                continue
            node = f"node-{agent}"
            labels = {"node": node, "instance": f"{node}:9400"}
            started = BORN - 1000 if agent != "r" or t < T + 150 else T + 145
            add(changes.START, "gauge", labels, started, t)
            for i, gpu in enumerate(gpus):
                if gpu == "g2" and t >= T + 200:
                    continue
                base = {**labels, "gpu": str(i), "uuid": f"GPU-{gpu}"}
                info = {**base, "serial": f"S-{gpu}", "model": "NVIDIA H100 80GB HBM3"}
                add("gpu_info", "gauge", info, 1, t)
                for state in ("healthy", "degraded", "unhealthy"):
                    sick = gpu in ("l", "o1") and t >= CHANGE
                    now = "degraded" if sick else "healthy"
                    if gpu != "l":
                        add("gpu_health_state", "gauge", {**base, "state": state}, state == now, t)  # fmt: skip
                    else:  # the liar's verdict stays as its counter says: healthy
                        add("gpu_health_state", "gauge", {**base, "state": state}, state == "healthy", t)  # fmt: skip
                add("gpu_health_since_timestamp_seconds", "gauge", base, BORN, t)
                if gpu in ("l", "o1") and t >= CHANGE:
                    line = add("gpu_health_reason", "gauge", {**base, "reason": "ecc_sbe_rate", "action": "none"}, 1, t)  # fmt: skip
                    if gpu == "l":
                        lying.append(line)
                rows = 1 if gpu == "c" and t >= CHANGE else 0
                add("gpu_remapped_rows_total", "counter", {**base, "cause": "correctable"}, rows, t)  # fmt: skip

    def text(leave_out: list[str]) -> str:
        out = []
        for family, (kind, lines) in families.items():
            out.append(f"# TYPE {family} {kind}")
            out += [line for line in lines if line not in leave_out]
        return "\n".join(out) + "\n# EOF\n"

    said = counted.counter_lines(text(lying), skip=frozenset({"node-o:9400"}))
    families[changes.COUNTER.removesuffix("_total")] = ("counter", said)
    return text([])


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """This module's series and the silences' series with counters (tests/fleet/counted.py),
    each in a real Prometheus and a real VictoriaMetrics."""
    work = tmp_path_factory.mktemp("counter")
    texts = {"agents": openmetrics(), "silences": counted.with_counter(silences.openmetrics())}
    urls = {}
    with (
        vmserver.serving(work / "vm-agents") as vm_agents,
        vmserver.serving(work / "vm-silences") as vm_silences,
    ):
        vmserver.import_text(vm_agents, [silences.vm_lines(texts["agents"])])
        vmserver.import_text(vm_silences, [silences.vm_lines(texts["silences"])])
        urls["vm-agents"], urls["vm-silences"] = vm_agents.url, vm_silences.url
        for name, text in texts.items():
            (work / name).mkdir()
            create_blocks(text, work / name / "tsdb", work / name)
        with serving(work / "agents" / "tsdb", work / "agents") as p1, serving(work / "silences" / "tsdb", work / "silences") as p2:  # fmt: skip
            urls["prom-agents"], urls["prom-silences"] = p1.url, p2.url
            yield urls


@pytest.mark.parametrize("store", ["prom", "vm"])
@pytest.mark.parametrize("legacy_pieces", [changes.LEGACY_PIECES, 0])
def test_the_counter_picks_the_busy_gpus_and_older_agents_are_asked_the_old_way(
    stores: dict[str, str], store: str, legacy_pieces: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``legacy_pieces`` 0: the older agents are too many to name, every agent is asked the
    old way too."""
    monkeypatch.setattr(changes, "LEGACY_PIECES", legacy_pieces)
    url = stores[f"{store}-agents"]
    lo, hi = T - MAX_GAP, T + WINDOW + MAX_GAP
    found = changes.find(url, source.GPU_METRICS, lo, hi, MAX_GAP, 30.0)
    assert found is not None
    busy, quiet = found
    # asked of every agent, the old way finds the liar's reason too
    assert {uuid for uuid, _, _ in busy} == BUSY | ({"GPU-l"} if legacy_pieces == 0 else set())
    assert {q.info["uuid"] for q in quiet} == QUIET - ({"GPU-l"} if legacy_pieces == 0 else set())
    assert {q.info["uuid"]: q.state for q in quiet}["GPU-o2"] == "healthy"
    if legacy_pieces == 0:
        return
    # the history of every sample, but for the liar's reason
    by_changes = source.fetch(url, T, WINDOW, MAX_GAP, 30.0)
    by_samples = source.fetch(url, T, WINDOW, MAX_GAP, 30.0, by_changes=False)
    # the busy GPUs asked in answers of about 10 samples: runs of one GPU, slices of time
    assert source.fetch(url, T, WINDOW, MAX_GAP, 30.0, max_samples=10) == by_changes
    histories = [rules.window_history(*got, {}, T, T + WINDOW, MAX_GAP) for got in (by_changes, by_samples)]  # fmt: skip
    one, other = (sorted([*map(repr, h.events), *map(repr, h.stretches)]) for h in histories)
    liar = "serial='S-l'"
    assert [x for x in one if liar not in x] == [x for x in other if liar not in x]
    assert any("serial='S-o1'" in x and "Event" in x for x in one)


def test_with_counters_changes_give_the_history_of_every_sample(
    stores: dict[str, str], ledger_sqlite_url: str, cluster: str
) -> None:
    """The silences' agents (silences, restarts with and without one, a new board, XIDs
    across them) with counters, ingested window by window both ways, store the same rows on
    both stores."""
    for store in ("prom", "vm"):
        url = stores[f"{store}-silences"]
        by_samples, by_changes = f"{cluster}-{store}-samples", f"{cluster}-{store}-changes"
        silences.ingested(url, ledger_sqlite_url, by_samples, silences.END + 300, by_changes=False)  # fmt: skip
        silences.ingested(url, ledger_sqlite_url, by_changes, silences.END + 300)
        samples = dump(ledger_sqlite_url, by_samples)
        assert samples["stretches"] and samples["events"]
        assert dump(ledger_sqlite_url, by_changes) == samples, store
