"""``python -m benchmarks <scenario> [options]``.

A scenario is a module with ``add_arguments(parser)`` and ``run(args) -> int``; add one to
``SCENARIOS``. Scenario modules import their heavy dependencies (torch, transformers) inside
functions, so building the parser stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

#: name -> (module, one-line description)
SCENARIOS: dict[str, tuple[str, str]] = {
    "generate": ("benchmarks.generation",
                 "text generation: continuous batching vs request-level batching vs batch 1"),
    "embed": ("benchmarks.embed_throughput",
              "MiniLM embeddings: full stack vs the bare model vs a batch-1 worker"),
    "chaos": ("benchmarks.chaos",
              "kills, pauses, a Redis restart, poison and expiry: nothing may be lost"),
    "embed-load": ("benchmarks.embed_load",
                   "MiniLM under open-loop Poisson arrivals, 25 to 125 percent of capacity"),
    "overhead": ("benchmarks.overhead",
                 "no-op requests: queue cost with 1/2/4 workers, Redis commands, vs arq and rq"),
    "scaleout": ("benchmarks.scaleout",
                 "1..16 workers on one queue (sleep model): throughput, Redis load, efficiency"),
    "priority": ("benchmarks.priority",
                 "high-priority trickle through a saturating low-priority flood"),
}


def _module(name: str) -> ModuleType:
    return importlib.import_module(SCENARIOS[name][0])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    for name, (_, help_text) in SCENARIOS.items():
        scenario = sub.add_parser(name, help=help_text, description=help_text)
        _module(name).add_arguments(scenario)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = _module(args.scenario).run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
