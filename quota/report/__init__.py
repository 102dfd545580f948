"""`gpuquota report`: GPU-hour chargeback from the quota store.

period (window parsing) and ratecard (pricing) are pure; query runs the aggregation in SQL;
compute turns aggregated rows into exact figures; render formats them; chart and prometheus
are optional outputs and inputs; cli wires them into the `gpuquota report` subcommand.
"""
