"""The Files and Batches APIs on a real Redis with the test playing the worker: OpenAI's
objects, the refusals that name a line, the lifecycle to completed / cancelled / expired, the
output and error files, priorities and the feed's bound on waiting lines."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from inferq.batch.config import MAX_LINE_BYTES
from inferq.batch.envelope import line_request_id
from inferq.batch.fields import BatchField
from inferq.batch.keys import BatchKeys
from inferq.cli.stats import batch_section, watch
from inferq.protocol import scores
from inferq.protocol.fields import Field
from tests.support.batch import (
    EMBED,
    GENERATE,
    answer,
    chat_line,
    embed_line,
    jsonl,
    read_jsonl,
    vector_of,
    wait_status,
)
from tests.support.gateway import MakeApi
from tests.support.processes import wait_until


@pytest.fixture
def batch_api(make_api: MakeApi, tmp_path: Path) -> Iterator[TestClient]:
    with make_api(file_store=str(tmp_path / "files"), batch_idle_s=0.2) as api:
        yield api


def upload(api: TestClient, data: bytes, purpose: str = "batch",
           name: str = "in.jsonl") -> dict[str, Any]:
    response = api.post("/v1/files", files={"file": (name, data)}, data={"purpose": purpose})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def create(api: TestClient, file_id: str, endpoint: str = "/v1/embeddings",
           **extra: Any) -> Any:
    return api.post("/v1/batches", json={"input_file_id": file_id, "endpoint": endpoint,
                                         "completion_window": "24h", **extra})


def getter(api: TestClient, batch_id: str) -> Any:
    return lambda: api.get(f"/v1/batches/{batch_id}").json()


def content(api: TestClient, file_id: str) -> list[dict[str, Any]]:
    response = api.get(f"/v1/files/{file_id}/content")
    assert response.status_code == 200
    return read_jsonl(response.content)


# ------------------------------------------------------------------------------- files

def test_files_round_trip_with_openai_shapes(batch_api: TestClient) -> None:
    data = jsonl([embed_line("a", "x")])
    first = upload(batch_api, data)
    assert first["object"] == "file" and first["id"].startswith("file-")
    assert first["bytes"] == len(data) and first["purpose"] == "batch"
    assert first["filename"] == "in.jsonl" and first["status"] == "processed"
    assert isinstance(first["created_at"], int)
    second = upload(batch_api, b"{}\n", purpose="user_data", name="other.jsonl")
    assert batch_api.get(f"/v1/files/{first['id']}").json() == first
    assert batch_api.get(f"/v1/files/{first['id']}/content").content == data
    listed = batch_api.get("/v1/files").json()
    assert listed["object"] == "list" and [f["id"] for f in listed["data"]] == [
        second["id"], first["id"]]
    page = batch_api.get("/v1/files", params={"limit": 1}).json()
    assert [f["id"] for f in page["data"]] == [second["id"]] and page["has_more"] is True
    rest = batch_api.get("/v1/files", params={"limit": 1, "after": second["id"]}).json()
    assert [f["id"] for f in rest["data"]] == [first["id"]] and rest["has_more"] is False
    only = batch_api.get("/v1/files", params={"purpose": "batch"}).json()
    assert [f["id"] for f in only["data"]] == [first["id"]]
    deleted = batch_api.delete(f"/v1/files/{first['id']}")
    assert deleted.json() == {"id": first["id"], "object": "file", "deleted": True}
    assert batch_api.get(f"/v1/files/{first['id']}").status_code == 404
    assert batch_api.get(f"/v1/files/{first['id']}/content").status_code == 404
    assert batch_api.delete(f"/v1/files/{first['id']}").status_code == 404  # the second call


def test_file_limits_and_purpose(make_api: MakeApi, tmp_path: Path) -> None:
    with make_api(file_store=str(tmp_path), max_file_mb=10 / (1 << 20)) as api:
        big = api.post("/v1/files", files={"file": ("x", b"x" * 11)}, data={"purpose": "batch"})
        assert big.status_code == 400 and big.json()["error"]["code"] == "file_too_large"
        assert api.get("/v1/files").json()["data"] == []  # nothing kept
        assert not any((tmp_path / "files").glob("*")) if (tmp_path / "files").exists() \
            else True
        bad = api.post("/v1/files", files={"file": ("x", b"{}")}, data={"purpose": "nope"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "purpose"
        assert api.post("/v1/files", files={"file": ("x", b"x" * 10)},
                        data={"purpose": "batch"}).status_code == 200


def test_auth_covers_files_and_batches(make_api: MakeApi, tmp_path: Path) -> None:
    with make_api(file_store=str(tmp_path), token="tok") as api:
        assert api.get("/v1/files").status_code == 401
        assert api.get("/v1/batches").status_code == 401
        assert api.get("/v1/files", headers={"Authorization": "Bearer tok"}).status_code == 200


# ----------------------------------------------------------------- refused at create

@pytest.mark.parametrize(("data", "line", "code"), [
    (jsonl([embed_line("a", "x")]) + b"not json\n", 2, "invalid_json_line"),
    (jsonl([embed_line("a", "x"), embed_line("b", "y"),
            embed_line("c", "z", url="/v1/completions")]), 3, "mismatched_url"),
    (jsonl([embed_line("a", "x"), embed_line("a", "y")]), 2, "duplicate_custom_id"),
    (jsonl([embed_line("a", "x"), {**embed_line("b", "y"), "method": "GET"}]), 2,
     "invalid_method"),
    (jsonl([embed_line("a", "x"), {**embed_line("b", "y"), "body": {"model": "other",
                                                                    "input": "y"}}]), 2,
     "mismatched_model"),
    (b"[1, 2]\n", 1, "invalid_json_line"),
])
def test_an_invalid_file_is_a_400_naming_the_line(
        batch_api: TestClient, r: redis.Redis, data: bytes, line: int, code: str) -> None:
    file_id = upload(batch_api, data)["id"]
    response = create(batch_api, file_id)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == f"line {line}"
    assert error["message"].startswith(f"line {line}: ")
    assert batch_api.get("/v1/batches").json()["data"] == []
    assert r.zcard(EMBED.pending) == 0


def test_a_huge_single_line_is_a_400_naming_it(batch_api: TestClient, r: redis.Redis) -> None:
    """20 MiB of one line (no newline): refused at create by the per-line limit, read in
    bounded memory (``tests/unit/test_batch_input.py`` measures it); the same after a good
    line names line 2."""
    for data, line in ((b'{"custom_id": "' + b"x" * (20 << 20), 1),
                       (jsonl([embed_line("a", "x")]) + b"y" * (20 << 20) + b"\n", 2)):
        response = create(batch_api, upload(batch_api, data)["id"])
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "line_too_long" and error["param"] == f"line {line}"
        assert error["message"] == (f"line {line}: longer than the limit of "
                                    f"{MAX_LINE_BYTES} bytes per line")
    assert batch_api.get("/v1/batches").json()["data"] == []
    assert r.zcard(EMBED.pending) == 0


def test_create_refusals(make_api: MakeApi, tmp_path: Path) -> None:
    with make_api(file_store=str(tmp_path), max_batch_lines=2, max_batch_bytes=400) as api:
        three = upload(api, jsonl([embed_line(str(i), "x") for i in range(3)]))["id"]
        assert create(api, three).json()["error"]["code"] == "too_many_lines"
        big = upload(api, jsonl([embed_line("a", "x" * 400)]))["id"]
        too_big = create(api, big)
        assert too_big.status_code == 400 and too_big.json()["error"]["code"] == "file_too_large"
        one = upload(api, jsonl([embed_line("a", "x")]))["id"]
        assert create(api, one, endpoint="/v1/moderations").status_code == 400
        assert create(api, one, completion_window="1h").status_code == 400
        assert create(api, "file-nope").status_code == 404
        other = upload(api, jsonl([embed_line("a", "x")]), purpose="user_data")["id"]
        assert create(api, other).json()["error"]["param"] == "input_file_id"
        bad = create(api, one, metadata={"priority": "high"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "metadata"


# ----------------------------------------------------------------------- lifecycle

def test_an_embeddings_batch_runs_to_completed(batch_api: TestClient, r: redis.Redis) -> None:
    rows = [embed_line(f"req-{i}", f"text {i}") for i in range(5)]
    rows.insert(2, embed_line("two-inputs", ["a", "b"]))  # type: ignore[arg-type]
    rows.append(embed_line("poison", "poison pill"))
    rows.append(embed_line("b64", "base", encoding_format="base64"))
    file_id = upload(batch_api, jsonl(rows))["id"]
    created = create(batch_api, file_id, metadata={"project": "docs"}).json()
    assert created["object"] == "batch" and created["status"] == "validating"
    assert created["request_counts"] == {"total": 8, "completed": 0, "failed": 0}
    assert created["metadata"] == {"project": "docs"}
    assert created["expires_at"] == created["created_at"] + 24 * 3600
    batch_id = created["id"]
    get = getter(batch_api, batch_id)
    wait_until(lambda: r.zcard(EMBED.pending) == 7, what="7 lines queued")
    # Batch lines wait at the batch band, below normal traffic.
    head, score = r.zrange(EMBED.pending, 0, 0, withscores=True)[0]
    assert int(score) >> scores.SEQ_BITS == scores.PRIORITY_MAX - (-50)
    # Its deadline is the end of the completion window (Redis clock, ms).
    deadline_ms = int(r.hget(EMBED.request(head.decode()), Field.DEADLINE) or 0)
    assert abs(deadline_ms / 1000 - created["expires_at"]) <= 2
    assert answer(r, fail_on="poison")
    done = wait_status(get, "completed")
    assert done["request_counts"] == {"total": 8, "completed": 6, "failed": 2}
    for stamp in ("created_at", "in_progress_at", "finalizing_at", "completed_at"):
        assert isinstance(done[stamp], int), stamp
    assert done["cancelled_at"] is None and done["failed_at"] is None
    out = {line["custom_id"]: line for line in content(batch_api, done["output_file_id"])}
    assert set(out) == {"req-0", "req-1", "req-2", "req-3", "req-4", "b64"}
    first = out["req-0"]
    assert first["error"] is None and first["response"]["status_code"] == 200
    assert first["response"]["request_id"] == line_request_id(batch_id, "req-0")
    body = first["response"]["body"]
    assert body["object"] == "list" and body["model"] == "echo"
    assert body["data"][0]["embedding"] == vector_of("text 0")
    assert isinstance(out["b64"]["response"]["body"]["data"][0]["embedding"], str)
    errors = {line["custom_id"]: line for line in content(batch_api, done["error_file_id"])}
    assert set(errors) == {"two-inputs", "poison"}
    assert errors["two-inputs"]["response"]["status_code"] == 400
    assert errors["two-inputs"]["response"]["body"]["error"]["param"] == "input"
    assert errors["poison"]["response"]["status_code"] == 502
    assert errors["poison"]["response"]["body"]["error"]["code"] == "model_error"
    output_meta = batch_api.get(f"/v1/files/{done['output_file_id']}").json()
    assert output_meta["purpose"] == "batch_output"
    # Nothing of the batch is left in Redis but its hash and the indexes.
    keys = BatchKeys.of(batch_id, "embed", "echo")
    assert not r.exists(keys.lines) and r.llen(keys.inbox) == 0
    assert r.zcard(EMBED.pending) == 0
    listed = batch_api.get("/v1/batches").json()
    assert [b["id"] for b in listed["data"]] == [batch_id]


def test_lines_the_queue_refuses_go_to_the_error_file_and_no_batch_stalls(
        batch_api: TestClient, r: redis.Redis) -> None:
    """A batch with lines the SDK refuses at enqueue (an empty input, a blank one, one over
    the max prompt bytes), created before 6 good batches: every batch completes, the bad
    lines in the poisoned batch's error file with the reason the online endpoint gives."""
    too_long = "x" * ((1 << 20) + 1)
    rows = [embed_line("ok-0", "fine"), embed_line("empty", ""), embed_line("ok-1", "fine too"),
            embed_line("blank", " \t\n "), embed_line("huge", too_long),
            embed_line("ok-2", "last")]
    poisoned = create(batch_api, upload(batch_api, jsonl(rows))["id"]).json()["id"]
    good = [create(batch_api, upload(batch_api, jsonl(
        [embed_line(f"g{b}-{i}", f"text {b} {i}") for i in range(3)]))["id"]).json()["id"]
        for b in range(6)]
    statuses: dict[str, str] = {}

    def all_done() -> bool:
        answer(r)  # the worker: whatever waits
        statuses.update({b: getter(batch_api, b)()["status"] for b in [poisoned, *good]})
        return all(s == "completed" for s in statuses.values())

    wait_until(all_done, timeout=60, what="every batch completed")
    for batch_id in good:
        done = getter(batch_api, batch_id)()
        assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    done = getter(batch_api, poisoned)()
    assert done["request_counts"] == {"total": 6, "completed": 3, "failed": 3}
    assert done["inferq"]["invalid"] == 3
    assert sorted(line["custom_id"] for line in content(batch_api, done["output_file_id"])) == [
        "ok-0", "ok-1", "ok-2"]
    errors = {line["custom_id"]: line for line in content(batch_api, done["error_file_id"])}
    assert set(errors) == {"empty", "blank", "huge"}
    for custom_id, line in errors.items():
        request_id = line_request_id(poisoned, custom_id)
        assert line["id"] == f"batch_req_{request_id}" and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 422 and response["request_id"] == request_id
        assert response["body"]["error"]["type"] == "invalid_request_error"
    assert errors["huge"]["response"]["body"]["error"]["code"] == "payload_too_large"
    assert "1048576" in errors["huge"]["response"]["body"]["error"]["message"]
    assert errors["empty"]["response"]["body"]["error"]["code"] == "invalid_request"


