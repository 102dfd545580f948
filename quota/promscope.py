"""One cluster's series in a store that holds several: a label matcher added to every vector
selector of a PromQL query.

Thanos, Mimir, VictoriaMetrics or a Prometheus shared by several clusters tell the clusters'
series apart by a label (an external label, or a target label put on at scrape), by convention
``cluster`` (the kubernetes-mixin's ``clusterLabel``). Every query the usage ledger, the fleet
history and ``gpuquota report --prometheus`` ask goes through ``scoped`` (promhttp does it when
given a scope), so none can read another cluster's series, whatever its shape: adding the
matcher where each query is written would leave the next query written to forget it.

``scoped`` knows enough of PromQL's grammar for that: strings, ``{...}`` matchers, ``[...]``
ranges, the label lists after ``by``/``without``/``on``/``ignoring``/``group_left``/
``group_right``, keywords and function calls; every other name is a metric. Grafana's template
variables (``$name``, ``${name}``), which are no PromQL, are copied as they are: the dashboards'
queries go through ``scoped`` too (dashboards/clusters.py), with ``keeping``, which puts the
cluster label into every ``by`` and ``on`` list so that no aggregation or join adds up or
matches two clusters' series.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# what a label name may be (Prometheus' legacy name rule: every store takes it)
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# numbers and durations: 0x1f, 1.5, 1e-3, 5m, 1h30m
_NUMBER = re.compile(
    r"0[xX][0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?(?:(?:ms|[smhdwy])(?:[0-9]+(?:ms|[smhdwy]))*)?"
)
# a Grafana variable written $name
_VARIABLE = re.compile(r"\$\w*")
# names followed by a list of label names in parentheses, not by an expression
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
# aggregations may have their ``by`` before their parentheses: never metrics
_AGGREGATIONS = {
    *("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"),
    *("bottomk", "topk", "quantile", "limitk", "limit_ratio"),
}
_KEYWORDS = _LABEL_LISTS | _AGGREGATIONS | {"and", "or", "unless", "bool", "offset", "atan2"}
_KEYWORDS |= {"inf", "nan"}


@dataclass(frozen=True)
class Scope:
    """The series of one cluster: those whose ``label`` is ``value``; no label: every series
    (one cluster per store, the default)."""

    label: str = ""
    value: str = ""

    def __post_init__(self) -> None:
        if self.label and not LABEL_NAME.fullmatch(self.label):
            raise ValueError(f"{self.label!r} is not a label name (letters, digits and _)")

    def __bool__(self) -> bool:
        return bool(self.label)

    @property
    def matcher(self) -> str:
        """The matcher, e.g. ``cluster="prod-eu1"`` (empty without a label)."""
        if not self.label:
            return ""
        value = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.label}="{value}"'


def scoped(promql: str, scope: Scope | None) -> str:
    """``promql`` with ``scope``'s matcher in every vector selector (``promql`` itself without
    a scope). ValueError for a query it cannot read (an unclosed string or bracket)."""
    if not scope:
        return promql
    matcher = scope.matcher
    out: list[str] = []
    i, n = 0, len(promql)
    while i < n:
        c = promql[i]
        if c in "\"'`":
            end = _string_end(promql, i)
            out.append(promql[i:end])
            i = end
        elif c == "{":  # a selector without a metric name before it
            end = _close(promql, i, "{", "}")
            out.append(_with_matcher(promql[i:end], matcher))
            i = end
        elif c == "[":  # a range or a subquery's range and step: no selector inside
            end = _close(promql, i, "[", "]")
            out.append(promql[i:end])
            i = end
        elif c == "$":  # a Grafana variable: $name or ${name}, never a metric
            end = _variable_end(promql, i)
            out.append(promql[i:end])
            i = end
        elif c == "#":  # a comment, to the end of its line
            end = promql.find("\n", i)
            end = n if end < 0 else end
            out.append(promql[i:end])
            i = end
        elif c.isdigit() or (c == "." and i + 1 < n and promql[i + 1].isdigit()):
            m = _NUMBER.match(promql, i)
            assert m is not None
            out.append(m.group())
            i = m.end()
        elif m := _NAME.match(promql, i):
            name, i = m.group(), m.end()
            j = _skip_space(promql, i)
            after = promql[j] if j < n else ""
            out.append(name)
            if name.lower() in _LABEL_LISTS:
                if after == "(":  # its label names: copied as they are
                    end = _close(promql, j, "(", ")")
                    out.append(promql[i:end])
                    i = end
            elif name.lower() in _KEYWORDS or after == "(":
                pass  # a keyword or a function's name
            elif after == "{":
                end = _close(promql, j, "{", "}")
                out.append(promql[i:j] + _with_matcher(promql[j:end], matcher))
                i = end
            else:
                out.append("{" + matcher + "}")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def keeping(promql: str, label: str) -> str:
    """``promql`` with ``label`` in every ``by (...)`` and ``on (...)`` list that lacks it, so
    each aggregation keeps it apart and each join matches on it (``without`` and ``ignoring``
    keep it already). ValueError for a query it cannot read (an unclosed string or bracket)."""
    if not LABEL_NAME.fullmatch(label):
        raise ValueError(f"{label!r} is not a label name (letters, digits and _)")
    out: list[str] = []
    i, n = 0, len(promql)
    while i < n:
        c = promql[i]
        if c in "\"'`":
            end = _string_end(promql, i)
        elif c in "{[":  # matchers, ranges: no label list inside
            end = _close(promql, i, c, "}" if c == "{" else "]")
        elif c == "$":
            end = _variable_end(promql, i)
        elif m := _NAME.match(promql, i):
            end = m.end()
            j = _skip_space(promql, end)
            if m.group().lower() in _LABEL_LISTS and j < n and promql[j] == "(":
                close = _close(promql, j, "(", ")")
                names = [name.strip() for name in promql[j + 1 : close - 1].split(",")]
                names = [name for name in names if name]
                if m.group().lower() in ("by", "on") and label not in names:
                    out.append(f"{promql[i:j]}({', '.join([label, *names])})")
                    i = close
                    continue
                end = close
        else:
            end = i + 1
        out.append(promql[i:end])
        i = end
    return "".join(out)


def _variable_end(text: str, i: int) -> int:
    """The index after the Grafana variable starting at ``i`` (``$name``, ``${name...}``)."""
    if text.startswith("${", i):
        return _close(text, i + 1, "{", "}")
    m = _VARIABLE.match(text, i)
    assert m is not None
    return m.end()


def _with_matcher(braces: str, matcher: str) -> str:
    """``{...}`` with ``matcher`` added last."""
    inside = braces[1:-1].rstrip()
    if not inside:
        return "{" + matcher + "}"
    return "{" + inside + ("" if inside.endswith(",") else ",") + matcher + "}"


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _string_end(text: str, i: int) -> int:
    """The index after the string literal starting at ``i``."""
    quote, j = text[i], i + 1
    while j < len(text):
        if text[j] == "\\" and quote != "`":
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        j += 1
    raise ValueError(f"unclosed string in PromQL {text!r:.200}")


def _close(text: str, i: int, opening: str, closing: str) -> int:
    """The index after the bracket closing the one at ``i`` (strings inside skipped)."""
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c in "\"'`":
            j = _string_end(text, j)
            continue
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise ValueError(f"unclosed {opening!r} in PromQL {text!r:.200}")
