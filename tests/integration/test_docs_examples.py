"""The documentation's code examples (``docs/examples/*.py``, included into its pages) run as
written: each as a script in a process of its own, against a real server, with the test
playing the worker (``tests.support.batch.answer``: it claims what waits and completes it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from inferq.protocol.keys import QueueKeys
from tests.support.batch import EMBED, answer, vector_of
from tests.support.gateway import TOKEN

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
#: Every example has a test here (a new file without one fails ``test_every_example_runs``), but
#: README's tour, which needs a real worker and gateway: ``tests/e2e/test_readme_tour.py``.
TESTED = {"producer.py", "async_producer.py", "own_model.py", "openai_embeddings.py",
          "batch_embeddings.py"}
TESTED_END_TO_END = {"tour.py"}


def run_example(name: str, env: dict[str, str], r: redis.Redis | None = None,
                timeout_s: float = 60, keys: QueueKeys = EMBED) -> str:
    """Run ``docs/examples/NAME`` from a scratch folder; while it runs, answer every request
    it queued on ``keys`` (``embed:echo`` by default). Its stdout."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("INFERQ_", "OPENAI_"))}
    environ.update(env, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / name)], cwd=EXAMPLES, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, f"{name} did not finish in {timeout_s} s"
            if r is not None:
                answer(r, keys)
            time.sleep(0.02)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{err}"
    return out


def test_every_example_runs() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == TESTED | TESTED_END_TO_END


def test_producer(redis_url: str, r: redis.Redis) -> None:
    out = run_example("producer.py", {"INFERQ_REDIS_URL": redis_url}, r).splitlines()
    # status, output, then the wait and batch size a real worker reports (this one does not)
    assert out[0].startswith(f"ok {vector_of('The cat sat on the mat.')} ")
    assert out[1:] == [f"True {vector_of('one')}", f"True {vector_of('two')}",
                       "ok"]


def test_async_producer(redis_url: str, r: redis.Redis) -> None:
    out = run_example("async_producer.py", {"INFERQ_REDIS_URL": redis_url}, r)
    assert out == f"{[vector_of(f'text {i}') for i in range(3)]}\n"


def test_own_model() -> None:
    assert run_example("own_model.py", {}) == "[3.0, 7.5]\n"


def test_openai_embeddings(gateway: str, r: redis.Redis) -> None:
    pytest.importorskip("openai")
    out = run_example("openai_embeddings.py",
                      {"OPENAI_BASE_URL": gateway, "OPENAI_API_KEY": TOKEN}, r,
                      keys=QueueKeys.for_model("embed", "minilm"))
    assert out.splitlines() == [f"0 {vector_of('The cat sat on the mat.')}",
                                f"1 {vector_of('Hello')}"]


def test_batch_embeddings(redis_url: str, r: redis.Redis, tmp_path: Path) -> None:
    pytest.importorskip("openai")
    from pydantic import SecretStr

    from inferq.gateway import GatewaySettings
    from tests.support.gateway import serve

    settings = GatewaySettings(redis_url=SecretStr(redis_url), token=SecretStr(TOKEN),
                               require_served_model=False, file_store=str(tmp_path / "store"),
                               batch_idle_s=0.2)
    with serve(settings) as url:
        out = run_example("batch_embeddings.py",
                          {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": TOKEN}, r,
                          keys=QueueKeys.for_model("embed", "minilm")).splitlines()
    assert out[0] == "completed BatchRequestCounts(completed=3, failed=0, total=3)"
    # the test worker's vectors have 3 numbers (a MiniLM worker's have 384)
    assert sorted(out[1:]) == ["doc-0 200 3", "doc-1 200 3", "doc-2 200 3"]
