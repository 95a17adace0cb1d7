"""Helpers shared by the property tests: the input counter and example-count scaling.

Every property calls ``inputs.tried()`` once per example it actually executes (shrinking and
replays included) and ``inputs.known_bug(name)`` when an example lands in a documented bug
region that the property tolerates; ``conftest.py`` prints the totals at the end.
"""

from __future__ import annotations

import os
from collections import Counter

TRIED: Counter[str] = Counter()
KNOWN_BUGS: Counter[str] = Counter()
OUTCOMES: dict[str, Counter[str]] = {}


def examples(n: int) -> int:
    """``n`` scaled by ``INFERQ_PROPERTY_SCALE`` (default 1)."""
    return max(1, int(n * float(os.environ.get("INFERQ_PROPERTY_SCALE", "1"))))


class InputCounter:
    def __init__(self, test_name: str) -> None:
        self.test_name = test_name

    def tried(self, n: int = 1) -> None:
        TRIED[self.test_name] += n

    def known_bug(self, name: str) -> None:
        KNOWN_BUGS[name] += 1

    def outcome(self, label: str) -> None:
        """Tally what an input did (``queued``, an error code, ...) for the summary."""
        OUTCOMES.setdefault(self.test_name, Counter())[label] += 1

    @property
    def count(self) -> int:
        return TRIED[self.test_name]