def test_a_chat_batch_and_metadata_priority(batch_api: TestClient, r: redis.Redis) -> None:
    rows = [chat_line(f"c{i}", f"hello {i}", max_tokens=5) for i in range(3)]
    rows.append(chat_line("streams", "x", stream=True))
    file_id = upload(batch_api, jsonl(rows))["id"]
    batch = create(batch_api, file_id, endpoint="/v1/chat/completions",
                   metadata={"priority": "-10"}).json()
    wait_until(lambda: r.zcard(GENERATE.pending) == 3, what="3 chat lines queued")
    _, score = r.zrange(GENERATE.pending, 0, 0, withscores=True)[0]
    assert int(score) >> scores.SEQ_BITS == scores.PRIORITY_MAX - (-10)
    answer(r, GENERATE, output=lambda text, _: {"text": f"echo: {text}"})
    done = wait_status(getter(batch_api, batch["id"]), "completed")
    assert done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    out = {line["custom_id"]: line for line in content(batch_api, done["output_file_id"])}
    body = out["c1"]["response"]["body"]
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "echo: hello 1"}
    assert body["usage"]["completion_tokens"] == 2
    (error,) = content(batch_api, done["error_file_id"])
    assert error["custom_id"] == "streams" and error["response"]["status_code"] == 400


