"""Priority on the device through the public SDK and an ``inferq worker`` with its default
flags (engine process, preemption on): under a low-priority flood that fills every slot,
high-priority chats take running slots instead of waiting for a generation to end; the flood's
generations resume with their tokens, streams and attempts untouched; a stream after a
cancelled one streams; ``inferq stats`` counts the preemptions."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import inferq
from inferq.protocol.keys import QueueKeys
from tests.support.processes import WorkerProcess, wait_until

MODEL = "tinyprio"
KEYS = QueueKeys.for_model("generate", MODEL)


def stream_in_thread(handle: inferq.Handle, out: list[Any]) -> threading.Thread:
    def read() -> None:
        out.extend(handle.stream(timeout=300))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_high_priority_chats_preempt_a_low_priority_flood_with_default_flags(
        redis_url: str, client: inferq.Client, r: redis.Redis, tiny_path: Path,
        start_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_worker("--task", "generate", "--model", f"{MODEL}={tiny_path}",
                          "--max-slots", "4", "--device", "cpu")
    warm = client.enqueue("warm up", model=MODEL, task="generate",
                          params={"max_new_tokens": 2})
    assert warm.result(timeout=120).ok
    flood = client.enqueue_many(
        [{"prompt": f"flood {i} the queue worker", "priority": -10,
          "params": {"max_new_tokens": 400, "ignore_eos": True}} for i in range(8)],
        model=MODEL, task="generate")
    streams: list[list[Any]] = [[] for _ in flood]
    readers = [stream_in_thread(h, s) for h, s in zip(flood, streams, strict=True)]
    wait_until(lambda: sum(r.xlen(KEYS.stream(h.id)) >= 2 for h in flood) == 4, 120,
               "four running flood generations")
    chats = []
    for i in range(3):
        chat = client.enqueue(messages=[{"role": "user", "content": f"question {i}"}],
                              model=MODEL, task="generate", priority=50,
                              params={"max_new_tokens": 16, "ignore_eos": True})
        chats.append(chat.result(timeout=120))
    flood_results = [h.result(timeout=300) for h in flood]
    for reader in readers:
        reader.join(60)
    first_flood_end = min(res.finished_ms or 0 for res in flood_results)
    assert all(c.ok and (c.finished_ms or 0) < first_flood_end for c in chats)
    for stream, res in zip(streams, flood_results, strict=True):
        *deltas, final = stream
        assert res.ok and res.attempts == 1 and final == res
        assert "".join(deltas) == res.output["text"]
        assert len(res.output["token_ids"]) == 400
    # A cancelled generation, then a new one: the new one streams from its first token.
    cancelled = client.enqueue("cancel me", model=MODEL, task="generate",
                               params={"max_new_tokens": 400, "ignore_eos": True})
    for item in cancelled.stream(timeout=120):
        if isinstance(item, str) and item:
            assert cancelled.cancel()
    after = client.enqueue("after the cancel", model=MODEL, task="generate",
                           params={"max_new_tokens": 300, "ignore_eos": True})
    seen = 0
    for item in after.stream(timeout=120):
        if isinstance(item, str) and item:
            seen += 1
            if seen == 3:  # three text deltas while it still runs: it streams
                assert after.status() is inferq.RequestState.RUNNING
                break
    assert after.result(timeout=120).ok
    stats = subprocess.run([sys.executable, "-m", "inferq", "stats", "--redis-url", redis_url],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert "preemptions 3," in stats, stats
    assert worker.stop() == 0, worker.log[-3000:]
