"""README is a front page: short, its two commands the same as the getting-started page's,
every link resolving on GitHub (a file of this checkout, a heading of it), and every measured
figure taken from the RESULTS.md section it links to, with that section's date and command."""

from __future__ import annotations

import re

from tests.support.docs import README, ROOT, code_blocks, readme_section

TEXT = README.read_text(encoding="utf-8")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """GitHub's id for a Markdown heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: str) -> dict[str, str]:
    """A Markdown file's headings by anchor, each with its section (to the next heading of the
    same or a higher level)."""
    text = (ROOT / path).read_text(encoding="utf-8")
    found = list(re.finditer(r"^(#+) (.+)$", text, flags=re.M))
    out = {}
    for i, match in enumerate(found):
        level = len(match.group(1))
        end = next((m.start() for m in found[i + 1:] if len(m.group(1)) <= level), len(text))
        out[github_anchor(match.group(2))] = text[match.start():end]
    return out


def test_readme_is_at_most_150_lines() -> None:
    assert len(TEXT.splitlines()) <= 150


def test_the_two_commands_are_the_getting_started_pages() -> None:
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert code_blocks(TEXT, "bash")[0] == code_blocks(page, "bash")[0]
    assert "inferq demo" in code_blocks(TEXT, "bash")[0]


def test_every_link_resolves() -> None:
    links = LINK.findall(TEXT)
    assert len(links) > 20
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        assert (ROOT / path).exists(), link
        if anchor:
            assert anchor in headings(path), link


def test_measured_figures_come_from_the_sections_they_link() -> None:
    rows = [line for line in readme_section("Measured").splitlines()
            if line.startswith("| ") and "benchmarks/RESULTS.md#" in line]
    assert len(rows) >= 4
    sections = headings("benchmarks/RESULTS.md")
    for row in rows:
        what, figure, command = (cell.strip() for cell in row.strip("|").split(" | "))
        ((date, anchor),) = re.findall(r"\[(\d{4}-\d\d-\d\d)\]\(benchmarks/RESULTS\.md#([^)]+)\)",
                                       what)
        assert date in sections[anchor], row
        assert command.strip("`") in " ".join(sections[anchor].split()), row
        section = sections[anchor].replace(",", "")
        # every number of the figure (durations in seconds were converted from milliseconds)
        for number in re.findall(r"\d[\d,]*(?:\.\d+)?(?![\d.]| s\b)", figure):
            assert re.search(rf"(?<![\d.]){re.escape(number.replace(',', ''))}(?![\d])",
                             section), (number, row)
