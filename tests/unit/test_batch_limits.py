"""The creating key's limits travel with a batch in one field and come back as its owner's
principal; what is not a clean field (an older batch, damage) means no limits."""

from __future__ import annotations

from inferq.batch.fields import BatchField as B
from inferq.batch.limits import limits_field, owner_principal
from inferq.tenancy.principal import Principal


def test_the_limits_field_round_trips() -> None:
    key = Principal(tenant="alice", requests_per_minute=60, tokens_per_minute=None,
                    max_in_flight=8, max_queued_bytes=1 << 20)
    h = {B.OWNER.value: "alice", B.LIMITS.value: limits_field(key)}
    assert h[B.LIMITS.value] == "60 0 8 1048576"
    owner = owner_principal(h)
    assert owner.tenant == "alice" and owner.limited
    assert (owner.requests_per_minute, owner.tokens_per_minute, owner.max_in_flight,
            owner.max_queued_bytes) == (60, None, 8, 1 << 20)


def test_no_clean_field_or_no_owner_means_no_limits() -> None:
    for h in ({B.OWNER.value: "alice"}, {B.OWNER.value: "alice", B.LIMITS.value: "60 x 0 0"},
              {B.OWNER.value: "alice", B.LIMITS.value: "60 0"},
              {B.OWNER.value: "", B.LIMITS.value: "60 0 0 0"}):
        owner = owner_principal(h)
        assert not owner.limited and owner.tenant == (h[B.OWNER.value] or None)
