"""The live quota controller (`gpuquota controller`): list+watch -> Accountant -> store.

kube.py talks to the Kubernetes API (raw JSON lists and watch lines through the official
client), watch.py keeps one list+watch loop per kind, loop.py applies what they see to the
Accountant and flushes it, metrics.py exposes Prometheus metrics, leader.py elects one writer
through a Lease, and cli.py is the subcommand.
"""
