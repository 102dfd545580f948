"""kubelet gRPC APIs (pod-resources v1, device plugin v1beta1), compiled from .proto at build time."""
