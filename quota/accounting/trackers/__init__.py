"""One tracker per Kubernetes kind; the Tracker seam is in base.py."""
