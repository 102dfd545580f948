"""The fleet history (issue 29): every GPU's health history by board serial, read from the node
agents' series in Prometheus, kept in the store and shown by ``gpuquota gpus``."""
