"""The documentation site builds strictly (``mkdocs build --strict``: a broken link, anchor,
snippet or nav entry fails), with its generated reference pages; skipped where mkdocs-material
is not installed (``pip install -e '.[docs]'``). The generator of those pages
(``docs/hooks/reference.py``) is checked without mkdocs: every command, script and metric has
its place."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs import ROOT, code_blocks, reference


def test_cli_page_has_every_command() -> None:
    from inferq.cli.main import build_parser

    ref = reference()
    page = ref.cli_page()
    for name, sub in ref._subparsers(build_parser()).items():
        assert f"\n## inferq {name}\n" in page
        for leaf in ref._subparsers(sub):
            assert f"\n### inferq {name} {leaf}\n" in page


def test_lua_page_has_every_script_header() -> None:
    ref = reference()
    page = ref.lua_page()
    for path in [*ref.LUA.glob("*.lua"), *(ref.LUA / "batch").glob("*.lua")]:
        header = ref.lua_header(path)
        assert "Output" in header, path  # a script's header names its input and output
        assert header in page
    for path in (ref.LUA / "includes").glob("*.lua"):  # helpers: their leading comments
        assert f"### `includes/{path.name}`" in page


def test_metrics_page_has_every_metric() -> None:
    pytest.importorskip("prometheus_client")
    from inferq.worker.core.metrics import WorkerMetrics

    page = reference().metrics_page()
    for family in WorkerMetrics("embed:x", "w").registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"| `{name}` |" in page


@pytest.mark.skipif(importlib.util.find_spec("material") is None
                    or importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs-material is not installed (the docs extra)")
def test_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    site = tmp_path / "site"
    # the generated pages are there, with what the code says
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "inferq worker" in cli and "--max-batch-size" in cli
    assert "INFERQ_GATEWAY_TOKEN" in (site / "reference" / "gateway-settings" / "index.html"
                                      ).read_text()
    assert "inferq_queue_depth" in (site / "reference" / "metrics" / "index.html").read_text()
    assert "logit_bias" in (site / "reference" / "openai-fields" / "index.html").read_text()
    assert "KEYS[1] pending" in (site / "reference" / "lua" / "index.html").read_text()
    assert (site / "benchmarks" / "plots" / "overhead-throughput.png").is_file()
    # the examples are included, not referenced
    assert "enqueue_many" in (site / "getting-started" / "index.html").read_text()
    # no fonts or scripts from the internet
    assert not any("fonts.googleapis" in p.read_text() for p in site.rglob("*.html"))


def test_every_python_block_of_the_pages_parses() -> None:
    """Whole examples are files (``docs/examples``, run by tests); the fragments written into
    the pages (a call or two, for an API's shape) are at least Python."""
    fragments = 0
    for page in (ROOT / "docs").rglob("*.md"):
        for block in code_blocks(page.read_text(encoding="utf-8"), "python"):
            if block.startswith("--8<--"):
                continue
            ast.parse(block, filename=str(page))
            fragments += 1
    assert fragments >= 5
