"""The worker runtime's defaults and its bounded-stop machinery, without a server: the lease,
heartbeat, sweep and drain defaults and their flags; a cancellation that a task swallows does
not hang the stop; a failing loop takes its partner down; the watchdog fires only when a stop
overruns."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from inferq.cli import worker as worker_cli
from inferq.cli.main import build_parser
from inferq.connection import ConnectionSettings
from inferq.errors import ConfigError
from inferq.protocol.codec import build_request
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.lifecycle import StopWatchdog, cancel, run_together
from inferq.worker.models.builtin import SleepModel


def make_config(**kw: object) -> WorkerConfig:
    return WorkerConfig(connection=ConnectionSettings("redis://unused"), model_name="m",
                        model_spec="echo",
                        **kw)  # type: ignore[arg-type]


def test_fast_recovery_defaults() -> None:
    config = make_config()
    assert config.lease_ms == 2_000
    assert config.heartbeat_s == pytest.approx(0.5)  # lease / 4
    assert config.reclaim_s == pytest.approx(0.25)  # lease / 8
    assert config.drain_timeout_s == 30.0
    assert make_config(lease_ms=800, heartbeat_ms=100).heartbeat_s == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [0, -1, 3601])
def test_a_bad_drain_timeout_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ConfigError, match="drain_timeout_s"):
        make_config(drain_timeout_s=bad)


def test_the_worker_flags_reach_the_config() -> None:
    args = build_parser().parse_args(
        ["worker", "--model", "echo", "--lease-ms", "1500", "--heartbeat-ms", "300",
         "--drain-timeout-s", "7.5"])
    assert worker_cli.given(args, worker_cli.CONFIG_FLAGS) == {
        "lease_ms": 1500, "heartbeat_ms": 300, "drain_timeout_s": 7.5}
    bare = build_parser().parse_args(["worker", "--model", "echo"])
    assert worker_cli.given(bare, worker_cli.CONFIG_FLAGS) == {}  # defaults: WorkerConfig's


async def test_cancel_gives_up_on_a_task_that_swallows_its_cancellation() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            # What redis-py's wait_for can do to a cancellation on Python 3.11: swallow it.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    assert await cancel(task, timeout=0.05) is False
    assert not task.done()
    release.set()
    task.cancel()
    await asyncio.wait({task}, timeout=5)


async def test_run_together_cancels_the_partner_of_a_failed_loop() -> None:
    partner_cancelled = asyncio.Event()

    async def partner() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            partner_cancelled.set()
            raise

    async def failing() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        await run_together(partner(), failing())
    assert partner_cancelled.is_set()


def test_the_watchdog_fires_only_when_the_stop_overruns() -> None:
    overrun = StopWatchdog("w", hard_exit=False)
    overrun.arm(0.05, "stop")
    assert overrun.fired.wait(5)
    in_time = StopWatchdog("w", hard_exit=False)
    in_time.arm(0.2, "stop")
    in_time.disarm()
    assert not in_time.fired.wait(0.4)


def test_the_sleep_model_records_what_it_starts_to_run(tmp_path: Path) -> None:
    model = SleepModel.from_options({"batch_ms": "0", "record": str(tmp_path)})
    inputs = model.prepare([build_request("a b", model="m", id="1", task="embed"),
                            build_request("c", model="m", id="2", task="embed")])
    assert model.forward([i for i in inputs if not isinstance(i, Exception)]) == ["a b", "c"]
    model.close()
    (ran,) = tmp_path.glob("*.ran")
    assert ran.read_text() == "a b\nc\n"
    with pytest.raises(ConfigError, match="record="):
        SleepModel(record=str(tmp_path / "missing"))
