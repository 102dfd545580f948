"""The dashboards as ConfigMaps for Grafana's dashboard sidecar (kube-prometheus-stack's
``grafana.sidecar.dashboards``: it loads every ConfigMap labelled ``grafana_dashboard: "1"``),
generated from the same committed JSON that users import by hand:

    python -m gpuquota.dashboards.configmaps --write deploy/components/grafana-dashboards/dashboards.yaml
    python -m gpuquota.dashboards.configmaps --check deploy/components/grafana-dashboards/dashboards.yaml

The test suite runs the check, so the ConfigMaps never drift from the JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from gpuquota.cli_common import generated

HERE = Path(__file__).resolve().parent
LABEL = {"grafana_dashboard": "1"}
#: the folder the sidecar files them in (its folderAnnotation, kube-prometheus-stack's default)
FOLDER = {"grafana_folder": "GPU"}


def configmaps(folder: Path = HERE) -> str:
    docs = []
    for path in sorted(folder.glob("*.json")):
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"gpuquota-dashboard-{path.stem}",
                    "labels": dict(LABEL),
                    "annotations": dict(FOLDER),
                },
                "data": {path.name: path.read_text()},
            }
        )
    head = (
        "# Generated from dashboards/*.json by `python -m gpuquota.dashboards.configmaps "
        "--write`: do not edit.\n"
    )
    body = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=100)
    return head + body


class _Dumper(yaml.SafeDumper):
    """Multi-line text as a literal block (the JSON reads as JSON in the manifest)."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def main(argv: list[str] | None = None) -> int:
    return generated.main(
        argv, configmaps, module="gpuquota.dashboards.configmaps", source="dashboards/*.json"
    )


if __name__ == "__main__":
    sys.exit(main())
