"""Old name of the adminAccess claims code, kept for one merge: the pure rule is now
exporter/enrich/admin_access.py and its I/O thread exporter/enrich/claimreader.py. Import
from those; this module only re-exports their public names and goes once no branch imports it.
"""

from __future__ import annotations

from gpuquota.exporter.enrich.admin_access import ClaimKey, Device, admin_devices
from gpuquota.exporter.enrich.claimreader import AdminAccessClaims

__all__ = ["AdminAccessClaims", "ClaimKey", "Device", "admin_devices"]
