"""``inferq gateway --workers N``: several uvicorn processes serve one port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from inferq.embedded import free_port


def test_workers_flag_starts_that_many_processes_on_one_port(redis_url: str,
                                                            tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "gateway.log"
    env = {**os.environ, "INFERQ_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1",
           # no worker runs here: the request is queued, not refused as model_not_found
           "INFERQ_GATEWAY_REQUIRE_SERVED_MODEL": "false"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferq", "gateway", "--port", str(port), "--workers", "2"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while len(re.findall(r"Application startup complete",
                                 log_path.read_text())) < 2:
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.05)
            with httpx.Client(base_url=base) as http:
                for i in range(6):
                    created = http.post("/v1/requests", json={"prompt": f"p{i}", "model": "echo"})
                    assert created.status_code == 202, created.text
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) in (0, -signal.SIGINT, -signal.SIGTERM)
    text = log_path.read_text()
    assert len(set(re.findall(r"Started server process \[(\d+)\]", text))) == 2, text


def test_workers_must_be_positive() -> None:
    done = subprocess.run([sys.executable, "-m", "inferq.gateway", "--workers", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--workers" in done.stderr
