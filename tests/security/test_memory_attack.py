"""The attack of issue 33, as it was made: 150-200 MiB bodies, anonymous and with a key, sent
whole to a real ``inferq gateway`` process, whose peak memory (VmHWM) must not grow by more
than the body limit. Before the front door, one such body raised it by 575-614 MiB."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferq.embedded import free_port
from tests.security.conftest import Tenants
from tests.security.test_front_door import answer_of, head, send_until_answered, status_of
from tests.support.processes import wait_until

MIB = 1 << 20
pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def answered(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            return sock.recv(12).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


@pytest.fixture
def gateway_process(redis_url: str, tenants: Tenants, tmp_path: Path
                    ) -> Iterator[tuple[int, int]]:
    port = free_port()
    env = {**os.environ, "INFERQ_REDIS_URL": redis_url, "INFERQ_GATEWAY_FILE_STORE":
           str(tmp_path), "INFERQ_GATEWAY_REQUIRE_SERVED_MODEL": "false"}
    with (tmp_path / "gateway.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "inferq.gateway", "--port", str(port),
                                 "--log-level", "warning"], stdout=log, stderr=log, env=env)
        try:
            wait_until(lambda: answered(port), timeout=60, what="the gateway to answer")
            yield proc.pid, port
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def attack(port: int, path: str, lines: list[str], size: int, chunked: bool) -> int:
    """Sends a ``size``-byte body whole (as long as the server reads it): its status."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head(path, *lines, framing))
        send_until_answered(sock, b"a" * 65536, size, chunked)
        return status_of(answer_of(sock))


def test_huge_bodies_do_not_grow_the_gateways_memory(gateway_process: tuple[int, int],
                                                     tenants: Tenants) -> None:
    pid, port = gateway_process
    key = f"Authorization: Bearer {tenants.acme.secret}"
    json_type = "Content-Type: application/json"
    # warm every route once with a small body, so imports and pools are in the baseline
    for path in ("/v1/embeddings", "/v1/chat/completions", "/dashboard/login"):
        attack(port, path, [key, json_type], 1024, chunked=False)
    before = peak_rss(pid)
    started = time.monotonic()
    statuses = [
        attack(port, "/v1/embeddings", [json_type], 150 * MIB, chunked=False),
        attack(port, "/v1/chat/completions", [json_type], 200 * MIB, chunked=True),
        attack(port, "/dashboard/login", ["Content-Type: application/x-www-form-urlencoded"],
               200 * MIB, chunked=False),
        attack(port, "/v1/files", ["Content-Type: multipart/form-data; boundary=b"],
               300 * MIB, chunked=True),
        attack(port, "/v1/embeddings", [key, json_type], 150 * MIB, chunked=True),
        attack(port, "/v1/embeddings", [key, json_type], 150 * MIB, chunked=False),
    ]
    grown = peak_rss(pid) - before
    assert statuses == [401, 401, 413, 401, 413, 413]
    assert grown < 16 * MIB + 24 * MIB, f"peak RSS grew by {grown / MIB:.0f} MiB"
    assert time.monotonic() - started < 30
