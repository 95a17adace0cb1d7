"""Bearer auth, the probes, and the OpenAPI schema, against the real server."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.support.gateway import TOKEN, MakeApi

BODY = {"prompt": "hi", "model": "echo"}


def test_requests_need_the_token_when_one_is_configured(make_api: MakeApi) -> None:
    with make_api(token=TOKEN) as api:
        missing = api.post("/v1/requests", json=BODY)
        wrong = api.post("/v1/requests", json=BODY, headers={"Authorization": "Bearer nope"})
        basic = api.post("/v1/embeddings", json={"input": "x", "model": "echo"},
                         headers={"Authorization": f"Basic {TOKEN}"})
        ok = api.post("/v1/requests", json=BODY, headers={"Authorization": f"Bearer {TOKEN}"})
        get = api.get(f"/v1/requests/{ok.json()['id']}?model=echo",
                      headers={"Authorization": f"Bearer {TOKEN}"})
    for response in (missing, wrong, basic):
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert TOKEN not in response.text
    assert ok.status_code == 202 and get.status_code == 200


def test_without_a_token_configured_requests_pass(api: TestClient) -> None:
    assert api.post("/v1/requests", json=BODY).status_code == 202


def test_probes_and_schema_are_outside_auth(make_api: MakeApi) -> None:
    with make_api(token=TOKEN) as api:
        assert api.get("/healthz").json() == {"status": "ok"}
        assert api.get("/readyz?model=echo").status_code == 503  # no worker, but not a 401
        assert api.get("/openapi.json").status_code == 200


def test_openapi_lists_the_routes(api: TestClient, make_api: MakeApi) -> None:
    schema = api.get("/openapi.json").json()
    paths = schema["paths"]
    # the operator's routes (inferq.gateway.admin), listed apart
    admin = {"/admin/overview", "/admin/queues/{queue}/dead-letters",
             "/admin/queues/{queue}/dead-letters/{request_id}",
             "/admin/queues/{queue}/dead-letters/{action}", "/admin/requests/{request_id}",
             "/autoscale", "/autoscale/{queue}", "/metrics/autoscale", "/dashboard",
             "/admin/usage", "/metrics/usage"}
    assert admin <= set(paths)
    assert set(paths) - admin == {"/healthz", "/readyz", "/v1/embeddings", "/v1/completions",
                          "/v1/chat/completions", "/v1/requests", "/v1/requests/{request_id}",
                          "/v1/requests/{request_id}/stream", "/v1/models", "/v1/models/{model}",
                          # the Files and Batches APIs (batch jobs)
                          "/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content",
                          "/v1/batches", "/v1/batches/stats", "/v1/batches/{batch_id}",
                          "/v1/batches/{batch_id}/cancel"}
    assert set(paths["/v1/requests/{request_id}"]) == {"get", "delete"}
    assert set(paths["/v1/completions"]) == set(paths["/v1/chat/completions"]) == {"post"}
    assert "429" in paths["/v1/embeddings"]["post"]["responses"]
    # Always declared: a gateway is open only while no key exists, which can change at runtime.
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    with make_api(token=TOKEN) as guarded:
        secured = guarded.get("/openapi.json").json()
    assert "HTTPBearer" in secured["components"]["securitySchemes"]


@pytest.mark.parametrize("path", ["/nope", "/v1/audio/speech"])
def test_unknown_routes_answer_openai_shaped_404s(api: TestClient, path: str) -> None:
    response = api.post(path, json={})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"
