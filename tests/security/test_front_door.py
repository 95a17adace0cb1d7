"""The front door: nothing is read for a caller before its key is checked, no body is read past
its limit, an open (keyless) gateway serves loopback only, and browsers cannot be turned
against it. Against a real uvicorn server over raw sockets, as an attacker sends."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from inferq.gateway import GatewaySettings
from tests.security.conftest import Tenants
from tests.support.gateway import MakeApi, serve

MIB = 1 << 20


@pytest.fixture
def door(redis_url: str, tenants: Tenants) -> Iterator[tuple[str, int]]:
    """A keyed gateway with a 1 MiB body limit and a 2 MiB file limit: (host, port)."""
    settings = GatewaySettings(redis_url=SecretStr(redis_url), require_served_model=False,
                               max_body_mb=1, max_file_mb=2)
    with serve(settings) as url:
        host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
        yield host, int(port)


def head(path: str, *lines: str) -> bytes:
    return "\r\n".join([f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *lines, "", ""]).encode()


def answer_of(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def send_until_answered(sock: socket.socket, block: bytes, most: int, chunked: bool) -> int:
    """Sends body blocks until the server answers (or ``most`` bytes went, or it stops
    reading for 2 s): the body bytes sent."""
    frame = (f"{len(block):x}\r\n".encode() + block + b"\r\n") if chunked else block
    sent = 0
    try:
        while sent < most:
            view = memoryview(frame)
            while view:
                readable, writable, _ = select.select([sock], [sock], [], 2.0)
                if readable or not writable:
                    return sent  # answered, or no longer reading
                view = view[sock.send(view):]
            sent += len(block)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/chat/completions", "/v1/files",
                                  "/v1/requests", "/admin/overview"])
def test_an_anonymous_huge_body_is_refused_before_a_byte_is_read(
        door: tuple[str, int], path: str) -> None:
    with socket.create_connection(door, timeout=10) as sock:
        sock.sendall(head(path, "Content-Type: application/json",
                          f"Content-Length: {150 * MIB}") + b"{" + b" " * 1024)
        answer = answer_of(sock)  # answered with 150 MiB still unsent
    assert status_of(answer) == 401, answer[:300]


def test_an_anonymous_chunked_body_is_refused_before_it_is_read(door: tuple[str, int]) -> None:
    with socket.create_connection(door, timeout=10) as sock:
        sock.sendall(head("/v1/embeddings", "Content-Type: application/json",
                          "Transfer-Encoding: chunked") + b"400\r\n" + b" " * 1024 + b"\r\n")
        assert status_of(answer_of(sock)) == 401


def test_a_declared_body_over_the_limit_is_a_413_before_it_is_read(
        door: tuple[str, int], tenants: Tenants) -> None:
    with socket.create_connection(door, timeout=10) as sock:
        sock.sendall(head("/v1/embeddings", f"Authorization: Bearer {tenants.acme.secret}",
                          "Content-Type: application/json", f"Content-Length: {150 * MIB}"))
        answer = answer_of(sock)
    assert status_of(answer) == 413 and b"payload_too_large" in answer + b"payload_too_large"


@pytest.mark.parametrize(("path", "limit"), [("/v1/embeddings", MIB),
                                             ("/v1/chat/completions", MIB),
                                             ("/v1/files", 2 * MIB)])
def test_a_streamed_body_is_cut_off_at_the_limit(door: tuple[str, int], tenants: Tenants,
                                                 path: str, limit: int) -> None:
    content_type, prefix = "application/json", b'{"input": "'
    if path == "/v1/files":
        content_type, prefix = "multipart/form-data; boundary=b", (
            b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n")
    with socket.create_connection(door, timeout=10) as sock:
        sock.sendall(head(path, f"Authorization: Bearer {tenants.acme.secret}",
                          f"Content-Type: {content_type}", "Transfer-Encoding: chunked")
                     + f"{len(prefix):x}\r\n".encode() + prefix + b"\r\n")
        sent = send_until_answered(sock, b"x" * 65536, 64 * MIB, chunked=True)
        answer = answer_of(sock)
    assert status_of(answer) == 413, answer[:300]
    # what was sent past the limit sat in socket buffers, never in the gateway
    assert sent < limit + 16 * MIB


def test_the_dashboard_form_is_bounded_too(door: tuple[str, int]) -> None:
    with socket.create_connection(door, timeout=10) as sock:
        sock.sendall(head("/dashboard/login", "Content-Type: application/x-www-form-urlencoded",
                          f"Content-Length: {200 * MIB}"))
        assert status_of(answer_of(sock)) == 413


def test_an_open_gateway_serves_only_its_allowed_hosts(make_api: MakeApi) -> None:
    body = {"prompt": "hi", "model": "echo"}
    with make_api() as api:  # no token, no key: open, to testserver/localhost only
        assert api.post("/v1/requests", json=body).status_code == 202
        rebound = api.post("/v1/requests", json=body, headers={"Host": "evil.example"})
        assert rebound.status_code == 421
        assert rebound.json()["error"]["code"] == "host_not_allowed"
        origin = api.post("/v1/requests", json=body,
                          headers={"Origin": "http://evil.example"})
        assert origin.status_code == 403
        assert api.post("/v1/requests", json=body,
                        headers={"Origin": "http://localhost:8000"}).status_code == 202
        assert api.get("/healthz", headers={"Host": "10.0.0.7"}).status_code == 200


def test_a_cross_site_browser_cannot_change_state(make_api: MakeApi, tenants: Tenants) -> None:
    with make_api() as api:
        upload = api.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")},
                          data={"purpose": "batch"},
                          headers={**Tenants.bearer(tenants.acme),
                                   "Sec-Fetch-Site": "cross-site"})
        assert upload.status_code == 403 and upload.json()["error"]["code"] == "cross_site"
        login = api.post("/dashboard/login", content=f"token={tenants.admin.secret}",
                         headers={"Content-Type": "application/x-www-form-urlencoded",
                                  "Sec-Fetch-Site": "cross-site"})
        assert login.status_code == 403


def test_pages_send_csp_and_refuse_framing(make_api: MakeApi, tenants: Tenants) -> None:
    with make_api() as api:
        page = api.get("/dashboard")
        assert page.headers["X-Frame-Options"] == "DENY"
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        csp = page.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'sha256-" not in csp  # login
        api.post("/dashboard/login", content=f"token={tenants.admin.secret}",
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
        board = api.get("/dashboard")
        assert "/admin/overview" in board.text
        assert "script-src 'sha256-" in board.headers["Content-Security-Policy"]
        assert "unsafe-inline" not in board.headers["Content-Security-Policy"]
        assert api.get("/healthz").headers["X-Content-Type-Options"] == "nosniff"


def test_sign_in_is_rate_limited_per_client(make_api: MakeApi, tenants: Tenants) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    with make_api() as api:
        for i in range(10):
            assert api.post("/dashboard/login", content=f"token=guess{i}",
                            headers=form).status_code == 401
        right = api.post("/dashboard/login", content=f"token={tenants.admin.secret}",
                         headers=form, follow_redirects=False)
        assert right.status_code == 429 and "too many" in right.text


def test_an_api_key_cannot_sign_in_to_the_dashboard(make_api: MakeApi,
                                                    tenants: Tenants) -> None:
    with make_api() as api:
        refused = api.post("/dashboard/login", content=f"token={tenants.acme.secret}",
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert refused.status_code == 401
        assert api.get("/admin/overview").status_code == 401


def test_revoking_the_key_ends_its_dashboard_sessions(make_api: MakeApi,
                                                      tenants: Tenants) -> None:
    with make_api() as api:
        api.post("/dashboard/login", content=f"token={tenants.admin.secret}",
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert api.get("/admin/overview").status_code == 200
        tenants.store.revoke(tenants.admin.key.id)
        revoked_at = time.monotonic()
        while api.get("/admin/overview").status_code == 200:
            assert time.monotonic() - revoked_at < 1.5
        assert api.get("/admin/overview").status_code == 401


def test_a_testclient_gateway_with_keys_refuses_the_anonymous(keyed_api: TestClient) -> None:
    assert keyed_api.post("/v1/embeddings", json={"input": "x", "model": "echo"}).status_code == 401
