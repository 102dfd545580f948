"""A publisher of the health verdict on DRA nodes: DeviceTaintRules (taintrules.py, pure; taints.py,
the API). ResourceSlices and claim attribution are enrichment: exporter/enrich/slices.py,
slicewatcher.py, dra.py, admin_access.py and claimreader.py."""
