"""Which metric names a PromQL expression reads.

Dashboards and alert rules may only use metrics that exist (the exporter's metric table, the
controller's documented metrics, and the series Prometheus itself adds), and this is how the
tests find out which ones an expression uses. It is a lexical scan, not a full parser: good
for the expressions we write (selectors, functions, aggregations with by/without, binary
operators with on/ignoring/group_*), with Grafana's $variables taken out first.
"""

from __future__ import annotations

import re

# Series Prometheus adds to every scrape target, usable by any rule.
PROMETHEUS_SERIES = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
        "ALERTS",
        "ALERTS_FOR_STATE",
    }
)

_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "inf",
        "nan",
    }
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_LABEL_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects (functions, keywords and label names excluded)."""
    text = _STRING.sub('""', expr)
    text = _GRAFANA_VAR.sub("1", text)
    text = _LABEL_LIST.sub(" ", text)
    text = _LABEL_MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names
