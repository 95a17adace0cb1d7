"""Batch test helpers: JSONL inputs, a worker played by the test (claims every waiting request
of a queue and answers it), and waiting on a batch's status through the HTTP API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import redis

from inferq.embedded import free_port
from inferq.protocol import ops
from inferq.protocol.codec import Result, Status, Usage, decode_request, encode_result
from inferq.protocol.keys import QueueKeys
from tests.support.processes import wait_until

EMBED = QueueKeys.for_model("embed", "echo")
GENERATE = QueueKeys.for_model("generate", "echo")
TTL_MS = 600_000


def jsonl(rows: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def embed_line(custom_id: str, text: str, url: str = "/v1/embeddings",
               **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": "echo", "input": text, **body}}


def chat_line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "echo", "messages": [{"role": "user", "content": text}],
                     **body}}


def vector_of(prompt: str) -> list[float]:
    return [float(len(prompt)), 1.0, 0.5]


def answer(r: redis.Redis, keys: QueueKeys = EMBED, limit: int = 10_000,
           output: Callable[[str, Any], Any] | None = None, fail_on: str | None = None,
           worker: str = "test-worker") -> list[str]:
    """Claim up to ``limit`` waiting requests and complete them: an embedding of the prompt
    (or ``output(prompt, messages)``), failed when the prompt contains ``fail_on``. The ids."""
    scripts = ops.register(r)
    k, a = ops.claim_call(keys, worker, 30_000, limit, TTL_MS)
    reply = ops.parse_claim(scripts["claim"](keys=k, args=a))
    completions = []
    for c in reply.claimed:
        payload = decode_request(c.payload)
        text = payload.prompt or " ".join(m.content for m in payload.messages or [])
        if fail_on is not None and fail_on in text:
            body = encode_result(Result(id=c.id, status=Status.FAILED, attempts=c.attempt,
                                        error={"code": "model_error", "message": "boom"}))
            completions.append(ops.Completion(c, "failed", body))
            continue
        value = output(text, payload.messages) if output else vector_of(text)
        usage = Usage(prompt_tokens=len(text.split()), completion_tokens=2) \
            if keys.queue.startswith("generate") else None
        body = encode_result(Result(id=c.id, status=Status.OK, output=value,
                                    attempts=c.attempt, usage=usage))
        # billed as a worker bills it: the counts its result reports
        completions.append(ops.Completion(
            c, "ok", body, prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0))
    if completions:
        k, a = ops.complete_call(keys, TTL_MS, 100, completions)
        assert all(ops.parse_complete(scripts["complete"](keys=k, args=a)))
    return [c.id for c in reply.claimed]


def wait_status(get: Callable[[], dict[str, Any]], *statuses: str,
                timeout: float = 30.0) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def done() -> bool:
        seen.update(get())
        return seen["status"] in statuses

    wait_until(done, timeout, what=f"batch status in {statuses}")
    return seen


def read_jsonl(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines() if line]


class GatewayProcess:
    """``python -m inferq.gateway`` in a subprocess (so it can be SIGKILLed), its log kept."""

    def __init__(self, redis_url: str, log_dir: Path, **settings: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"gateway-{self.port}.log"
        env = {**os.environ, "INFERQ_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1",
               **{f"INFERQ_GATEWAY_{k.upper()}": v for k, v in settings.items()}}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "inferq.gateway", "--host", "127.0.0.1", "--port",
                 str(self.port), "--log-level", "info"], stdout=log, stderr=subprocess.STDOUT,
                env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log
            time.sleep(0.05)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
