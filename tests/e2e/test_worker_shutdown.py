"""Bounded shutdown of real ``inferq worker`` processes: after SIGTERM a worker exits within
its drain timeout plus a few seconds, whether its forward runs far longer or its Redis server
stops answering; the work it abandons is not lost."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import inferq
from inferq.embedded import EmbeddedServer, free_port
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
                          "--drain-timeout-s", str(DRAIN_S), "--worker-id", "draining")
    wait_until(lambda: forward_started(r, handle.id), 60, "the 2-minute forward to start")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=BOUND_S) == EXIT_OK
    # Abandoned, not given back: still in flight under its lease, its run counted.
    assert handle.peek() is None and r.zscore(KEYS.inflight, handle.id) is not None
    # The abandoned request is not lost: its lease expires and another worker runs it.
    start_worker("--model", "slow=builtin:sleep?batch_ms=10", "--worker-id", "next")
    result = handle.result(timeout=60)
    assert result.worker == "next" and result.output == "long"
    assert (result.attempts, result.lost_runs) == (1, 1)  # the abandoned run: lost, not failed
    client.close()


def test_a_worker_whose_redis_stops_answering_still_exits_within_the_bound(
        tmp_path: Path) -> None:
    with EmbeddedServer(tmp_path / "frozen-redis") as server:
        client = inferq.Client(server.url)
        handle = client.enqueue("stuck", model="slow")
        r = redis.Redis.from_url(server.url)
        worker = WorkerProcess(server.url, "--model", "slow=builtin:sleep?batch_ms=1500",
                               "--drain-timeout-s", str(DRAIN_S), "--worker-id", "stuck",
                               log_dir=tmp_path)
        try:
            wait_until(lambda: forward_started(r, handle.id), 60, "the forward to start")
            assert server.process is not None
            # Mid-forward, the server stops answering: the completion after the forward, the
            # heartbeat, the stats and the closing calls all hang on it.
            server.process.send_signal(signal.SIGSTOP)
            try:
                worker.proc.send_signal(signal.SIGTERM)
                code = worker.proc.wait(timeout=BOUND_S)
            finally:
                server.process.send_signal(signal.SIGCONT)
            # Out within the bound: after the drain timeout (0) or forced by the watchdog (3).
            assert code in (EXIT_OK, EXIT_FORCED), worker.log
        finally:
            worker.stop()
            r.close()
            client.close()


def test_a_second_sigterm_exits_at_once(
        redis_url: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]) -> None:
    client = inferq.Client(redis_url)
    handle = client.enqueue("long", model="slow")
    port = free_port()
    worker = start_worker("--model", "slow=builtin:sleep?batch_ms=120000",
                          "--drain-timeout-s", "600", "--worker-id", "impatient",
                          "--metrics-port", str(port))
    wait_until(lambda: forward_started(r, handle.id), 60, "the 2-minute forward to start")
    worker.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: healthz(port).get("stopping") is True, 30, "the first stop")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=BOUND_S) == EXIT_FORCED  # far before the drain timeout
    client.close()


def forward_started(r: redis.Redis, request_id: str) -> bool:
    """START marks a request as running right before the model runs it."""
    return bool(r.sismember(KEYS.started, request_id))


def healthz(port: int) -> dict[str, Any]:
    """The worker's ``/healthz`` JSON (200 or 503), or nothing before it serves."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
            body = reply.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except OSError:
        return {}
    detail: dict[str, Any] = json.loads(body)
    return detail
