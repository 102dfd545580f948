"""Stand-ins that speak the real interfaces (NVML C ABI, kube-apiserver, kubelet gRPC)."""
