"""Property tests (hypothesis): shared settings, the ``inputs`` counter and its summary.

The end of the session prints how many inputs each property actually ran and the total, e.g.
``property inputs tried: 1234``: the number comes from execution, not from settings.

Examples are derandomized (the same inputs every run: the project's tests are deterministic)
and no example database is written. Set ``INFERQ_PROPERTY_EXPLORE=1`` to draw fresh random
inputs each run, and ``INFERQ_PROPERTY_SCALE=N`` to run N times more examples.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from tests.property.support import KNOWN_BUGS, OUTCOMES, TRIED, InputCounter

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


@pytest.fixture
def inputs(request: pytest.FixtureRequest) -> InputCounter:
    return InputCounter(request.node.name)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TRIED:
        return
    terminalreporter.write_sep("-", "property-based tests")
    for name, n in sorted(TRIED.items()):
        outcomes = ", ".join(f"{label} {count}" for label, count
                             in sorted(OUTCOMES.get(name, {}).items()))
        terminalreporter.write_line(f"{name}: {n} inputs" + (f" ({outcomes})" if outcomes
                                                              else ""))
    for name, n in sorted(KNOWN_BUGS.items()):
        terminalreporter.write_line(
            f"fixed-bug region {name!r}: hit by {n} inputs (each refused with a typed error)")
    terminalreporter.write_line(f"property inputs tried: {sum(TRIED.values())}")
