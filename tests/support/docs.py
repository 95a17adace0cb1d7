"""What the documentation tests share: the generator of the reference pages, loaded as a module
(``docs/hooks/reference.py`` is not a package), and the README's sections."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference",
                                                  ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_section(title: str) -> str:
    """README's ``## TITLE`` section, up to the next ``## `` heading."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def code_blocks(markdown: str, lang: str) -> list[str]:
    """The fenced ```LANG blocks of a Markdown text, without their fences."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", markdown, flags=re.M | re.S)
