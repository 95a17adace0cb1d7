"""A benchmark run with ``--engine vllm`` keeps its own RESULTS.md section and JSON: it used to
overwrite the default engine's ``priority-generate`` section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.priority_generate import SCENARIO

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "benchmarks" / "out" / "priority-generate-vllm.json"


@pytest.mark.parametrize(("engine", "section", "other", "flags"), [
    ("vllm", "priority-generate-vllm", "priority-generate", True),
    ("transformers", "priority-generate", "priority-generate-vllm", False),
])
def test_priority_generate_section_per_engine(tmp_path: Path, engine: str, section: str,
                                              other: str, flags: bool) -> None:
    report = json.loads(REPORT.read_text())
    report["config"]["engine"] = engine
    results = tmp_path / "RESULTS.md"
    results.write_text(f"<!-- {other}:start -->\nkept\n<!-- {other}:end -->\n")

    SCENARIO.save(report, tmp_path, results)

    text = results.read_text()
    assert f"<!-- {other}:start -->\nkept\n<!-- {other}:end -->" in text
    body = text.split(f"<!-- {section}:start -->")[1].split(f"<!-- {section}:end -->")[0]
    assert body.startswith(f"\n## {section}: ")
    assert ("--engine vllm --vllm-option enforce_eager=true`" in body) is flags
    assert (tmp_path / f"{section}.json").is_file()
    assert not (tmp_path / f"{other}.json").exists()
