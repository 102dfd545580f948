"""The GPU accounting rules (docs/accounting.md), as pure functions of Kubernetes objects.

Objects are plain dicts in Kubernetes JSON form (camelCase). Nothing here does I/O or keeps
state. parse reads fields and quantities, config says what a GPU is, pods/nodes/quotas read
objects of each kind, shares converts units to physical GPUs exactly, ends decides when a
pod's GPUs stop being charged.
"""
