"""Batch jobs end to end: the official ``openai`` client uploads, creates, polls and
downloads embeddings and chat batches from a real gateway and real workers; and a gateway
SIGKILLed in the middle of a batch changes nothing in its result (another takes over)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
from pydantic import SecretStr

from inferq.gateway import GatewaySettings
from tests.support.batch import GatewayProcess, jsonl, read_jsonl
from tests.support.gateway import TOKEN, auth, serve
from tests.support.generation import MODEL
from tests.support.processes import WorkerProcess, wait_until


def poll(sdk: openai.OpenAI, batch_id: str, timeout: float = 240) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = sdk.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.2)


def test_the_openai_client_runs_embeddings_and_chat_batches(
        redis_url: str, tmp_path: Path, tiny_path: Path,
        start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("--model", "minilm", "--device", "cpu")
    start_worker("--task", "generate", "--model", f"{MODEL}={tiny_path}", "--device", "cpu")
    settings = GatewaySettings(redis_url=SecretStr(redis_url), token=SecretStr(TOKEN),
                               require_served_model=False, file_store=str(tmp_path / "files"),
                               batch_idle_s=0.2)
    texts = ["The cat sat on the mat.", "A durable queue for GPU workers.", "héllo wörld"]
    with serve(settings) as url:
        sdk = openai.OpenAI(base_url=url, api_key=TOKEN, max_retries=0, timeout=60)
        rows = [{"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/embeddings",
                 "body": {"model": "minilm", "input": text}} for i, text in enumerate(texts)]
        rows.append({"custom_id": "bad", "method": "POST", "url": "/v1/embeddings",
                     "body": {"model": "minilm", "input": "x", "dimensions": 8}})
        path = tmp_path / "embed.jsonl"
        path.write_bytes(jsonl(rows))
        with path.open("rb") as f:
            uploaded = sdk.files.create(file=f, purpose="batch")
        assert uploaded.purpose == "batch" and uploaded.bytes == path.stat().st_size
        assert sdk.files.retrieve(uploaded.id).filename == "embed.jsonl"
        assert uploaded.id in [f.id for f in sdk.files.list()]
        batch = sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                                   completion_window="24h", metadata={"job": "docs"})
        assert batch.status == "validating" and batch.metadata == {"job": "docs"}
        done = poll(sdk, batch.id)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed,
                done.request_counts.failed) == (4, 3, 1)
        assert done.output_file_id and done.error_file_id
        out = {r["custom_id"]: r for r in read_jsonl(sdk.files.content(
            done.output_file_id).content)}
        assert set(out) == {"doc-0", "doc-1", "doc-2"}
        # The vectors are the online endpoint's for the same text.
        online = sdk.embeddings.create(model="minilm", input=texts[1], encoding_format="float")
        vector = out["doc-1"]["response"]["body"]["data"][0]["embedding"]
        assert len(vector) == 384 and math.isclose(sum(x * x for x in vector), 1, rel_tol=1e-4)
        assert max(abs(a - b) for a, b in zip(vector, online.data[0].embedding,
                                              strict=True)) < 1e-4
        (error,) = read_jsonl(sdk.files.content(done.error_file_id).content)
        assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
        assert "dimensions" in error["response"]["body"]["error"]["message"]

        chat = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": MODEL, "max_tokens": 6, "temperature": 0,
                          "messages": [{"role": "user", "content": f"question {i}"}]}}
                for i in range(4)]
        path = tmp_path / "chat.jsonl"
        path.write_bytes(jsonl(chat))
        with path.open("rb") as f:
            chat_file = sdk.files.create(file=f, purpose="batch")
        chat_batch = sdk.batches.create(input_file_id=chat_file.id,
                                        endpoint="/v1/chat/completions",
                                        completion_window="24h")
        chat_done = poll(sdk, chat_batch.id)
        assert chat_done.status == "completed" and chat_done.error_file_id is None
        assert chat_done.output_file_id is not None
        answers = read_jsonl(sdk.files.content(chat_done.output_file_id).content)
        assert sorted(a["custom_id"] for a in answers) == ["q0", "q1", "q2", "q3"]
        for a in answers:
            body = a["response"]["body"]
            assert body["object"] == "chat.completion"
            assert body["choices"][0]["message"]["role"] == "assistant"
            assert 1 <= body["usage"]["completion_tokens"] <= 6
        listed = sdk.batches.list(limit=1)
        assert [b.id for b in listed.data] == [chat_batch.id] and listed.has_more
        older = sdk.batches.list(limit=5, after=chat_batch.id)
        assert [b.id for b in older.data] == [batch.id]
        bad_file = tmp_path / "bad.jsonl"
        bad_file.write_bytes(jsonl(rows[:1]) + b"{oops\n")
        with bad_file.open("rb") as f:
            bad = sdk.files.create(file=f, purpose="batch")
        try:
            sdk.batches.create(input_file_id=bad.id, endpoint="/v1/embeddings",
                               completion_window="24h")
            raise AssertionError("an invalid file made a batch")
        except openai.BadRequestError as exc:
            assert "line 2" in str(exc)
        sdk.files.delete(uploaded.id)
        try:
            sdk.files.retrieve(uploaded.id)
            raise AssertionError("a deleted file is still there")
        except openai.NotFoundError:
            pass


def test_a_gateway_killed_mid_batch_loses_and_duplicates_nothing(
        redis_url: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("--model", "minilm", "--device", "cpu")
    lines = 240
    settings = {"token": TOKEN, "require_served_model": "false",
                "file_store": str(tmp_path / "files"), "batch_lease_s": "2",
                "batch_chunk": "8", "batch_max_outstanding": "16", "batch_idle_s": "0.2"}
    first = GatewayProcess(redis_url, tmp_path, **settings)
    second = None
    try:
        rows = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings",
                 "body": {"model": "minilm", "input": f"sentence number {i}"}}
                for i in range(lines)]
        file_id = httpx.post(f"{first.base}/v1/files", headers=auth(),
                             files={"file": ("in.jsonl", jsonl(rows))},
                             data={"purpose": "batch"}).json()["id"]
        batch_id = httpx.post(f"{first.base}/v1/batches", headers=auth(), json={
            "input_file_id": file_id, "endpoint": "/v1/embeddings",
            "completion_window": "24h"}).json()["id"]

        def progress(base: str) -> dict[str, int]:
            counts: dict[str, int] = httpx.get(f"{base}/v1/batches/{batch_id}",
                                               headers=auth()).json()["request_counts"]
            return counts

        wait_until(lambda: progress(first.base)["completed"] >= 40, timeout=180,
                   what="the batch under way")
        assert progress(first.base)["completed"] < lines  # far from finalizing
        killed_at = math.floor(time.time())
        first.kill()  # SIGKILL: mid-step, lease held, lines in flight
        second = GatewayProcess(redis_url, tmp_path, **settings)
        deadline = time.monotonic() + 240
        while True:
            batch = httpx.get(f"{second.base}/v1/batches/{batch_id}", headers=auth()).json()
            if batch["status"] == "completed":
                break
            assert time.monotonic() < deadline, batch
            time.sleep(0.2)
        assert batch["request_counts"] == {"total": lines, "completed": lines, "failed": 0}
        assert batch["error_file_id"] is None
        # The second gateway took the lease over and finished the batch (read from the batch's
        # timestamps, not from log lines).
        assert batch["finalizing_at"] >= killed_at and batch["completed_at"] >= killed_at
        data = httpx.get(f"{second.base}/v1/files/{batch['output_file_id']}/content",
                         headers=auth()).content
        out = read_jsonl(data)
        ids = [row["custom_id"] for row in out]
        assert len(ids) == lines and set(ids) == {f"line-{i}" for i in range(lines)}
        assert all(len(row["response"]["body"]["data"][0]["embedding"]) == 384 for row in out)
    finally:
        first.stop()
        if second is not None:
            second.stop()