def worker_logprobs(text: str) -> list[dict[str, Any]]:
    """The generate worker's ``logprobs`` output (``Engine.logprob_output``): per token its
    text, id and log-probability, and the top alternatives."""
    return [{"token": token, "id": i, "logprob": -0.25 * (i + 1),
             "top": [{"token": token, "id": i, "logprob": -0.25 * (i + 1)},
                     {"token": "?", "id": 99, "logprob": -3.0}]}
            for i, token in enumerate(text.split())]


def test_batch_lines_that_ask_for_logprobs_get_them(batch_api: TestClient,
                                                    r: redis.Redis) -> None:
    """The same body as online: chat's ``logprobs.content`` and the completion's
    ``tokens``/``token_logprobs``/``top_logprobs``/``text_offset``; none when not asked."""
    def output(text: str, _: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"text": f"echo {text}"}
        if "logprobs" in text:
            out["logprobs"] = worker_logprobs(f"echo {text}")
        return out

    chat = jsonl([chat_line("with", "logprobs", logprobs=True, top_logprobs=2),
                  chat_line("without", "plain")])
    chat_batch = create(batch_api, upload(batch_api, chat)["id"],
                        endpoint="/v1/chat/completions").json()
    completion = jsonl([{"custom_id": "with", "method": "POST", "url": "/v1/completions",
                         "body": {"model": "echo", "prompt": "logprobs", "logprobs": 2}}])
    completion_batch = create(batch_api, upload(batch_api, completion)["id"],
                              endpoint="/v1/completions").json()
    wait_until(lambda: r.zcard(GENERATE.pending) == 3, what="3 generate lines queued")
    answer(r, GENERATE, output=output)

    done = wait_status(getter(batch_api, chat_batch["id"]), "completed")
    out = {line["custom_id"]: line["response"]["body"]
           for line in content(batch_api, done["output_file_id"])}
    assert out["without"]["choices"][0]["logprobs"] is None
    assert out["with"]["choices"][0]["logprobs"] == {"refusal": None, "content": [
        {"token": "echo", "logprob": -0.25, "bytes": list(b"echo"),
         "top_logprobs": [{"token": "echo", "logprob": -0.25, "bytes": list(b"echo")},
                          {"token": "?", "logprob": -3.0, "bytes": list(b"?")}]},
        {"token": "logprobs", "logprob": -0.5, "bytes": list(b"logprobs"),
         "top_logprobs": [{"token": "logprobs", "logprob": -0.5, "bytes": list(b"logprobs")},
                          {"token": "?", "logprob": -3.0, "bytes": list(b"?")}]}]}

    done = wait_status(getter(batch_api, completion_batch["id"]), "completed")
    (line,) = content(batch_api, done["output_file_id"])
    assert line["response"]["body"]["choices"][0]["logprobs"] == {
        "tokens": ["echo", "logprobs"], "token_logprobs": [-0.25, -0.5],
        "top_logprobs": [{"echo": -0.25, "?": -3.0}, {"logprobs": -0.5, "?": -3.0}],
        "text_offset": [0, 4]}


