"""Pod remediation, central (issue 35): the node agents decide which GPUs are fenced and publish
it on their Node and in DeviceTaintRules; ``gpuquota remediate`` reads those verdicts and the
pods' allocated devices, and marks or evicts the pods on fenced GPUs, within a fleet-wide
budget kept in the store and behind a circuit breaker (docs/health.md)."""
