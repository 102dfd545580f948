"""Grafana dashboards for gpuquota, generated with grafanalib."""
