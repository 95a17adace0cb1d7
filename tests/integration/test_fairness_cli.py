"""The fair-share commands through the CLI's entry point against a real server: ``inferq
queue set/show`` with tenant weights and limits, ``inferq enqueue --tenant`` (one prompt and
a file), and ``inferq stats`` per tenant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from inferq.cli.main import main
from inferq.protocol.keys import QueueKeys

KEYS = QueueKeys.for_model("embed", "fcli")


def test_weights_and_limits_are_set_shown_and_removed(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue", "set", "embed:fcli", "--tenant-weight", "team-a=3",
                 "--tenant-weight", "team-b=1", "--default-weight", "2",
                 "--tenant-max-depth", "team-a=1000", "--redis-url", redis_url]) == 0
    shown = capsys.readouterr().out
    assert "default weight 2" in shown
    assert "tenant team-a: weight 3, max depth 1000" in shown
    assert "tenant team-b: weight 1" in shown
    assert main(["queue", "show", "embed:fcli", "--json", "--redis-url", redis_url]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tenant_weights"] == {"team-a": 3, "team-b": 1}
    assert data["default_weight"] == 2 and data["tenant_max_depth"] == {"team-a": 1000}
    assert main(["queue", "set", "embed:fcli", "--remove-tenant", "team-b",
                 "--tenant-max-depth", "team-a=0", "--redis-url", redis_url]) == 0
    data_text = capsys.readouterr().out
    assert "team-b" not in data_text and "tenant team-a: weight 3\n" in data_text + "\n"
    # a bad name or weight changes nothing and says why
    assert main(["queue", "set", "embed:fcli", "--tenant-weight", "bad name=3",
                 "--redis-url", redis_url]) == 2
    assert main(["queue", "set", "embed:fcli", "--tenant-weight", "x=0",
                 "--redis-url", redis_url]) == 2
    err = capsys.readouterr().err
    assert "tenant must match" in err and "must be an integer in 1..1000000" in err


def test_enqueue_with_a_tenant_and_stats_per_tenant(
        redis_url: str, r: redis.Redis, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "hello", "--model", "fcli", "--tenant", "team-a", "--no-wait",
                 "--redis-url", redis_url]) == 0
    first = capsys.readouterr().out.strip()
    assert r.hget(KEYS.request(first), "tn") == b"team-a"
    lines = tmp_path / "in.jsonl"
    lines.write_text('"one"\n{"prompt": "two", "tenant": "team-b"}\n')
    assert main(["enqueue", "--file", str(lines), "--model", "fcli", "--tenant", "team-a",
                 "--no-wait", "--redis-url", redis_url]) == 0
    capsys.readouterr()
    assert main(["stats", "--redis-url", redis_url]) == 0
    assert "tenants (queued or running) team-a=2, team-b=1" in capsys.readouterr().out
    assert main(["stats", "--json", "--redis-url", redis_url]) == 0
    (stats,) = json.loads(capsys.readouterr().out)
    assert stats["tenants"] == {"team-a": 2, "team-b": 1}
    assert main(["enqueue", "x", "--model", "fcli", "--tenant", "a:b", "--no-wait",
                 "--redis-url", redis_url]) == 2
