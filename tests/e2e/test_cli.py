"""The operator commands as a user runs them: demo, enqueue (one prompt, a file), stats, and a
worker's log lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import inferq
from tests.support.processes import WorkerProcess


def test_demo_runs_on_its_own_embedded_server(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "INFERQ_REDIS_URL"}
    data = tmp_path / "demo-data"
    done = subprocess.run(
        [sys.executable, "-m", "inferq", "demo", "--requests", "10", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "started " in out and "AOF in" in out  # it started its own server
    assert "10 results in" in out and "dimension 384" in out
    assert "worker ready: model loaded in" in out  # the load is shown, not silent
    assert "batch size prio  wait ms" in out  # rows by batch, then priority
    assert "batch statistics of the demo worker" in out and "mean batch" in out
    assert out.count("mean batch") == 1  # the worker's statistics once, not twice
    assert "totals include earlier demo runs" not in out
    again = subprocess.run(
        [sys.executable, "-m", "inferq", "demo", "--requests", "2", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "totals include earlier demo runs" in again.stdout  # the AOF kept the first run
    assert (data / "server.log").exists()
    assert any(p.name.startswith("appendonly") for p in data.iterdir())  # AOF persistence


def test_enqueue_and_stats_commands(redis_url: str,
                                    start_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_worker("--model", "echo", "--max-wait-ms", "2")
    cmd = [sys.executable, "-m", "inferq", "enqueue", "hello there", "--model", "echo",
           "--priority", "3", "--redis-url", redis_url, "--timeout", "60"]
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert '"output": "hello there"' in done.stdout and '"status": "ok"' in done.stdout
    short = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert short.returncode == 0, short.stderr
    first, second = short.stdout.splitlines()  # a two-line summary by default
    assert first == '"hello there"' and second.startswith("ok: id ")
    stats = subprocess.run([sys.executable, "-m", "inferq", "stats", "--redis-url", redis_url],
                           capture_output=True, text=True, timeout=60, check=False)
    assert stats.returncode == 0, stats.stderr
    assert "queue embed:echo" in stats.stdout and "live workers 1" in stats.stdout
    assert "totals (since the queue was created) ok=2" in stats.stdout
    bad = subprocess.run([*cmd[:5], "--model", "echo", "--priority", "1000", "--redis-url",
                          redis_url], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "invalid_request" in bad.stderr and "priority" in bad.stderr
    assert worker.stop() == 0


def test_worker_logs_are_json_lines_when_not_on_a_terminal(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_worker("--model", "echo", "--worker-id", "json-worker")
    client = inferq.Client(redis_url)
    assert client.enqueue("hi", model="echo").result(timeout=60).output == "hi"
    client.close()
    assert worker.stop() == 0
    lines = [json.loads(line) for line in worker.log.splitlines() if line.startswith("{")]
    assert lines, worker.log
    assert all(entry["worker"] == "json-worker" for entry in lines)
    assert any("serving embed:echo" in entry["msg"] for entry in lines)


def test_enqueue_file_writes_one_result_per_line(
        redis_url: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("--model", "echo")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join([json.dumps("plain"), json.dumps({"prompt": "x", "id": "x1",
                                                                   "priority": 9}),
                                  "", json.dumps({"prompt": "late", "deadline_s": 0.001})]))
    out = tmp_path / "results.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "inferq", "enqueue", "--file", str(prompts), "--out", str(out),
         "--model", "echo", "--redis-url", redis_url, "--timeout", "60"],
        capture_output=True, text=True, timeout=120, check=False)
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in results][:2] == ["ok", "ok"]
    assert results[1]["id"] == "x1" and results[0]["output"] == "plain"
    assert len(results) == 3
    assert "3 requests in" in done.stderr
    assert done.returncode == (0 if results[2]["status"] == "ok" else 1)