def test_cancel_withdraws_waiting_lines_and_keeps_finished_ones(
        batch_api: TestClient, r: redis.Redis) -> None:
    file_id = upload(batch_api, jsonl([embed_line(f"l{i}", f"t{i}") for i in range(6)]))["id"]
    batch = create(batch_api, file_id).json()
    get = getter(batch_api, batch["id"])
    wait_until(lambda: r.zcard(EMBED.pending) == 6, what="lines queued")
    answer(r, limit=2)  # two finished
    # two running: claimed, not completed
    from inferq.protocol import ops
    scripts = ops.register(r)
    k, a = ops.claim_call(EMBED, "slow-worker", 30_000, 2, 60_000)
    running = ops.parse_claim(scripts["claim"](keys=k, args=a)).claimed
    assert len(running) == 2
    cancelled = batch_api.post(f"/v1/batches/{batch['id']}/cancel").json()
    assert cancelled["status"] == "cancelling" and isinstance(cancelled["cancelling_at"], int)
    wait_until(lambda: r.zcard(EMBED.pending) == 0, what="waiting lines withdrawn")
    assert get()["status"] == "cancelling"  # the running ones are still running
    # cancel again: the same answer, not an error (the second call)
    assert batch_api.post(f"/v1/batches/{batch['id']}/cancel").status_code == 200
    from inferq.protocol.codec import Result, Status, encode_result
    k, a = ops.complete_call(EMBED, 60_000, 100, [
        ops.Completion(c, "ok", encode_result(Result(
            id=c.id, status=Status.OK, output=[1.0, 2.0], attempts=1))) for c in running])
    scripts["complete"](keys=k, args=a)
    done = wait_status(get, "cancelled")
    assert isinstance(done["cancelled_at"], int) and done["completed_at"] is None
    assert done["request_counts"]["completed"] == 4
    assert done["inferq"]["withdrawn"] == 2
    assert len(content(batch_api, done["output_file_id"])) == 4
    assert done["error_file_id"] is None
    after = batch_api.post(f"/v1/batches/{batch['id']}/cancel")
    assert after.status_code == 200 and after.json()["status"] == "cancelled"


