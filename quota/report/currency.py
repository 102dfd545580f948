"""ISO 4217 currency codes: is a rate card's ``currency`` one a FOCUS export can bill in?

The list of codes is not ours to keep: it comes from PyPI ``pycountry``, which ships Debian's
iso-codes tables (maintained from the ISO 4217 maintenance agency's list; pycountry 26.2 has
the 2025 additions XAD and XCG). FOCUS BillingCurrency must be a *national* currency
(FOCUS 1.2/1.3 column page Billing Currency), so the codes ISO 4217 keeps for things that are
not one are refused too: precious metals, bond-market and accounting units, the IMF's special
drawing right, the testing code and "no currency" (ISO 4217's X codes other than the CFA and
East Caribbean currencies).
"""

from __future__ import annotations

import re

# ISO 4217 codes that are no national currency: gold, silver, palladium, platinum; the four
# European bond-market units; the Arab Accounting Dinar; the IMF special drawing right; the
# SUCRE; the ADB unit of account; the testing code; "no currency"
NOT_NATIONAL = frozenset(
    {"XAU", "XAG", "XPD", "XPT", "XBA", "XBB", "XBC", "XBD", "XAD", "XDR", "XSU", "XUA", "XTS"}
    | {"XXX"}
)


def problem(code: str) -> str | None:
    """Why ``code`` cannot be a FOCUS BillingCurrency, or None when it can."""
    import pycountry  # its tables load on first use: only a FOCUS export needs them

    if not re.fullmatch(r"[A-Z]{3}", code):
        return "is no ISO 4217 code (three capital letters, e.g. USD or EUR)"
    if pycountry.currencies.get(alpha_3=code) is None:
        return "is no ISO 4217 code (not in the ISO 4217 list, e.g. USD or EUR)"
    if code in NOT_NATIONAL:
        return "is an ISO 4217 code but no national currency (FOCUS bills in one, e.g. USD)"
    return None
