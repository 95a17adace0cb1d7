"""What real OpenAI-compatible clients send, against gateway processes and real workers:

- the exact requests of vLLM's benchmark client (``vllm bench serve``, backends openai-chat,
  openai (completions) and openai-embeddings; ``vllm/benchmarks/lib/endpoint_request_func.py``),
  read back with that client's own event parser: every one gets through;
- the official ``openai`` client with content parts, ``max_completion_tokens`` and
  ``include_usage``;
- a stream read over HTTP from a gateway process that is then SIGKILLed, resumed with
  ``Last-Event-ID`` from a second gateway process: the text is the result's, no duplicate.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from inferq.embedded import free_port
from tests.support.generation import MODEL
from tests.support.processes import WorkerProcess, wait_until

pytestmark = pytest.mark.timeout(300)


@contextmanager
def gateway_process(redis_url: str, log: Path, *, ready: tuple[tuple[str, str], ...] = (
        (MODEL, "generate"),)) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m inferq.gateway`` (no token) on a free port, once ``/readyz`` says a worker
    serves each (model, task) of ``ready``: its base URL and process."""
    port = free_port()
    env = {**os.environ, "INFERQ_REDIS_URL": redis_url, "INFERQ_GATEWAY_TIMEOUT_S": "120",
           "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "inferq.gateway", "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "warning"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        for model, task in ready:
            wait_until(lambda m=model, t=task: httpx.get(  # type: ignore[misc]
                f"{base}/readyz", params={"model": m, "task": t}).status_code == 200,
                timeout=180, what=f"a worker serving {model} ({task})")
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def vllm_messages(raw: bytes) -> list[str]:
    """vLLM's ``StreamedResponseHandler`` on a whole body: events split on blank lines."""
    return [m.strip() for m in raw.decode().split("\n\n") if m.strip()]


def vllm_read(raw: bytes, chat: bool) -> dict[str, Any]:
    """What ``async_request_openai_chat_completions`` / ``_completions`` make of a stream:
    ``data: `` stripped, every other message parsed as JSON (anything else is an exception,
    a failed request)."""
    text, chunks, output_tokens = "", 0, None
    for message in vllm_messages(raw):
        if message.startswith(":"):
            continue
        chunk = message.removeprefix("data: ")
        if chunk == "[DONE]":
            continue
        data = json.loads(chunk)
        if choices := data.get("choices"):
            chunks += 1
            text += (choices[0]["delta"].get("content") if chat else choices[0].get("text")) \
                or ""
        elif usage := data.get("usage"):
            output_tokens = usage.get("completion_tokens")
    return {"text": text, "chunks": chunks, "output_tokens": output_tokens}


@pytest.fixture
def workers(tiny_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("--task", "generate", "--model", f"{MODEL}={tiny_path}", "--device", "cpu")
    start_worker("--model", "minilm", "--device", "cpu")


def test_every_request_shape_of_vllms_benchmark_client_gets_through(
        redis_url: str, tmp_path: Path, workers: None) -> None:
    with gateway_process(redis_url, tmp_path / "gw.log",
                         ready=((MODEL, "generate"), ("minilm", "embed"))) as (base, _), \
            httpx.Client(base_url=base, timeout=180) as http:
        prompt = "the queue worker asks what is the capital of France"
        chat = {"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "text", "text": prompt}]}], "max_completion_tokens": 16,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
        completion = {"model": MODEL, "prompt": prompt, "repetition_penalty": 1.0,
                      "max_tokens": 16, "logprobs": None, "stream": True,
                      "stream_options": {"include_usage": True}, "ignore_eos": True}
        embeddings = {"model": "minilm", "input": prompt, "truncate_prompt_tokens": -1}
        for i, (path, body) in enumerate([("/v1/chat/completions", chat),
                                          ("/v1/completions", completion)]):
            headers = {"Content-Type": "application/json", "x-request-id": f"bench-0-{i}"}
            response = http.post(path, json=body, headers=headers)
            assert response.status_code == 200, response.text
            assert response.headers["x-request-id"] == f"bench-0-{i}"
            got = vllm_read(response.content, chat=path.endswith("chat/completions"))
            assert got["output_tokens"] == 16 and got["text"] and got["chunks"] >= 2
        response = http.post("/v1/embeddings", json=embeddings,
                             headers={"x-request-id": "bench-0-2"})
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["prompt_tokens"] > 0
        assert len(response.json()["data"][0]["embedding"]) == 384
        # The probes it makes: absent here, answered as JSON 404s (the client goes on).
        tokenize = http.post("/tokenize", json={"model": MODEL, "prompt": prompt,
                                                "add_special_tokens": False})
        assert tokenize.status_code == 404 and "error" in tokenize.json()
        assert http.get("/metrics").status_code == 404


def test_the_openai_client_with_parts_max_completion_tokens_and_usage(
        redis_url: str, tmp_path: Path, tiny_path: Path,
        start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("--task", "generate", "--model", f"{MODEL}={tiny_path}", "--device", "cpu")
    with gateway_process(redis_url, tmp_path / "gw.log") as (base, _):
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)
        messages: Any = [{"role": "user", "content": [{"type": "text", "text": "the queue"}]}]
        stream = sdk.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=7, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            extra_headers={"X-Request-Id": "sdk-1"})
        chunks = list(stream)
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 7
        assert chunks[-2].choices[0].finish_reason == "length"
        assert all(c.id == "chatcmpl-sdk-1" for c in chunks)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        whole = sdk.chat.completions.create(model=MODEL, messages=messages,
                                            max_completion_tokens=7,
                                            extra_body={"ignore_eos": True})
        assert whole.choices[0].message.content == text
        # Log-probabilities come back through the engine process (the worker's default).
        scored = sdk.chat.completions.create(model=MODEL, messages=messages,
                                             max_completion_tokens=5, logprobs=True,
                                             top_logprobs=2, extra_body={"ignore_eos": True})
        assert scored.choices[0].logprobs is not None
        content = scored.choices[0].logprobs.content or []
        assert len(content) == 5 and all(len(c.top_logprobs) == 2 for c in content)
        assert all(c.logprob == pytest.approx(c.top_logprobs[0].logprob) for c in content)
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.chat.completions.create(model=MODEL, messages=messages, n=2)
        assert refused.value.body["param"] == "n"  # type: ignore[index]


def test_a_stream_resumes_on_another_gateway_after_a_sigkill(
        redis_url: str, tmp_path: Path, tiny_path: Path,
        start_worker: Callable[..., WorkerProcess]) -> None:
    # A slow worker (a stream write at most every 200 ms), so the kill lands mid-generation.
    start_worker("--task", "generate", "--model", f"{MODEL}={tiny_path}", "--device", "cpu",
                 "--stream-interval-ms", "200")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "the queue"}],
            "max_tokens": 600, "ignore_eos": True, "stream": True, "resumable": True,
            "stream_options": {"include_usage": True}}
    received: list[tuple[str, str]] = []
    with gateway_process(redis_url, tmp_path / "gw1.log") as (first, proc), \
            httpx.Client(timeout=120) as http, http.stream(
                "POST", f"{first}/v1/chat/completions", json=body,
                headers={"X-Request-Id": "killed-1"}) as response:
        assert response.status_code == 200
        event: dict[str, str] = {}
        lines = response.iter_lines()
        for line in lines:
            if line:
                key, _, value = line.partition(": ")
                event[key] = value
                continue
            received.append((event["id"], event["data"]))
            event = {}
            if len(received) == 4:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                break
    # What the dead process had sent but the client had not read yet is dropped: the client
    # resumes from the last event it handled (the connection may or may not have errored,
    # depending on whether the process had written the whole answer before it died).
    assert received[-1][1] != "[DONE]"
    with gateway_process(redis_url, tmp_path / "gw2.log") as (second, _), \
            httpx.Client(timeout=120) as http:
        resumed = http.get(f"{second}/v1/requests/killed-1/stream",
                           params={"model": MODEL, "include_usage": "true"},
                           headers={"Last-Event-ID": received[-1][0]})
        assert resumed.status_code == 200
        rest = [(b.split("\n")[0].removeprefix("id: "), b.split("\n")[1].removeprefix("data: "))
                for b in resumed.text.split("\n\n") if b.strip()]
        result = http.get(f"{second}/v1/requests/killed-1",
                          params={"model": MODEL, "task": "generate"}).json()
    events = received + rest
    ids = [i for i, _ in events]
    assert len(set(ids)) == len(ids)  # no event twice
    assert events[-1][1] == "[DONE]"
    assert json.loads(events[-2][1])["usage"]["completion_tokens"] == 600
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or ""
                   for _, d in events if d.startswith("{") and json.loads(d)["choices"])
    assert text == result["result"]["output"]["text"]  # nothing missing
