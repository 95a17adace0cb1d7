"""Your own model (``inferq.models.Model``) in the window worker, in process: packing, failure
isolation and out-of-memory splitting work for it as for the built-in models; and loading it
from a ``python:`` spec."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inferq
from examples.linear_classifier import LinearClassifier, reference
from inferq.errors import ConfigError, ModelLoadError
from inferq.models import DeviceOutOfMemory, Model, ModelInput, RequestPayload
from inferq.worker.models.registry import ModelSpec, load_model
from inferq.worker.window.worker import WindowWorker
from tests.support.window_worker import config, run_worker, stop


class Shouter(Model):
    """Upper-cases prompts; 'poison' fails its batch; batches above ``fits`` rows run out of
    memory; 'no-int' cannot be prepared (int() raises ValueError)."""

    tasks = frozenset({"embed"})

    def load(self) -> None:
        self.fits = int(self.options.get("fits", "1000"))
        self.batches: list[int] = []

    def prepare_one(self, payload: RequestPayload) -> ModelInput:
        if payload.prompt.startswith("no-int"):
            int(payload.prompt)
        return ModelInput(len(payload.prompt), payload.prompt)

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        if len(batch) > self.fits:
            raise DeviceOutOfMemory(f"{len(batch)} rows do not fit")
        self.batches.append(len(batch))
        if any("poison" in item.data for item in batch):
            raise RuntimeError("poisoned batch")
        return [item.data.upper() for item in batch]


def shouter(**options: str) -> Shouter:
    model = Shouter(**options)
    model.load()
    return model


async def outcomes(handles: Sequence[inferq.AsyncHandle]) -> list[Any]:
    out: list[Any] = []
    for h in handles:
        try:
            out.append((await h.result(timeout=20)).output)
        except inferq.RequestFailed as exc:
            out.append(exc.error_code)
    return out


async def test_a_bad_request_fails_alone_in_prepare_and_in_forward(
        redis_url: str, aclient: inferq.AsyncClient) -> None:
    prompts = ["a", "no-int x", "b", "poison", "c"]
    handles = await aclient.enqueue_many(prompts, model="t")
    worker = WindowWorker(config(redis_url), shouter())
    task = await run_worker(worker)
    got = await outcomes(handles)
    await stop(worker, task)
    assert got == ["A", "invalid_input", "B", "model_error", "C"]


async def test_out_of_memory_splits_the_batch_and_lowers_the_budget(
        redis_url: str, aclient: inferq.AsyncClient) -> None:
    model = shouter(fits="2")
    prompts = [f"r{i}" for i in range(8)]
    handles = await aclient.enqueue_many(prompts, model="t")
    worker = WindowWorker(config(redis_url), model)
    task = await run_worker(worker)
    got = await outcomes(handles)
    await stop(worker, task)
    assert got == [p.upper() for p in prompts]
    assert max(model.batches) <= 2
    assert worker.memory.ooms >= 1


def test_a_python_spec_loads_the_class_with_its_options() -> None:
    spec = ModelSpec("clf", "python:examples.linear_classifier:LinearClassifier?dim=3&seed=7")
    model = load_model(spec, "classify", device="cpu")
    assert isinstance(model, LinearClassifier)
    assert model.W.shape == (3, 3) and model.device == "cpu"
    assert model.model_id == "python:examples.linear_classifier:LinearClassifier"
    x = np.asarray([[1.0, 2.0, 3.0]], dtype=np.float32)
    [item] = model.prepare([RequestPayload(id="a", task="classify", model="clf",
                                           prompt=json.dumps([1.0, 2.0, 3.0]))])
    assert isinstance(item, ModelInput)
    assert model.forward([item]) == reference(x, model.W, model.b)


@pytest.mark.parametrize(("source", "error", "says"), [
    ("python:examples.linear_classifier", ConfigError, "python:package.module:Class"),
    ("python:examples.no_such_module:X", ModelLoadError, "cannot import"),
    ("python:examples.linear_classifier:reference", ConfigError, "not a subclass"),
    ("python:examples.linear_classifier:LinearClassifier?colour=red", ConfigError,
     "unknown option(s) ['colour']"),
])
def test_a_bad_python_spec_is_refused_with_the_reason(source: str, error: type[Exception],
                                                      says: str) -> None:
    with pytest.raises(error) as info:
        load_model(ModelSpec("clf", source), "classify", device="cpu")
    assert says in str(info.value)


def test_a_model_serving_other_tasks_is_refused() -> None:
    with pytest.raises(ConfigError, match="serves tasks"):
        load_model(ModelSpec("clf", "python:examples.linear_classifier:LinearClassifier"),
                   "embed", device="cpu")


async def test_prepare_runs_per_request() -> None:
    model = shouter()
    got = await asyncio.to_thread(model.prepare, [
        RequestPayload(id="a", task="embed", model="t", prompt="hello"),
        RequestPayload(id="b", task="embed", model="t", prompt="no-int"),
    ])
    assert isinstance(got[0], ModelInput) and got[0].data == "hello"
    assert isinstance(got[1], inferq.InvalidInput)


def test_a_module_in_the_current_folder_is_importable(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_tripler.py").write_text(
        "from inferq.models import Model\n\n"
        "class Tripler(Model):\n"
        "    tasks = frozenset({'triple'})\n\n"
        "    def forward(self, batch):\n"
        "        return [item.data * 3 for item in batch]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    model = load_model(ModelSpec("t3", "python:my_tripler:Tripler"), "triple", device="cpu")
    [item] = model.prepare([RequestPayload(id="a", task="triple", model="t3", prompt="ab")])
    assert isinstance(item, ModelInput)
    assert model.forward([item]) == ["ababab"]


@pytest.mark.parametrize("error", [inferq.InvalidInput("no"), ValueError("no"),
                                   TypeError("no"), KeyError("no"), IndexError("no")])
def test_what_prepare_one_raises_fails_that_request_with_invalid_input(
        error: Exception) -> None:
    class Picky(Model):
        def prepare_one(self, payload: RequestPayload) -> ModelInput:
            if payload.prompt == "bad":
                raise error
            return ModelInput(1, payload.prompt)

        def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
            return [item.data for item in batch]

    got = Picky().prepare([RequestPayload(id=i, task="embed", model="t", prompt=p)
                           for i, p in (("a", "ok"), ("b", "bad"))])
    assert isinstance(got[0], ModelInput)
    assert isinstance(got[1], inferq.InvalidInput) and got[1].code == "invalid_input"


def test_a_value_that_is_not_a_model_input_counts_as_one_token() -> None:
    class Plain(Model):
        def prepare_one(self, payload: RequestPayload) -> Any:
            return payload.prompt * 2

        def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
            return [item.data for item in batch]

    [item] = Plain().prepare([RequestPayload(id="a", task="embed", model="t", prompt="xyz")])
    assert item == ModelInput(1, "xyzxyz")


def test_your_model_is_served_in_adaptive_windows_even_for_generate(
        capsys: pytest.CaptureFixture[str]) -> None:
    from inferq.cli.main import main
    from inferq.embedded import free_port

    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    spec = "m=python:examples.linear_classifier:LinearClassifier"
    assert main(["worker", "--redis-url", nowhere, "--model", spec, "--task", "generate",
                 "--max-slots", "4"]) == 2
    assert "batches adaptive windows" in capsys.readouterr().err
