"""End-to-end fixtures: ``inferq worker`` processes, stopped after the test; and the ``e2e``
marker on every test of this folder."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.support.processes import WorkerProcess

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def start_worker(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(*args: str, env: Mapping[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(redis_url, *args, log_dir=tmp_path, env=env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
