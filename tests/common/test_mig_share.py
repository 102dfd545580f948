"""The node agent's MIG share (exporter/enrich/ledger.py) is the accounting's (quota/accounting
rules, without per-profile overrides): the two programs may not import each other, so this
test holds the one rule in two places equal."""

from __future__ import annotations

import pytest

from gpuquota.exporter.enrich.ledger import physical_share
from gpuquota.exporter.snapshot import DeviceSnapshot, MigInfo
from gpuquota.quota.accounting.rules.shares import mig_share

PROFILES = ["1g.5gb", "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
            "7g.80gb", "1g.18gb", "7g.141gb", "1c.2g.20gb", "mig-3g", ""]  # fmt: skip


@pytest.mark.parametrize("profile", PROFILES)
def test_the_agent_and_the_accounting_agree_on_mig_shares(profile: str) -> None:
    device = DeviceSnapshot(index=0, uuid="MIG-x", mig=MigInfo("GPU-x", 0, 1, 0, profile))
    expected = mig_share(profile)
    assert physical_share(device) == (None if expected is None else float(expected))


def test_the_check_can_fail() -> None:
    assert mig_share("3g.40gb") is not None and float(mig_share("3g.40gb") or 0) == 3 / 7
