"""The billable tokens a worker's completions carry to the complete script (which counts them
in the usage hashes): a generation's usage, an embedding's input tokens, nothing for a retry."""

from __future__ import annotations

from inferq.connection import ConnectionSettings
from inferq.protocol import ops
from inferq.protocol.codec import RequestPayload, Usage
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.failures import failure_of
from inferq.worker.core.results import Claim, batch_completions, billable, completion

CONFIG = WorkerConfig(connection=ConnectionSettings("redis://127.0.0.1:1/0"), model_name="m",
                      model_spec="builtin:echo", worker_id="w1")


def claim(i: int) -> Claim:
    claimed = ops.Claimed(id=f"r{i}", payload=b"", token=f"t{i}", attempt=1,
                          enqueued_ms=1_700_000_000_000, deadline_ms=None, tenant="acme")
    payload = RequestPayload(id=f"r{i}", task="embed", model="m", prompt="p", max_attempts=3)
    return Claim(claimed, payload, 0.0, None, 1_700_000_000_500)


def test_a_generation_bills_its_usage() -> None:
    done = completion(CONFIG, claim(0), {"text": "hi"}, input_tokens=9,
                      usage=Usage(prompt_tokens=9, completion_tokens=4))
    assert (done.prompt_tokens, done.completion_tokens) == (9, 4)


def test_embeddings_bill_their_input_tokens_on_both_paths() -> None:
    claims = [claim(0), claim(1)]
    # [0.5] goes the fast path; an object msgpack cannot carry goes through completion()
    fast, slow = batch_completions(CONFIG, claims, [[0.5], {1, 2}], [7, 3],
                                   finished_ms=1_700_000_001_000, compute_ms=1.0)
    assert (fast.prompt_tokens, fast.completion_tokens) == (7, 0)
    assert (slow.prompt_tokens, slow.completion_tokens) == (3, 0)


def test_a_retry_and_a_result_without_counts_bill_nothing() -> None:
    retry = completion(CONFIG, claim(0), failure_of(RuntimeError("boom")))
    assert retry.status == "retry" and (retry.prompt_tokens, retry.completion_tokens) == (0, 0)
    assert billable({}) == (0, 0)
    assert billable({"input_tokens": None}) == (0, 0)
