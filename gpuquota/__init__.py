"""gpuquota: GPU observability, health and chargeback for Kubernetes, one installed package.

The subpackages live in the repository's top-level folders and are linked in here
(gpuquota/exporter -> ../exporter, and quota, sim, dashboards the same way), so a source
checkout, an editable install, mypy and the wheel all see the same `gpuquota.*` names, and
site-packages gets one package, never generic names like `sim` or `quota`:

- gpuquota.exporter: `gpu-exporter`, the per-node agent;
- gpuquota.quota: `gpuquota`, the controller, the store and the report;
- gpuquota.dashboards: the Grafana dashboards; gpuquota.sim: the stand-ins;
- gpuquota.cli_common: the command-line convention and duration grammar they all share.
"""
