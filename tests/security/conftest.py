"""Fixtures of the attacks: tenants with their own keys, on a gateway that authenticates by
them (``inferq.tenancy``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from fastapi.testclient import TestClient

from inferq.tenancy import KeyStore, NewKey
from tests.support.gateway import MakeApi


@dataclass
class Tenants:
    """Keys of two tenants (``acme``, ``globex``) and an admin, and their headers."""

    store: KeyStore
    acme: NewKey
    globex: NewKey
    admin: NewKey

    @staticmethod
    def bearer(key: NewKey) -> dict[str, str]:
        return {"Authorization": f"Bearer {key.secret}"}


@pytest.fixture
def tenants(r: redis.Redis) -> Tenants:
    store = KeyStore(r)
    return Tenants(store, store.create("acme", max_priority=5),
                   store.create("globex", name="globex prod"),
                   store.create("ops", scopes=["admin"]))


@pytest.fixture
def keyed_api(make_api: MakeApi, tenants: Tenants) -> Iterator[TestClient]:
    """A gateway with no operator token: the keys in Redis decide."""
    with make_api() as api:
        yield api
