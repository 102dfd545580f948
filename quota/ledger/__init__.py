"""The usage ledger: the controller's ingestion of the node agents' usage counters.

Beside the watch loop, sharing the store, not the loop: ``rules`` (pure: windows, increases,
coverage, idle allocations), ``source`` (Prometheus' HTTP API), ``write`` (the store's side)
and ``ingest`` (the leader's ingest thread). See docs/accounting.md, "The usage ledger".
"""
