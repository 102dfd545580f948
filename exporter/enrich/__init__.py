"""ENRICH: joins what the node knows besides NVML onto each snapshot (who holds, who uses).

Each enrichment is a pure join over a snapshot (pods.py, usage.py, dra.py) fed by an I/O
module of its own that keeps a cache fresh in a background thread (podresources.py: the
kubelet; slicewatcher.py: ResourceSlices into slices.py's index; claimreader.py: claims for
admin_access.py's rule; poddirectory.py: the API server; procfs.py: /proc), so a round never
waits on them.
"""
