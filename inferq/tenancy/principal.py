"""Who is calling: the tenant an API key belongs to, its scopes and its ceilings.

Ownership of request ids is a name space, not a check: a tenant's request ``X`` is stored as
``<tenant>@X`` (``stored_id``), so another tenant asking for ``X`` asks for ``<their
tenant>@X``, which does not exist (404), and cannot squat it by sending ``X`` first. Tenant
names cannot hold ``@`` (``protocol.keys.NAME_RE``), so the first ``@`` splits the two
unambiguously. A principal without a tenant (the operator's ``INFERQ_GATEWAY_TOKEN``, or a
gateway with no auth) uses ids as given and sees every tenant's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

Scope = Literal["api", "admin", "autoscale"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
#: What each scope admits, by route family. ``admin`` admits every family.
FAMILIES: dict[Scope, frozenset[str]] = {
    "api": frozenset({"api"}),
    "autoscale": frozenset({"autoscale"}),
    "admin": frozenset({"api", "admin", "autoscale"}),
}
ID_SEPARATOR = "@"


@dataclass(frozen=True, slots=True)
class Principal:
    #: None: the operator (the shared token, or no auth): no tenant, every tenant's objects.
    tenant: str | None
    scopes: frozenset[Scope] = field(default_factory=lambda: frozenset(SCOPES))
    key_id: str | None = None
    max_priority: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_in_flight: int | None = None
    max_queued_bytes: int | None = None

    @classmethod
    def operator(cls) -> Principal:
        return cls(tenant=None)

    def admits(self, family: str) -> bool:
        """Whether one of the scopes admits routes of ``family`` (api, admin, autoscale)."""
        return any(family in FAMILIES[s] for s in self.scopes)

    @property
    def sees_all(self) -> bool:
        """The operator, or an admin key: every tenant's files, batches and requests."""
        return self.tenant is None or "admin" in self.scopes

    def owns(self, owner: str | None) -> bool:
        """Whether an object created by ``owner`` (None: by the operator) is visible."""
        return self.sees_all or owner == self.tenant

    @property
    def limited(self) -> bool:
        return (self.requests_per_minute is not None or self.tokens_per_minute is not None
                or self.max_in_flight is not None or self.max_queued_bytes is not None)

    @property
    def settles(self) -> bool:
        """Whether a finished request has anything to give back: tokens (a tokens/min limit),
        an in-flight slot or queued bytes. A requests/min-only key has not: its
        reservations just expire."""
        return (self.tokens_per_minute is not None or self.max_in_flight is not None
                or self.max_queued_bytes is not None)

    def stored_id(self, public_id: str) -> str:
        """The id a request of this principal's has in Redis."""
        return public_id if self.tenant is None else f"{self.tenant}{ID_SEPARATOR}{public_id}"

    def public_id(self, stored_id: str) -> str:
        """The id this principal knows a request by (``stored_id`` reversed)."""
        if self.tenant is None:
            return stored_id
        prefix = self.tenant + ID_SEPARATOR
        return stored_id[len(prefix):] if stored_id.startswith(prefix) else stored_id

    @property
    def default_priority(self) -> int:
        """The priority of a request that names none: 0, or the key's ceiling if lower."""
        return 0 if self.max_priority is None else min(0, self.max_priority)

    def priority_refusal(self, priority: int) -> str | None:
        """Why ``priority`` is refused (above the key's ceiling), or None."""
        if self.max_priority is not None and priority > self.max_priority:
            return (f"priority {priority} is above this key's max_priority "
                    f"{self.max_priority} (tenant {self.tenant!r})")
        return None
