"""Pods on a failed GPU: a pod condition and opt-in, rate-limited eviction (docs/health.md)."""
