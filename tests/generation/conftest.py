"""Fixtures for the generation tests: a tiny random Llama (with a locally trained byte-level BPE
tokenizer and a chat template) built once per test session, and an in-process generation
worker against the session's real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import inferq
from inferq.worker.core.config import WorkerConfig
from inferq.worker.generate.settings import GenerationSettings
from inferq.worker.generate.worker import GenerationWorker
from inferq.worker.generation.tiny import build_tiny_model
from inferq.worker.models.lm import CausalLM

MODEL = "tiny"


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def lm(tiny_path: Path) -> Iterator[CausalLM]:
    torch.manual_seed(0)
    model = CausalLM(str(tiny_path), device=torch.device("cpu"), dtype=torch.float32,
                     model_id=MODEL)
    yield model


def greedy_reference(lm: CausalLM, prompt_ids: list[int], max_new: int, *,
                     ignore_eos: bool = False) -> list[int]:
    """The request alone through transformers' own ``generate`` (greedy)."""
    # ignore_eos: generation goes on past an end-of-sequence token, which stays in the output.
    kwargs: dict[str, Any] = {"eos_token_id": None} if ignore_eos else {}
    with torch.inference_mode():
        out = lm.model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new,
                                do_sample=False, pad_token_id=lm.pad_id,
                                attention_mask=torch.ones((1, len(prompt_ids)),
                                                          dtype=torch.long), **kwargs)
    tokens: list[int] = out[0, len(prompt_ids):].tolist()
    return tokens


def gen_config(url: str, **kw: Any) -> WorkerConfig:
    base: dict[str, Any] = dict(redis_url=url, model_name=MODEL, model_spec="tiny",
                                task="generate", lease_ms=5_000, worker_id="gen-worker")
    base.update(kw)
    return WorkerConfig(**base)


@pytest.fixture
async def aclient(redis_url: str) -> AsyncIterator[inferq.AsyncClient]:
    async with inferq.AsyncClient(redis_url) as c:
        yield c


StartGen = Callable[..., "asyncio.Future[GenerationWorker]"]


@pytest.fixture
async def gen_worker(redis_url: str, lm: CausalLM) -> AsyncIterator[Callable[..., Any]]:
    """``await start(**settings)`` runs a GenerationWorker in this event loop; stopped after."""
    running: list[tuple[GenerationWorker, asyncio.Task[None]]] = []

    async def start(config: dict[str, Any] | None = None, **settings: Any) -> GenerationWorker:
        worker = GenerationWorker(gen_config(redis_url, **(config or {})), lm,
                                  GenerationSettings(**settings))
        task = asyncio.create_task(worker.run(install_signal_handlers=False))
        running.append((worker, task))
        return worker

    yield start
    for worker, task in running:
        worker.request_stop()
        await asyncio.wait_for(task, timeout=60)
