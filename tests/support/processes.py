"""``inferq worker`` subprocesses, and waiting for a state another process creates."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0,
               what: str = "condition") -> None:
    """Wait for a state another process creates; fails loudly with what was awaited."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


class WorkerProcess:
    """An ``inferq worker`` subprocess whose log is kept for assertions."""

    def __init__(self, url: str, *args: str, log_dir: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.log_path = log_dir / f"worker-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "inferq", "worker", "--redis-url", url, *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env,
        )

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
