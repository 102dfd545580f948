"""The kubelet device plugin (API v1beta1) with the health checker as its health source."""
