"""kubelet stand-ins: pod-resources and device plugin Registration gRPC servers on unix sockets."""
