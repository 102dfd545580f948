"""Values the store keeps in its columns that more than one package reads.

The fleet history (quota/fleet/) writes them and `db prune` (quota/store/daytwo.py) reads them
back; they live here, below both, so the store never imports the fleet history's rules.
"""

from __future__ import annotations

FENCED = "unhealthy"  # the verdict the agent withdraws a GPU on (device plugin, taint, DRA)
