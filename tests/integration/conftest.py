"""Integration-level fixtures: an async SDK client, an in-process generate worker, and the
hypothesis profile and input counter of the property tests (with their end-of-run summary)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import pytest

import inferq
from tests.support.generation import gen_config
from tests.support.property import InputCounter, load_profile, write_summary

if TYPE_CHECKING:  # torch and transformers load slowly: imported when used
    from inferq.worker.generate.worker import GenerationWorker
    from inferq.worker.models.lm import CausalLM

load_profile()


@pytest.fixture
async def aclient(redis_url: str) -> AsyncIterator[inferq.AsyncClient]:
    async with inferq.AsyncClient(redis_url) as c:
        yield c


@pytest.fixture
async def gen_worker(redis_url: str, lm: CausalLM) -> AsyncIterator[Callable[..., Any]]:
    """``await start(**settings)`` runs a GenerationWorker in this event loop; stopped after.
    With ``engine_process=True`` its process holds the tokenizer and configs only (as the CLI
    loads them): the weights are in the engine process."""
    from inferq.worker.generate.settings import GenerationSettings
    from inferq.worker.generate.worker import GenerationWorker
    from inferq.worker.models.lm import CausalLM

    running: list[tuple[GenerationWorker, asyncio.Task[None]]] = []

    async def start(config: dict[str, Any] | None = None, **settings: Any) -> GenerationWorker:
        # The step loop on a thread unless a test asks for the engine process (the default of
        # `inferq worker`, which the end-to-end tests run): a child process per test costs
        # seconds of model loading.
        settings.setdefault("engine_process", False)
        generation = GenerationSettings(**settings)
        here = lm if not generation.engine_process else CausalLM(
            lm.source, device=lm.torch_device, dtype=lm.dtype, model_id=lm.model_id,
            weights=False)
        worker = GenerationWorker(gen_config(redis_url, **(config or {})), here, generation)
        task = asyncio.create_task(worker.run(install_signal_handlers=False))
        running.append((worker, task))
        return worker

    yield start
    for worker, task in running:
        worker.request_stop()
        await asyncio.wait_for(task, timeout=60)


@pytest.fixture
def inputs(request: pytest.FixtureRequest) -> InputCounter:
    return InputCounter(request.node.name)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    write_summary(terminalreporter)
