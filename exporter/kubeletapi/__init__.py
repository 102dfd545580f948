"""The kubelet's gRPC APIs, compiled from the .proto files here by setup.py at install time."""
