"""A request that kills every worker that runs it (a segfault in a native kernel, here a
custom model that SIGKILLs its own process on a marker) among innocent ones: the crashed
batches rerun in halves, only the poison ends up running alone, and it is dead-lettered
``crashed_worker`` after ``max_crashes`` (2) crashes alone. No innocent request loses an
attempt (each has only one) or is dead-lettered. From its second loss on, the poison's reruns
wait for the queue's suspect slots (``--suspect-delay-ms``): its deaths are paced."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest
import redis

import inferq
from inferq.protocol.keys import QueueKeys
from tests.support.processes import WorkerProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
KEYS = QueueKeys.for_model("embed", "crash")
INNOCENTS = 15
#: The bisection of a batch of 16 takes at most log2(16) = 4 crashes, then 2 alone.
MAX_DEATHS = 4 + 2
SUSPECT_DELAY_MS = 1000


def test_a_poison_request_is_dead_lettered_crashed_worker_and_no_innocent_loses_an_attempt(
        redis_url: str, r: redis.Redis, tmp_path: Path,
        start_worker: Callable[..., WorkerProcess]) -> None:
    ran_dir = tmp_path / "ran"
    ran_dir.mkdir()
    spec = (f"crash=python:tests.support.crashing_model:CrashingModel?marker=POISON"
            f"&batch_ms=200&record={ran_dir}")
    client = inferq.Client(redis_url)
    prompts = [f"innocent {i}" for i in range(INNOCENTS)]
    prompts.insert(7, "POISON")
    # One attempt each: were a lost run still an attempt, an innocent would be dead-lettered.
    handles = client.enqueue_many([{"prompt": p, "max_attempts": 1} for p in prompts],
                                  model="crash")
    started = 0

    def start() -> tuple[str, WorkerProcess]:
        nonlocal started
        started += 1
        return f"w{started}", start_worker(
            "--model", spec, "--max-batch-size", "16", "--max-wait-ms", "50",
            "--worker-id", f"w{started}", "--suspect-delay-ms", str(SUSPECT_DELAY_MS),
            env={"PYTHONPATH": str(ROOT)})

    workers = [start() for _ in range(3)]
    deaths = 0
    deadline = time.monotonic() + 120
    while not all(h.peek() is not None for h in handles):  # supervise: restart the dead
        assert time.monotonic() < deadline, "timed out waiting for every result"
        for i, (_, worker) in enumerate(workers):
            if worker.proc.poll() is not None:
                assert worker.proc.returncode == -9, worker.log  # killed by the poison only
                deaths += 1
                workers[i] = start()
        time.sleep(0.02)
    poison = handles.pop(7)
    with pytest.raises(inferq.RequestFailed) as info:
        poison.result(timeout=1)
    assert info.value.error_code == "crashed_worker"
    assert info.value.result.attempts == 0  # no run of it ever failed: it crashed them
    innocent = [h.result(timeout=1) for h in handles]
    assert all(res.ok and res.attempts == 1 for res in innocent)
    assert r.zrange(KEYS.dead, 0, -1) == [poison.id.encode()]
    # The evidence: it crashed a worker while running alone, twice; before that its batch
    # was halved at each crash.
    runs = Counter(line for path in ran_dir.glob("*.ran")
                   for line in path.read_text().splitlines())
    assert runs["1 POISON"] == 2, runs
    sizes = sorted({int(line.split()[0]) for line in runs if line.endswith("POISON")},
                   reverse=True)
    assert sizes == [s for s in (16, 8, 4, 2, 1) if s <= sizes[0]], sizes
    assert 2 <= deaths <= MAX_DEATHS
    # Paced: the first loss reruns at once, every later one waits a suspect delay at least.
    poison_starts = sorted(int(line.split()[0]) for path in ran_dir.glob("*.starts")
                           for line in path.read_text().splitlines()
                           if line.endswith("POISON"))
    gaps = [b - a for a, b in pairwise(poison_starts)]
    assert len(gaps) == len(sizes) and all(g >= SUSPECT_DELAY_MS for g in gaps[1:]), gaps
    lost = sum(res.lost_runs or 0 for res in innocent)
    print(f"poison dead-lettered after {deaths} worker deaths; poison batch sizes {sizes}; "
          f"innocent runs lost {lost}, none dead-lettered; ms between its runs {gaps}")
    for worker_id, worker in workers:  # a replacement may still be starting
        wait_until(lambda w=worker_id: r.zscore(KEYS.workers, w) is not None, 60, worker_id)
        assert worker.stop() == 0
    client.close()
