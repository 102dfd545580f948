"""kubelet stand-ins: gRPC servers on unix sockets that speak the kubelet's real APIs."""
