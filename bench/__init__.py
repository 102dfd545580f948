"""Benchmarks against the tools users would otherwise pick; results go to docs/benchmarks.md."""
