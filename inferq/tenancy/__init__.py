"""Tenants as principals: API keys bound to a tenant, with scopes and ceilings (``apikeys``),
who is calling (``principal``), and the per-tenant limits and usage kept in Redis.

Everything here lives in Redis under one hash tag, ``{<namespace>:tenancy}``
(``protocol.keys.TenancyKeys``), so every gateway replica agrees and a restart forgets
nothing; only a hash of each secret is stored."""

from inferq.tenancy.apikeys import ApiKey, KeyStore, NewKey
from inferq.tenancy.principal import SCOPES, Principal, Scope

__all__ = ["SCOPES", "ApiKey", "KeyStore", "NewKey", "Principal", "Scope"]
