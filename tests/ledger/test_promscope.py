"""The cluster matcher in every vector selector and the cluster label in every by/on list
(quota/promscope.py): each shape of PromQL the product and its dashboards ask, and the label
names and values it is given. (Against a real Prometheus holding two
clusters: tests/fleet/test_clusters.py and tests/report/test_prometheus.py.)"""

from __future__ import annotations

import argparse

import pytest

from gpuquota.quota.options import add_prometheus_cluster_label_option
from gpuquota.quota.promscope import Scope, keeping, scoped

EAST = Scope("cluster", "east")
M = 'cluster="east"'


@pytest.mark.parametrize(
    ("promql", "want"),
    [
        ("gpu_info", f"gpu_info{{{M}}}"),
        ("gpu_info[60s]", f"gpu_info{{{M}}}[60s]"),
        ('gpu_info{uuid=~"GPU-.*"}', f'gpu_info{{uuid=~"GPU-.*",{M}}}'),
        ('gpu_info {uuid="a",}', f'gpu_info {{uuid="a",{M}}}'),
        ("gpu_info{}", f"gpu_info{{{M}}}"),
        ('{__name__=~"a|b",uuid=~".*[0f]"}[61s]', f'{{__name__=~"a|b",uuid=~".*[0f]",{M}}}[61s]'),
        # label lists, aggregations before and after them, keywords, functions, numbers
        ("max by (uuid, node) (x) > 1", f"max by (uuid, node) (x{{{M}}}) > 1"),
        ("sum(x) without (pod)", f"sum(x{{{M}}}) without (pod)"),
        (
            "a != on (uuid) group_left () b or c unless d and bool e",
            f"a{{{M}}} != on (uuid) group_left () b{{{M}}} or c{{{M}}} unless d{{{M}}} and bool e{{{M}}}",
        ),
        ("a * on (u) group_right (ns, pod) b", f"a{{{M}}} * on (u) group_right (ns, pod) b{{{M}}}"),
        (
            "count_over_time(count_over_time(x[5s])[60s:5s]) < scalar(count_over_time(vector(1)[60s:5s]))",
            f"count_over_time(count_over_time(x{{{M}}}[5s])[60s:5s]) < scalar(count_over_time(vector(1)[60s:5s]))",
        ),
        ("x offset 5m", f"x{{{M}}} offset 5m"),
        (
            "x offset 1h30m + 1e-3*y - 0x1f/z",
            f"x{{{M}}} offset 1h30m + 1e-3*y{{{M}}} - 0x1f/z{{{M}}}",
        ),
        ("a*1+b", f"a{{{M}}}*1+b{{{M}}}"),
        ("rate(x[5m] @ start())", f"rate(x{{{M}}}[5m] @ start())"),
        ("(sum(x) or vector(0)) + 1e3 * Inf", f"(sum(x{{{M}}}) or vector(0)) + 1e3 * Inf"),
        (
            'label_replace(x, "by", "$1", "on", "(.*)")',
            f'label_replace(x{{{M}}}, "by", "$1", "on", "(.*)")',
        ),
        ('x{a="}{,\\"b"}', f'x{{a="}}{{,\\"b",{M}}}'),
        ("job:gpu:sum", f"job:gpu:sum{{{M}}}"),
        # Grafana's variables (dashboards' queries) are no metrics
        (
            "sum(avg_over_time(x[$__range])) * $__range_s / ${__interval_ms}",
            f"sum(avg_over_time(x{{{M}}}[$__range])) * $__range_s / ${{__interval_ms}}",
        ),
    ],
)
def test_every_selector_gets_the_matcher(promql: str, want: str) -> None:
    assert scoped(promql, EAST) == want


def test_no_scope_leaves_the_query_alone() -> None:
    assert scoped("max by (uuid) (gpu_info)", None) == "max by (uuid) (gpu_info)"
    assert scoped("max by (uuid) (gpu_info)", Scope()) == "max by (uuid) (gpu_info)"


def test_label_values_are_quoted_and_names_checked() -> None:
    assert Scope("cluster", 'a"b\\c').matcher == 'cluster="a\\"b\\\\c"'
    with pytest.raises(ValueError, match="not a label name"):
        Scope("clu-ster", "east")
    with pytest.raises(ValueError, match="unclosed"):
        scoped('x{a="b}', EAST)


def test_the_flag_refuses_what_is_not_a_label_name(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="gpuquota report")
    add_prometheus_cluster_label_option(parser)
    assert (
        parser.parse_args(["--prometheus-cluster-label", "cluster"]).prometheus_cluster_label
        == "cluster"
    )
    with pytest.raises(SystemExit) as exit:
        parser.parse_args(["--prometheus-cluster-label", "k8s-cluster"])
    assert exit.value.code == 2
    assert "'k8s-cluster' is not a Prometheus label name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("promql", "want"),
    [
        ("sum by (namespace) (x)", "sum by (cluster, namespace) (x)"),
        ("sum(x) by(a,b) / on() group_left (c) y", "sum(x) by(cluster, a, b) / on(cluster) group_left (c) y"),
        ("max by (uuid, cluster) (x)", "max by (uuid, cluster) (x)"),
        # without and ignoring keep it already; matchers, strings and variables are no lists
        ("sum without (pod) (x) + ignoring (kind) y", "sum without (pod) (x) + ignoring (kind) y"),
        ('x{by="on (a)"} * on (u) group_right (by) label_replace(y, "on", "$1", "by", "(.*)")',
         'x{by="on (a)"} * on (cluster, u) group_right (by) label_replace(y, "on", "$1", "by", "(.*)")'),
        ("count(x) or vector(0)", "count(x) or vector(0)"),
        ("rate(x[$__rate_interval]) * $on", "rate(x[$__rate_interval]) * $on"),
    ],
)  # fmt: skip
def test_every_by_and_on_list_keeps_the_label(promql: str, want: str) -> None:
    assert keeping(promql, "cluster") == want
    assert keeping(want, "cluster") == want


def test_keeping_checks_the_label_name() -> None:
    with pytest.raises(ValueError, match="not a label name"):
        keeping("sum by (a) (x)", "k8s-cluster")
