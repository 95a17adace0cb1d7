"""The package layers: the OpenAI translation (``inferq.openai``) and the batch runner
(``inferq.batch``) stand below the HTTP gateway, so loading them loads no FastAPI, and the
gateway imports the batch runner like any other module (no lazy import to break a loop)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

INFERQ = Path(__file__).resolve().parents[2] / "inferq"


@pytest.mark.parametrize("module", ["inferq.openai", "inferq.openai.requests",
                                    "inferq.openai.responses", "inferq.openai.errors",
                                    "inferq.batch", "inferq.batch.runner",
                                    "inferq.batch.lines"])
def test_importing_the_translation_or_the_batch_runner_loads_no_http_server(
        module: str) -> None:
    # A fresh interpreter: this one has loaded FastAPI already (other tests).
    code = (f"import sys, {module}; "
            "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'starlette', "
            "'uvicorn'}); assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_gateway_imports_the_batch_runner_at_the_top() -> None:
    tree = ast.parse((INFERQ / "gateway" / "batch_state.py").read_text())
    nested = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
              for inner in ast.walk(node) if isinstance(inner, ast.Import | ast.ImportFrom)]
    assert not nested, "batch_state imports inside a function: a loop to open?"
    top = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert "inferq.batch.runner" in top
    assert not any(isinstance(node, ast.If) for node in tree.body), "TYPE_CHECKING imports"
