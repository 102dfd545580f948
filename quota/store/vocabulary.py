"""Values the store keeps in its columns that more than one package reads.

The fleet history (quota/fleet/) and the remediation (quota/remediation/) write them and
`db prune` (quota/store/daytwo.py) reads them back; they live here, below both, so the store
never imports their rules.
"""

from __future__ import annotations

FENCED = "unhealthy"  # the verdict the agent withdraws a GPU on (device plugin, taint, DRA)

# remediation_actions: the evictions that spend the fleet-wide budget of a real instance
# (quota/remediation/record.py): reserved, done, or an API failure that may have evicted
# (never less than what happened)
EVICTIONS_SPENT = ("evicting", "evicted", "failed")
# ... and those that spend a dry-run instance's budget, a budget of its own: what it would
# have evicted. Neither counts the other's, so a preview never starves the real remediation
DRY_RUN_SPENT = ("dry_run",)
# the longest --evict-window `gpuquota remediate` takes: `db prune` keeps every eviction row
# this recent, so no budget window ever loses a row it counts (the budget would reset)
MAX_EVICT_WINDOW_S = 7 * 86400
# remediation_actions: what a pod's GPUUnhealthy condition was last set to by a real run (a
# dry run's rows say nothing of it); the latest such row ``marked`` is the pod to clear
CONDITION_STATES = ("marked", "cleared", "gone")