def test_a_finished_batch_cannot_be_cancelled(batch_api: TestClient, r: redis.Redis) -> None:
    file_id = upload(batch_api, jsonl([embed_line("a", "x")]))["id"]
    batch = create(batch_api, file_id).json()
    wait_until(lambda: r.zcard(EMBED.pending) == 1, what="queued")
    answer(r)
    wait_status(getter(batch_api, batch["id"]), "completed")
    response = batch_api.post(f"/v1/batches/{batch['id']}/cancel")
    assert response.status_code == 409
    assert batch_api.post("/v1/batches/batch_nope/cancel").status_code == 404
    assert batch_api.get("/v1/batches/batch_nope").status_code == 404


def test_lines_still_waiting_at_the_end_of_the_window_are_expired(
        batch_api: TestClient, r: redis.Redis) -> None:
    file_id = upload(batch_api, jsonl([embed_line(f"e{i}", f"t{i}") for i in range(4)]))["id"]
    batch = create(batch_api, file_id).json()
    wait_until(lambda: r.zcard(EMBED.pending) == 4, what="queued")
    answer(r, limit=1)
    # The window ends now (the test moves the batch's end instead of waiting 24 h).
    keys = BatchKeys.of(batch["id"], "embed", "echo")
    r.hset(keys.batch, BatchField.EXPIRES_AT, int(time.time()) - 1)
    done = wait_status(getter(batch_api, batch["id"]), "expired")
    assert isinstance(done["expired_at"], int)
    assert done["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    errors = content(batch_api, done["error_file_id"])
    assert len(errors) == 3
    assert all(e["response"] is None and e["error"]["code"] == "expired" for e in errors)
    assert r.zcard(EMBED.pending) == 0


def test_the_feed_bounds_the_lines_waiting_in_the_queue(
        make_api: MakeApi, tmp_path: Path, r: redis.Redis,
        capsys: pytest.CaptureFixture[str]) -> None:
    with make_api(file_store=str(tmp_path), batch_idle_s=0.2, batch_chunk=3,
                  batch_max_outstanding=5) as api:
        file_id = upload(api, jsonl([embed_line(f"f{i}", f"t{i}") for i in range(20)]))["id"]
        batch = create(api, file_id).json()
        get = getter(api, batch["id"])
        answered = 0
        while answered < 20:
            wait_until(lambda: r.zcard(EMBED.pending) > 0, what="lines queued")
            assert r.zcard(EMBED.pending) <= 5
            answered += len(answer(r, limit=2))
            if answered == 10:  # progress, as inferq stats and the stats route show it
                section = batch_section(r)
                assert section.startswith("batches in_progress=1")
                assert f"batch {batch['id']} in_progress /v1/embeddings echo" in section
                stats = api.get("/v1/batches/stats").json()
                assert stats["batches"] == {"in_progress": 1}
                assert [b["id"] for b in stats["active"]] == [batch["id"]]
        done = wait_status(get, "completed")
        stats = api.get("/v1/batches/stats").json()
        assert stats["batches"] == {"completed": 1} and stats["active"] == []
        assert stats["lines"]["completed"] == 20
        assert "lines completed=20, failed=0" in batch_section(r)
        watch(r, None, 0.01, as_json=False, rounds=1)
        assert "batches completed=1" in capsys.readouterr().out
        assert done["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
        assert len(content(api, done["output_file_id"])) == 20


def test_re_ingesting_a_line_queues_it_once(batch_api: TestClient, r: redis.Redis) -> None:
    """A step that queued lines and died before its commit is redone: the same ids."""
    file_id = upload(batch_api, jsonl([embed_line("a", "x"), embed_line("b", "y")]))["id"]
    batch = create(batch_api, file_id).json()
    wait_until(lambda: r.zcard(EMBED.pending) == 2, what="queued")
    keys = BatchKeys.of(batch["id"], "embed", "echo")
    # Roll the cursor back as if the commit had been lost: the next step queues them again.
    r.hset(keys.batch, mapping={BatchField.CURSOR: 0, BatchField.OFFSET: 0})
    r.lpush("inferq:{batches}:wake", batch["id"])
    wait_until(lambda: int(r.hget(keys.batch, BatchField.CURSOR) or 0) == 2, what="re-ingested")
    assert r.zcard(EMBED.pending) == 2
    answer(r)
    done = wait_status(getter(batch_api, batch["id"]), "completed")
    assert len(content(batch_api, done["output_file_id"])) == 2




async def test_one_holder_at_a_time_and_a_stale_holder_cannot_commit(
        redis_url: str, tmp_path: Path) -> None:
    from inferq.batch import ops
    from inferq.batch.batches import Batches
    from inferq.batch.config import BatchConfig
    from inferq.batch.files import Files
    from inferq.batch.keys import Index
    from inferq.batch.runner import BatchRunner, Held, LeaseLost
    from inferq.batch.store import FileStore
    from inferq.producer.aio import AsyncClient

    async with AsyncClient(redis_url) as client:
        files = Files(client.redis, FileStore(str(tmp_path)), Index())
        batches = Batches(client.redis, files, BatchConfig(lease_s=30), "inferq")
        import io
        made = await files.upload("in.jsonl", "batch", io.BytesIO(jsonl([embed_line("a", "x")])),
                                  1 << 20)
        assert made is not None
        batch = await batches.create(made["id"], "/v1/embeddings", "24h", None)
        keys = await batches.keys_of(batch["id"])
        assert keys is not None
        first, second = BatchRunner(batches, client), BatchRunner(batches, client)
        assert await first.lease(keys) == "validating"
        assert await second.lease(keys) is None  # held
        assert await first.lease(keys) == "validating"  # renewed: the second call
        worked, _ = await second.step(batch["id"])
        assert worked is False
        # The first holder's lease lapses (it stalled); the second takes the batch over.
        await client.redis.hset(keys.batch, BatchField.LEASE_UNTIL, 0)
        assert await second.lease(keys) == "validating"
        stale = Held(keys, {BatchField.STATUS: "validating"})
        with pytest.raises(LeaseLost):
            await first.commit(stale, ops.Step(0, False, 0, 1, 10))
        with pytest.raises(LeaseLost):
            await first.move(stale, ("validating",), "in_progress", "in_progress_at")
        assert (await batches.get(batch["id"]) or {})["status"] == "validating"
        # The holder's step with a stale position is refused, not applied twice.
        k, a = ops.commit_call(keys, second.token, ops.Step(5, True, 0, 1, 10))
        assert await batches.scripts["commit"](keys=k, args=a) == b"stale"
        assert (await batches.get(batch["id"]) or {})["inferq"]["ingested"] == 0


async def test_a_batch_whose_steps_fail_stops_no_other_batch(
        redis_url: str, tmp_path: Path, r: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """Per-batch isolation in the runner's round: a batch whose state breaks its steps (a
    damaged counter here) is logged and backed off; the batches beside it go on."""
    import io

    from inferq.batch.batches import Batches
    from inferq.batch.config import BatchConfig
    from inferq.batch.files import Files
    from inferq.batch.keys import Index
    from inferq.batch.runner import BatchRunner
    from inferq.batch.store import FileStore
    from inferq.producer.aio import AsyncClient

    async with AsyncClient(redis_url) as client:
        files = Files(client.redis, FileStore(str(tmp_path)), Index())
        batches = Batches(client.redis, files, BatchConfig(lease_s=30), "inferq")

        async def new_batch(name: str) -> str:
            made = await files.upload("in.jsonl", "batch", io.BytesIO(jsonl(
                [embed_line(f"{name}-{i}", f"t{i}") for i in range(2)])), 1 << 20)
            assert made is not None
            return str((await batches.create(made["id"], "/v1/embeddings", "24h", None))["id"])

        broken = await new_batch("broken")
        await client.redis.hset(BatchKeys.of(broken, "embed", "echo").batch,
                                BatchField.TOTAL, "damaged")
        fine = [await new_batch(f"fine{n}") for n in range(3)]
        runner = BatchRunner(batches, client)
        for _ in range(3):  # validating -> in_progress, then the lines queued
            await runner.round()
        assert r.zcard(EMBED.pending) == 6
        for batch_id in fine:
            assert (await batches.get(batch_id) or {})["inferq"]["ingested"] == 2
        assert f"batch {broken}: a step failed (1 in a row)" in caplog.text
        assert "round failed" not in caplog.text
        assert "(2 in a row)" not in caplog.text  # backed off: not retried at once


def test_ingestion_waits_out_a_full_queue(make_api: MakeApi, tmp_path: Path,
                                          r: redis.Redis) -> None:
    """Back-pressure: the queue sheds priority -50 at half its depth (2 of 4 here); the lines
    it refuses are queued by later steps, none twice, none lost."""
    with make_api(file_store=str(tmp_path), batch_idle_s=0.2, max_queue_depth=4) as api:
        file_id = upload(api, jsonl([embed_line(f"q{i}", f"t{i}") for i in range(7)]))["id"]
        batch = create(api, file_id).json()
        keys = BatchKeys.of(batch["id"], "embed", "echo")
        served: list[str] = []
        while len(served) < 7:
            wait_until(lambda: r.zcard(EMBED.pending) > 0, what="lines queued")
            assert r.zcard(EMBED.pending) <= 2
            assert int(r.hget(keys.batch, BatchField.CURSOR) or 0) <= len(served) + 2
            served += answer(r)
        done = wait_status(getter(api, batch["id"]), "completed")
        assert len(served) == len(set(served)) == 7
        assert sorted(line["custom_id"] for line in content(api, done["output_file_id"])) == [
            f"q{i}" for i in range(7)]


async def test_a_holder_dying_mid_drain_or_mid_finalization_changes_nothing(
        redis_url: str, tmp_path: Path, r: redis.Redis) -> None:
    """A holder that dies after writing a part but before its commit, and one that dies in
    the middle of finalization: the next holder redoes both, and the output has every line
    exactly once."""
    import io

    from inferq.batch.batches import Batches
    from inferq.batch.config import BatchConfig
    from inferq.batch.files import Files
    from inferq.batch.keys import Index
    from inferq.batch.runner import BatchRunner
    from inferq.batch.store import FileStore
    from inferq.producer.aio import AsyncClient

    class Killed(Exception):
        pass

    async with AsyncClient(redis_url) as client:
        store = FileStore(str(tmp_path))
        files = Files(client.redis, store, Index())
        batches = Batches(client.redis, files, BatchConfig(lease_s=30), "inferq")
        made = await files.upload("in.jsonl", "batch", io.BytesIO(jsonl(
            [embed_line(f"k{i}", f"t{i}") for i in range(5)])), 1 << 20)
        assert made is not None
        batch_id = (await batches.create(made["id"], "/v1/embeddings", "24h", None))["id"]
        keys = BatchKeys.of(batch_id, "embed", "echo")

        async def status() -> str:
            return (await batches.get(batch_id) or {})["status"]

        async def take_over(runner: BatchRunner) -> None:
            await client.redis.hset(keys.batch, BatchField.LEASE_UNTIL, 0)  # the lease lapses
            assert await runner.lease(keys) is not None

        first = BatchRunner(batches, client)
        while r.zcard(EMBED.pending) < 5:
            await first.step(batch_id)
        assert answer(r)

        async def die(*_: Any) -> None:
            raise Killed

        first.commit = die  # type: ignore[method-assign]
        with pytest.raises(Killed):  # the part is written, the commit never happens
            await first.step(batch_id)
        assert r.llen(keys.inbox) == 5 and store.exists(f"batches/{batch_id}/part-0.out")

        second = BatchRunner(batches, client)
        await take_over(second)
        while await status() != "finalizing":
            await second.step(batch_id)
        files.record = die  # type: ignore[method-assign]
        with pytest.raises(Killed):  # the output file is written, not yet recorded
            await second.step(batch_id)
        assert await status() == "finalizing"
        del files.record  # the next process is healthy

        third = BatchRunner(batches, client)
        await take_over(third)
        while await status() != "completed":
            await third.step(batch_id)
        done = await batches.get(batch_id)
        assert done is not None and done["request_counts"]["completed"] == 5
        data = b"".join(store.blocks(f"files/{done['output_file_id']}"))
        assert sorted(line["custom_id"] for line in read_jsonl(data)) == [
            f"k{i}" for i in range(5)]
        assert not store.exists(f"batches/{batch_id}")
        assert r.llen(keys.inbox) == 0
