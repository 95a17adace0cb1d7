"""``python -m inferq.gateway``: a real uvicorn process configured from the environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from inferq.embedded import free_port
from tests.support.gateway import TOKEN


def test_serve_from_the_environment_and_log_no_secrets(redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "gateway.log"
    env = {**os.environ, "INFERQ_REDIS_URL": redis_url, "INFERQ_GATEWAY_TOKEN": TOKEN,
           "INFERQ_GATEWAY_TIMEOUT_S": "5", "PYTHONUNBUFFERED": "1",
           # no worker runs here: the request is queued, not refused as model_not_found
           "INFERQ_GATEWAY_REQUIRE_SERVED_MODEL": "false"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferq.gateway", "--host", "127.0.0.1", "--port",
             str(port), "--log-level", "info"], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{base}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.05)
            body = {"prompt": "p", "model": "echo"}
            assert httpx.post(f"{base}/v1/requests", json=body).status_code == 401
            created = httpx.post(f"{base}/v1/requests", json=body,
                                 headers={"Authorization": f"Bearer {TOKEN}"})
            assert created.status_code == 202
        finally:
            proc.terminate()
            # uvicorn shuts down gracefully, then re-raises the signal it caught.
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    text = log_path.read_text()
    assert "Application shutdown complete" in text
    assert "auth the operator's token and API keys" in text
    assert f"redis {redis_url}" in text
    assert TOKEN not in text


def test_a_misspelled_setting_stops_the_server_at_start() -> None:
    env = {**os.environ, "INFERQ_GATEWAY_TIMEOUT": "5"}
    done = subprocess.run([sys.executable, "-m", "inferq.gateway", "--port", str(free_port())],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "INFERQ_GATEWAY_TIMEOUT" in done.stderr
