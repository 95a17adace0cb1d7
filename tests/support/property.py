"""Property tests (hypothesis): shared settings, the input counter and its summary.

Every property calls ``inputs.tried()`` once per example it actually executes (shrinking and
replays included); the end of the session prints how many inputs each property actually ran
and the total, e.g. ``property inputs tried: 1234``: the number comes from execution, not from
settings.

Examples are derandomized (the same inputs every run: the project's tests are deterministic)
and no example database is written. Set ``INFERQ_PROPERTY_EXPLORE=1`` to draw fresh random
inputs each run, and ``INFERQ_PROPERTY_SCALE=N`` to run N times more examples.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings

TRIED: Counter[str] = Counter()
OUTCOMES: dict[str, Counter[str]] = {}


def load_profile() -> None:
    settings.register_profile(
        "inferq-property",
        deadline=None,
        database=None,
        derandomize=os.environ.get("INFERQ_PROPERTY_EXPLORE", "") in ("", "0"),
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.large_base_example],
    )
    settings.load_profile("inferq-property")


def examples(n: int) -> int:
    """``n`` scaled by ``INFERQ_PROPERTY_SCALE`` (default 1)."""
    return max(1, int(n * float(os.environ.get("INFERQ_PROPERTY_SCALE", "1"))))


class InputCounter:
    def __init__(self, test_name: str) -> None:
        self.test_name = test_name

    def tried(self, n: int = 1) -> None:
        TRIED[self.test_name] += n

    def outcome(self, label: str) -> None:
        """Tally what an input did (``queued``, an error code, ...) for the summary."""
        OUTCOMES.setdefault(self.test_name, Counter())[label] += 1


def write_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TRIED:
        return
    terminalreporter.write_sep("-", "property-based tests")
    for name, n in sorted(TRIED.items()):
        outcomes = ", ".join(f"{label} {count}" for label, count
                             in sorted(OUTCOMES.get(name, {}).items()))
        terminalreporter.write_line(f"{name}: {n} inputs" + (f" ({outcomes})" if outcomes
                                                              else ""))
    terminalreporter.write_line(f"property inputs tried: {sum(TRIED.values())}")
