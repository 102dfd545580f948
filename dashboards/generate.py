"""Generate the Grafana JSON beside each ``dashboards/*.dashboard.py`` source.

    python -m gpuquota.dashboards.generate           # write every <name>.json
    python -m gpuquota.dashboards.generate --check   # exit 1, naming the files, if any JSON is stale
    python -m gpuquota.dashboards.generate --cluster-label k8s_cluster --multi-cluster --out DIR

The JSON is committed (so users can import it without Python) and a test runs ``--check``. The
committed JSON tells clusters apart by the label ``cluster``, its variable hidden
(dashboards/clusters.py); ``--cluster-label`` and ``--multi-cluster`` write dashboards for
another label, or with the variable shown, into ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard

from gpuquota.dashboards import clusters as clusters_
from gpuquota.dashboards.clusters import Clusters
from gpuquota.dashboards.modernize import modernize

HERE = Path(__file__).resolve().parent
SUFFIX = ".dashboard.py"
# the settings the committed JSON is generated with
COMMITTED = Clusters()


def sources(folder: Path = HERE) -> list[Path]:
    return sorted(folder.glob(f"*{SUFFIX}"))


def json_path(source: Path) -> Path:
    return source.with_name(source.name.removesuffix(SUFFIX) + ".json")


def load(source: Path) -> Dashboard:
    """Run a dashboard source and return the ``dashboard`` it defines."""
    spec = importlib.util.spec_from_file_location(source.name.removesuffix(".py"), source)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{source}: cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dashboard = getattr(module, "dashboard", None)
    if not isinstance(dashboard, Dashboard):
        raise SystemExit(f"{source}: defines no grafanalib Dashboard named 'dashboard'")
    return dashboard


def render(dashboard: Dashboard, clusters: Clusters = COMMITTED) -> str:
    """The dashboard's JSON in the current Grafana schema (see dashboards/modernize.py), its
    queries scoped to the cluster variable (dashboards/clusters.py)."""
    legacy = json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder))
    out = io.StringIO()
    json.dump(clusters_.apply(modernize(legacy), clusters), out, sort_keys=True, indent=2)
    out.write("\n")
    return out.getvalue()


def rendered(folder: Path = HERE, clusters: Clusters = COMMITTED) -> dict[Path, str]:
    return {json_path(src): render(load(src), clusters) for src in sources(folder)}


def stale(folder: Path = HERE) -> list[str]:
    """Names of the JSON files that are missing or differ from what their source generates."""
    return [
        path.name
        for path, text in rendered(folder).items()
        if not path.exists() or path.read_text() != text
    ]


def expressions(data: Any) -> list[str]:
    """Every PromQL expression in a dashboard's JSON (panel targets and query variables)."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "expr" and isinstance(value, str):
                found.append(value)
            elif key == "query" and isinstance(value, str) and data.get("type") == "query":
                found.append(_variable_selector(value))
            else:
                found.extend(expressions(value))
    elif isinstance(data, list):
        for item in data:
            found.extend(expressions(item))
    return found


def _variable_selector(query: str) -> str:
    """The series a query variable reads: ``label_values(sel, label)`` -> ``sel``."""
    inner = query.strip()
    for function in ("label_values(", "query_result("):
        if inner.startswith(function) and inner.endswith(")"):
            inner = inner[len(function) : -1]
            if function == "label_values(":
                selector, _, _ = inner.rpartition(",")
                return selector.strip()
    return inner


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed JSON is stale")
    parser.add_argument(
        "--cluster-label",
        default=clusters_.DEFAULT_LABEL,
        help="the label that tells clusters apart in the Prometheus (default: %(default)s)",
    )
    parser.add_argument(
        "--multi-cluster",
        action="store_true",
        help="show the cluster variable (the Prometheus holds several clusters)",
    )
    parser.add_argument(
        "--out", type=Path, help="write the JSON into this folder (default: beside the sources)"
    )
    args = parser.parse_args(argv)
    try:
        clusters = Clusters(args.cluster_label, args.multi_cluster)
    except ValueError as e:
        parser.error(f"--cluster-label: {e}")
    if args.check and (clusters != COMMITTED or args.out):
        parser.error("--check compares the committed JSON: it takes no other option")
    if clusters != COMMITTED and not args.out:
        parser.error(
            "--cluster-label and --multi-cluster write with --out DIR: the committed JSON keeps the defaults"
        )
    if args.check:
        out_of_date = stale()
        if out_of_date:
            print(
                f"stale dashboard JSON: {', '.join(out_of_date)}; "
                "run `python -m gpuquota.dashboards.generate`",
                file=sys.stderr,
            )
            return 1
        return 0
    out = args.out or HERE
    if not out.is_dir():
        parser.error(f"--out: {out} is not a folder")
    for path, text in rendered(clusters=clusters).items():
        target = out / path.name
        target.write_text(text)
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
