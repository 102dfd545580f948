"""Optional: the health verdict shown on the Node object (a taint and a condition)."""
