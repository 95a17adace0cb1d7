"""``inferq batch`` against a real gateway (uvicorn in a thread), the test playing the worker:
submit (progress until done, then the output and errors downloaded), status, list, download,
cancel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from inferq.gateway import GatewaySettings
from tests.support.batch import answer, embed_line, jsonl, read_jsonl, vector_of
from tests.support.gateway import TOKEN, serve


@pytest.fixture
def gateway_url(redis_url: str, tmp_path: Path) -> Iterator[str]:
    settings = GatewaySettings(redis_url=SecretStr(redis_url), token=SecretStr(TOKEN),
                               require_served_model=False, file_store=str(tmp_path / "store"),
                               batch_idle_s=0.2)
    with serve(settings) as url:
        yield url


def cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INFERQ_API_URL": url, "INFERQ_API_TOKEN": TOKEN}
    return subprocess.run([sys.executable, "-m", "inferq", "batch", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_submit_runs_a_batch_and_downloads_its_files(
        gateway_url: str, r: redis.Redis, tmp_path: Path) -> None:
    source = tmp_path / "docs.jsonl"
    rows = [embed_line(f"d{i}", f"doc {i}") for i in range(5)]
    rows.append(embed_line("bad", ["a", "b"]))  # type: ignore[arg-type]
    source.write_bytes(jsonl(rows))
    env = {**os.environ, "INFERQ_API_URL": gateway_url, "INFERQ_API_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "inferq", "batch", "submit", str(source),
                             "--endpoint", "/v1/embeddings", "--priority", "-20",
                             "--poll-s", "0.1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:  # the test is the worker
        answer(r)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "5 completed, 1 failed of 6" in out
    output = read_jsonl((tmp_path / "docs.output.jsonl").read_bytes())
    assert sorted(line["custom_id"] for line in output) == [f"d{i}" for i in range(5)]
    assert output[0]["response"]["body"]["data"][0]["embedding"] == vector_of(
        f"doc {output[0]['custom_id'][1:]}")
    (error,) = read_jsonl((tmp_path / "docs.errors.jsonl").read_bytes())
    assert error["custom_id"] == "bad"
    batch_id = out.split()[1]

    status = cli("status", batch_id, "--json", url=gateway_url)
    body = json.loads(status.stdout)
    assert body["status"] == "completed" and body["inferq"]["priority"] == -20
    listed = cli("list", url=gateway_url)
    assert batch_id in listed.stdout and "completed" in listed.stdout
    target = tmp_path / "again.output.jsonl"
    fetched = cli("download", batch_id, "--output", str(target), url=gateway_url)
    assert fetched.returncode == 0
    assert target.read_bytes() == (tmp_path / "docs.output.jsonl").read_bytes()
    assert (tmp_path / "again.errors.jsonl").exists()
    refused = cli("cancel", batch_id, url=gateway_url)
    assert refused.returncode == 2 and "[conflict]" in refused.stderr


def test_cancel_and_errors_from_the_cli(gateway_url: str, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([embed_line("a", "x"), embed_line("a", "y")]))
    dup = cli("submit", str(source), "--endpoint", "/v1/embeddings", url=gateway_url)
    assert dup.returncode == 2 and "[duplicate_custom_id]" in dup.stderr
    assert "line 2" in dup.stderr
    source.write_bytes(jsonl([embed_line("a", "x")]))
    made = cli("submit", str(source), "--endpoint", "/v1/embeddings", "--no-wait",
               url=gateway_url)
    assert made.returncode == 0
    batch_id = made.stdout.split()[1]
    cancelled = cli("cancel", batch_id, url=gateway_url)
    assert cancelled.returncode == 0 and "cancel" in cancelled.stdout
    wrong_token = subprocess.run(
        [sys.executable, "-m", "inferq", "batch", "list", "--url", gateway_url, "--token",
         "nope"], capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("INFERQ_API")})
    assert wrong_token.returncode == 2 and "invalid_api_key" in wrong_token.stderr
