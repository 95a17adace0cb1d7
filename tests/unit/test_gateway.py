"""Gateway pieces without a server: settings, error mapping, encodings, and the
probes when Redis is unreachable."""

from __future__ import annotations

import array
import base64
import sys

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from pydantic import ValidationError as PydanticValidationError

from inferq.embedded import free_port
from inferq.errors import ConfigError, QueueFull, RequestFailed
from inferq.gateway import create_app
from inferq.gateway.settings import GatewaySettings
from inferq.openai.errors import from_inferq, param_of
from inferq.openai.responses import embeddings_tokens, encode_base64
from inferq.protocol.codec import ErrorInfo, Result, Status
from inferq.protocol.cost import estimate_tokens

BODY = {"prompt": "hi", "model": "echo"}


def test_settings_come_from_the_environment_and_hide_secrets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_REDIS_URL", "redis://:hunter2@db:6380/1")
    monkeypatch.setenv("INFERQ_GATEWAY_TOKEN", "tok-123")
    monkeypatch.setenv("INFERQ_GATEWAY_TIMEOUT_S", "5")
    monkeypatch.setenv("INFERQ_GATEWAY_MAX_QUEUE_DEPTH", "7")
    settings = GatewaySettings.from_env()
    assert settings.redis_url.get_secret_value() == "redis://:hunter2@db:6380/1"
    assert settings.token is not None and settings.token.get_secret_value() == "tok-123"
    assert (settings.timeout_s, settings.max_queue_depth) == (5.0, 7)
    assert "hunter2" not in repr(settings) and "tok-123" not in repr(settings)
    assert settings.redacted_redis_url == "redis://:***@db:6380/1"


def test_an_empty_token_means_no_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_GATEWAY_TOKEN", "")
    assert GatewaySettings.from_env().token is None


def test_a_misspelled_setting_is_an_error_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_GATEWAY_TOKN", "x")
    with pytest.raises(ConfigError, match="INFERQ_GATEWAY_TOKN"):
        GatewaySettings.from_env()


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(PydanticValidationError, match="timeout_s"):
        GatewaySettings(timeout_s=-1)
    with pytest.raises(PydanticValidationError, match="max_timeout_s"):
        GatewaySettings(timeout_s=100, max_timeout_s=10)


def test_param_names_read_like_the_request() -> None:
    assert param_of(("body", "input", 3)) == "input[3]"
    assert param_of(("body", "params", "k")) == "params.k"
    assert param_of(("header", "x-priority")) == "X-Priority"
    assert param_of(("query", "timeout_s")) == "timeout_s"
    assert param_of(("body",)) == "body"


def test_error_mapping() -> None:
    full = from_inferq(QueueFull("full", depth=3, max_depth=3), retry_after_s=4)
    assert (full.status, full.code, full.headers["Retry-After"]) == (429, "queue_full", "4")
    bad_input = Result(id="a", status=Status.FAILED, error=ErrorInfo(code="invalid_input"))
    model_error = Result(id="b", status=Status.FAILED, error=ErrorInfo(code="model_error"))
    assert from_inferq(RequestFailed("x", result=bad_input)).status == 422
    failed = from_inferq(RequestFailed("x", result=model_error))
    assert (failed.status, failed.code, failed.request_id) == (502, "model_error", "b")


def test_base64_is_little_endian_float32_like_openai() -> None:
    vector = [0.5, -1.25, 3.0e-8, 1.0]
    decoded = array.array("f", base64.b64decode(encode_base64(vector)))
    if sys.byteorder == "big":
        decoded.byteswap()
    assert decoded.tolist() == pytest.approx(vector, rel=1e-7)


def test_token_estimate_is_about_four_bytes_per_token() -> None:
    assert embeddings_tokens([0]) == 1
    assert embeddings_tokens([len(b"abcd")]) == 1
    assert embeddings_tokens([len(b"abcde")]) == 2
    # one estimate: usage counts what fair shares and limits count (UTF-8 bytes)
    assert embeddings_tokens([len("éé".encode())]) == estimate_tokens(4) == 1
    assert embeddings_tokens([4, 5]) == estimate_tokens(4) + estimate_tokens(5) == 3


def test_readyz_is_503_when_redis_is_unreachable() -> None:
    settings = GatewaySettings(redis_url=SecretStr(f"redis://:pw@127.0.0.1:{free_port()}/0"),
                               ready_timeout_s=2.0)
    with TestClient(create_app(settings)) as api:
        response = api.get("/readyz?model=echo")
        assert api.get("/healthz").status_code == 200
        failed = api.post("/v1/requests", json=BODY)
    assert response.status_code == 503
    assert response.json()["redis"] is False
    assert failed.status_code == 503
    assert failed.json()["error"]["code"] == "backend_unavailable"
    assert "pw" not in failed.text
