"""`gpuquota report`: GPU-hour chargeback from the quota store.

period (window parsing) and ratecard (pricing) are pure. The reads run the aggregation in SQL,
one module per concern: scope (the clusters, where their data begins and ends, gaps, the index
ranges of a window), allocations (allocated seconds per group), capacity (allocatable seconds,
for the idle table), query (quota history and the usage ledger), on the building blocks of
sql. build fetches them and computes: physical (physical and priced GPU-seconds of a row, the
one place), idle (the idle table) and compute (exact per-group figures), all pure; render,
focus and chart format the result, prometheus adds measured utilisation; cli wires them into
the `gpuquota report` subcommand.
"""
