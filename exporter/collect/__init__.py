"""COLLECT: NVML -> one immutable NodeSnapshot per round (the node agent's first step).

nvml.py is the only module that speaks to NVML; loop.py runs the rounds and the per-GPU
reader threads; profiling.py (GPM, per-process utilisation) and xid.py (the XID event
thread) read what a round or an event brings. Nothing here imports enrich/ or expose/.
"""
