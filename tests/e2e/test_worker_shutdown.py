"""Bounded shutdown of real ``inferq worker`` processes: after SIGTERM a worker exits within
its drain timeout plus a few seconds, whether its forward runs far longer or its Redis server
stops answering; the work it abandons is not lost."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import redis

import inferq
from inferq.embedded import EmbeddedServer
from inferq.protocol.keys import QueueKeys
from inferq.worker.core.lifecycle import EXIT_FORCED, EXIT_OK, STOP_GRACE_S
from tests.support.processes import WorkerProcess, wait_until

KEYS = QueueKeys.for_model("embed", "slow")
DRAIN_S = 1.0
#: The bound a stop must keep, plus room for a loaded machine to start and schedule Python.
BOUND_S = DRAIN_S + STOP_GRACE_S + 10


def test_sigterm_during_a_long_batch_exits_within_the_drain_timeout(
        redis_url: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]) -> None:
    client = inferq.Client(redis_url)
    handle = client.enqueue("long", model="slow")
    worker = start_worker("--model", "slow=builtin:sleep?batch_ms=120000", "--lease-ms", "1000",
                          "--drain-timeout-s", str(DRAIN_S), "--worker-id", "draining",
                          env={"INFERQ_LOG_LEVEL": "DEBUG"})
    wait_until(lambda: "running 1 requests" in worker.log, 60, "the 2-minute forward to start")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=BOUND_S) == EXIT_OK
    assert "drain timeout (1 s) passed: abandoning the work in hand" in worker.log
    # The abandoned request is not lost: its lease expires and another worker runs it.
    start_worker("--model", "slow=builtin:sleep?batch_ms=10", "--worker-id", "next")
    result = handle.result(timeout=60)
    assert result.worker == "next" and result.output == "long"
    client.close()


def test_a_worker_whose_redis_stops_answering_still_exits_within_the_bound(
        tmp_path: Path) -> None:
    with EmbeddedServer(tmp_path / "frozen-redis") as server:
        client = inferq.Client(server.url)
        client.enqueue("stuck", model="slow")
        client.close()
        worker = WorkerProcess(server.url, "--model", "slow=builtin:sleep?batch_ms=1500",
                               "--drain-timeout-s", str(DRAIN_S), "--worker-id", "stuck",
                               log_dir=tmp_path, env={"INFERQ_LOG_LEVEL": "DEBUG"})
        try:
            wait_until(lambda: "running 1 requests" in worker.log, 60, "the forward to start")
            assert server.process is not None
            # Mid-forward, the server stops answering: the completion after the forward, the
            # heartbeat, the stats and the closing calls all hang on it.
            server.process.send_signal(signal.SIGSTOP)
            try:
                worker.proc.send_signal(signal.SIGTERM)
                code = worker.proc.wait(timeout=BOUND_S)
            finally:
                server.process.send_signal(signal.SIGCONT)
            assert code in (EXIT_OK, EXIT_FORCED), worker.log
            if code == EXIT_FORCED:
                assert "forcing the exit" in worker.log
            else:
                assert "drain timeout (1 s) passed" in worker.log
        finally:
            worker.stop()


def test_a_second_sigterm_exits_at_once(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    client = inferq.Client(redis_url)
    client.enqueue("long", model="slow")
    worker = start_worker("--model", "slow=builtin:sleep?batch_ms=120000",
                          "--drain-timeout-s", "600", "--worker-id", "impatient",
                          env={"INFERQ_LOG_LEVEL": "DEBUG"})
    wait_until(lambda: "running 1 requests" in worker.log, 60, "the 2-minute forward to start")
    worker.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "stopping: no new claims" in worker.log, 30, "the first stop")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=BOUND_S) == EXIT_FORCED  # far before the drain timeout
    assert "second SIGTERM: exiting now" in worker.log
    client.close()
