"""``inferq stats --watch`` drawn by rich (the ``cli`` extra), and its plain fallback."""

from __future__ import annotations

import io
import sys

import pytest
import redis
from rich.console import Console

import inferq
from inferq.cli import statsview
from inferq.cli.stats import watch, watch_rich

pytestmark = pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")


def test_the_rich_view_shows_each_queue_and_redraws(client: inferq.Client,
                                                     r: redis.Redis) -> None:
    client.enqueue("a", model="m", priority=3)
    client.enqueue("b", model="m")
    out = io.StringIO()
    console = Console(file=out, width=140, force_terminal=True, color_system=None)
    assert watch_rich(r, None, 0.01, rounds=2, console=console) == 0
    text = out.getvalue()
    assert "embed:m" in text and "p3=1 p0=1" in text and "throughput/s" in text


def test_without_rich_watch_falls_back_to_plain_text(
        client: inferq.Client, r: redis.Redis, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)  # import rich fails, as without the extra
    assert not statsview.available()
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    client.enqueue("a", model="m")
    assert watch(r, None, 0.01, as_json=False, rounds=1) == 0
    out = capsys.readouterr().out
    assert "\x1b[2J" in out and "pending 1 (p0=1)" in out
