"""The history change counter (gpu_history_changes_total) added to OpenMetrics text the
fleet tests write, as the agents of that text would count it: each scrape's history series
of a GPU are its fingerprint (exporter/expose/history.py, the agent's own rule), compared
with the agent's previous scrape, counted from 0 in each life of the agent (its start time;
an agent that does not say one has one life)."""

from __future__ import annotations

import re

from gpuquota.exporter.expose import history, metrics
from gpuquota.quota.fleet import changes

LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _parse(line: str) -> tuple[str, tuple[tuple[str, str], ...], str, int]:
    head, value, t = line.rsplit(" ", 2)
    name, _, labels = head.partition("{")
    return name, tuple(LABEL.findall(labels)), value, int(float(t))


def with_counter(openmetrics: str, *, skip: frozenset[str] = frozenset()) -> str:
    """``openmetrics`` with each GPU's counter, but for the agents (instances) in ``skip``
    (agents older than the counter)."""
    lines = [f"# TYPE {changes.COUNTER.removesuffix('_total')} counter"]
    lines += counter_lines(openmetrics, skip=skip)
    return openmetrics.removesuffix("# EOF\n") + "\n".join(lines) + "\n# EOF\n"


def counter_lines(openmetrics: str, *, skip: frozenset[str] = frozenset()) -> list[str]:
    """The counter's samples for ``with_counter``, as OpenMetrics lines."""
    said: dict[tuple[str, int], list[history.Rendered]] = {}  # (instance, t) -> series
    lives: dict[tuple[str, int], str] = {}  # (instance, t) -> its start time
    for line in openmetrics.splitlines():
        if not line or line.startswith("#"):
            continue
        name, pairs, value, t = _parse(line)
        instance = dict(pairs).get("instance", "")
        if name == changes.START:
            lives[(instance, t)] = value
        elif name in metrics.HISTORY and instance not in skip:
            said.setdefault((instance, t), []).append((name, pairs, value))
    counters: dict[tuple[str, str], history.ChangeCounter] = {}
    lines = []
    for (instance, t), rendered in sorted(said.items(), key=lambda item: item[0][1]):
        life = (instance, lives.get((instance, t), ""))
        counter = counters.setdefault(life, history.ChangeCounter())
        for uuid, count in counter.update(history.fingerprints(rendered)).items():
            labels = next(pairs for name, pairs, _, in rendered if name == "gpu_info" and dict(pairs)["uuid"] == uuid)  # fmt: skip
            keep = ",".join(f'{k}="{v}"' for k, v in labels if k in ("gpu", "uuid", "node", "instance"))  # fmt: skip
            lines.append(f"{changes.COUNTER}{{{keep}}} {count} {t}")
    return lines
