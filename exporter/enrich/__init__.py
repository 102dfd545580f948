"""ENRICH: joins what the node knows besides NVML onto each snapshot (who holds, who uses).

Each enrichment is a pure join over a snapshot (pods.py, usage.py, dra.py) fed by an I/O
module of its own that keeps a cache fresh in a background thread (podresources.py: the
kubelet; slicewatcher.py: ResourceSlices into slices.py's index; claimreader.py: claims for
admin_access.py's rule and the DRA pods' UIDs; poddirectory.py: pod UIDs from each
pod-resources answer and the kubelet's device checkpoint, devicecheckpoint.py; procfs.py:
/proc), so a round never waits on them. No module reads pods from the API server: the agent's
rights end at its node (docs/operations.md, "Threat model").
"""
