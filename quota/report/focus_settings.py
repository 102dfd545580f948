"""Who a FOCUS export says issued it and to whom it bills, and which namespace labels it tags.

The settings come from the rate card's ``focus:`` section and from `gpuquota report` flags (a
flag wins over the card); every one has a default, so a card without the section still
exports. Pure: parsing and checking only.

Rate card example::

    focus:
      billing_account_id: acme-gpu-fleet     # BillingAccountId (default gpuquota)
      billing_account_name: ACME GPU fleet   # BillingAccountName (default: the id)
      provider: ACME platform team           # ServiceProviderName (1.3), ProviderName (1.2)
      host_provider: On-premises             # HostProviderName (1.3; default: the provider)
      publisher: ACME platform team          # PublisherName (1.2; default: the provider)
      invoice_issuer: ACME finance           # InvoiceIssuerName (default: the provider)
      tags: [team, cost-center]              # namespace labels that go into Tags
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_NAME = "gpuquota"
# the keys of the rate card's focus: section, and the flag each one has
KEYS = {
    "billing_account_id": "--focus-billing-account-id",
    "billing_account_name": "--focus-billing-account-name",
    "provider": "--focus-provider",
    "host_provider": "--focus-host-provider",
    "publisher": "--focus-publisher",
    "invoice_issuer": "--focus-invoice-issuer",
    "tags": "--focus-tags",
}
# a Kubernetes label key: an optional DNS-subdomain prefix and a name of up to 63 characters
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class SettingError(ValueError):
    """A setting that cannot be used: ``key`` (the card's key) and what is wrong."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class FocusSettings:
    """The identity columns of a FOCUS export and the labels it tags rows with. ``None``:
    not set (the default applies, see the properties)."""

    billing_account_id: str | None = None
    billing_account_name: str | None = None
    provider: str | None = None
    host_provider: str | None = None
    publisher: str | None = None
    invoice_issuer: str | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def account_id(self) -> str:
        return self.billing_account_id or DEFAULT_NAME

    @property
    def account_name(self) -> str:
        return self.billing_account_name or self.account_id

    @property
    def service_provider(self) -> str:
        return self.provider or DEFAULT_NAME

    @property
    def host(self) -> str:
        # FOCUS 1.3 HostProviderName: the service provider itself unless the host is named
        return self.host_provider or self.service_provider

    @property
    def publisher_name(self) -> str:
        return self.publisher or self.service_provider

    @property
    def issuer(self) -> str:
        return self.invoice_issuer or self.service_provider

    def over(self, base: FocusSettings) -> FocusSettings:
        """These settings where set, else ``base``'s (flags over the rate card)."""
        changes: dict[str, Any] = {
            k: getattr(self, k) for k in KEYS if k != "tags" and getattr(self, k) is not None
        }
        if self.tags:
            changes["tags"] = self.tags
        return replace(base, **changes)


def text(value: Any, key: str) -> str:
    """A non-empty one-line name (a FOCUS String column's value)."""
    if not isinstance(value, str) or not value.strip():
        raise SettingError(key, f"expected a non-empty string, got {value!r}")
    if any(c in value for c in "\r\n"):
        raise SettingError(key, "must be one line")
    return value.strip()


def label_keys(value: Any, key: str) -> tuple[str, ...]:
    """Namespace label keys, as `--by label:<key>` takes them: a list, or one comma-separated
    string (the flag's form); each a valid Kubernetes label key, none twice."""
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, list | tuple) or not parts:
        raise SettingError(key, "expected a list of namespace label keys, e.g. [team, cost-center]")
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str) or not part.strip():
            raise SettingError(key, f"expected a label key, got {part!r}")
        name = part.strip()
        prefix, _, rest = name.rpartition("/")
        if not _LABEL_NAME.match(rest) or (prefix and not _LABEL_PREFIX.match(prefix)):
            raise SettingError(key, f"{name!r} is no Kubernetes label key (e.g. team)")
        if name in out:
            raise SettingError(key, f"label key {name!r} given twice")
        out.append(name)
    return tuple(out)


def parse(doc: Any) -> FocusSettings:
    """The rate card's ``focus:`` mapping; SettingError (with ``focus.<key>``) when wrong."""
    if doc is None:
        return FocusSettings()
    if not isinstance(doc, dict):
        raise SettingError("focus", "expected a mapping of FOCUS settings")
    unknown = sorted(set(map(str, doc)) - set(KEYS))
    if unknown:
        raise SettingError(f"focus.{unknown[0]}", f"unknown key (expected one of {sorted(KEYS)})")
    values: dict[str, Any] = {}
    for key, value in doc.items():
        where = f"focus.{key}"
        values[str(key)] = label_keys(value, where) if key == "tags" else text(value, where)
    return FocusSettings(**values)
