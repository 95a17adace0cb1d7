"""schemathesis against the gateway's own OpenAPI schema, over every operation, through a real
uvicorn server that authenticates by tenant keys, called with a tenant's key (an ``api``
scope: the admin routes answer 403): no 5xx, no traceback, every refusal a JSON error that
names the field. A
bounded run (``FUZZ_EXAMPLES`` per operation); a longer one sets ``INFERQ_FUZZ_EXAMPLES``
(there is no benchmark scenario for it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection

from tests.support.gateway import serve

FUZZ_EXAMPLES = int(os.environ.get("INFERQ_FUZZ_EXAMPLES", "15"))

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def fuzz_gateway(server: Any) -> Iterator[tuple[str, dict[str, str]]]:
    """The gateway's base URL, and a tenant key's header."""
    import redis

    from inferq.gateway import GatewaySettings
    from inferq.tenancy import KeyStore

    with redis.Redis.from_url(server.url) as r:
        r.flushall()
        key = KeyStore(r).create("fuzzer", max_priority=10)

    # No worker: a valid body reaches the queue and is answered 404 model_not_found at once
    # (require_served_model), so every operation answers without waiting.
    settings = GatewaySettings(redis_url=SecretStr(server.url), token=None,
                               require_served_model=True, timeout_s=2)
    with serve(settings) as url:
        yield url.removesuffix("/v1"), {"Authorization": f"Bearer {key.secret}"}


def operations() -> list[Any]:
    """Every operation of the gateway's schema (made without starting the app)."""
    from inferq.gateway import GatewaySettings, create_app

    app = create_app(GatewaySettings(redis_url=SecretStr("redis://unused"), token=None))
    schema = schemathesis.openapi.from_dict(app.openapi())
    return [result.ok() for result in schema.get_all_operations()]


def can_be_invalid(operation: Any) -> bool:
    """Whether any input of ``operation`` can be invalid: a body, a required query or header
    parameter (it can be left out), or a constrained one. A free-form path string (a file or
    batch id) accepts everything: schemathesis cannot make it invalid."""
    if len(operation.body):
        return True
    for parameter in operation.iter_parameters():
        schema = parameter.definition.get("schema", {})
        if parameter.is_required and parameter.location.value != "path":
            return True
        if (schema.get("type") not in (None, "string")
                or set(schema) - {"type", "title", "description", "default", "examples"}):
            return True
    return False


OPERATIONS = operations()
#: Every operation with valid data, and those whose input can be invalid with invalid data too.
CASES = [(op, mode) for op in OPERATIONS for mode in (
    GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or can_be_invalid(op)]


def no_server_error(ctx: Any, response: Any, case: Any) -> None:
    """No 5xx with Redis up, except ``/readyz``'s documented 503 (no worker runs here)."""
    if case.operation.path == "/readyz" and response.status_code == 503:
        return
    assert response.status_code < 500, (response.status_code, response.text)


def refusals_are_json_errors_naming_the_field(ctx: Any, response: Any, case: Any) -> None:
    """Every error is the gateway's JSON error body, never a traceback; a 400 or 422 names the
    field (``error.param``) and the message starts with it."""
    assert "Traceback" not in response.text, response.text
    if response.status_code < 400:
        return
    if case.operation.path == "/readyz" and response.status_code == 503:
        assert response.json()["status"] == "unready"  # its documented body, not an error
        return
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and isinstance(error["code"], str), error
    if response.status_code in (400, 422):
        param = error["param"]
        assert isinstance(param, str) and param, error
        assert error["message"].startswith(param.split("[")[0].split(".")[0]), error


@pytest.mark.parametrize(("operation", "mode"), CASES,
                         ids=[f"{mode.value}-{op.label}" for op, mode in CASES])
def test_the_api_answers_every_generated_request(operation: Any, mode: GenerationMode,
                                                 fuzz_gateway: tuple[str, dict[str, str]]
                                                 ) -> None:
    base_url, key = fuzz_gateway
    checks = [no_server_error, refusals_are_json_errors_naming_the_field]
    if mode is GenerationMode.NEGATIVE:
        checks.append(negative_data_rejection)

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        # The tenant's key in place of the generated credentials; a negative case that left
        # the header out is sent without one (its invalid part: the 401 is its rejection).
        headers = dict(case.headers or {})
        if mode is GenerationMode.POSITIVE or "Authorization" in headers:
            headers.update(key)
        response = case.call(base_url=base_url, timeout=30, headers=headers)
        case.validate_response(response, checks=checks)

    run()
