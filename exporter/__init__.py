"""gpuquota's per-node agent: NVML collection, Prometheus metrics, GPU health, device plugin."""
