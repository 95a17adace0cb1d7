"""``python -m benchmarks <scenario> [options]`` (see benchmarks/README.md): each scenario is the
module ``benchmarks/<name>.py`` (``embed-load``: ``embed_load.py``) and its ``SCENARIO``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks.framework import Scenario

#: Every scenario, in the order ``--help`` lists them.
SCENARIOS = ("embed", "embed-load", "generate", "engines", "overhead", "serve", "scaleout",
             "priority", "priority-generate", "chaos", "cluster", "durability", "batch",
             "fairness", "llm-serve", "tenants", "slo", "affinity", "engine-vs-vllm")


def scenario(name: str) -> Scenario[Any]:
    found: Scenario[Any] = importlib.import_module(
        f"benchmarks.{name.replace('-', '_')}").SCENARIO
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    for name in SCENARIOS:
        s = scenario(name)
        s.build_parser(sub.add_parser(name, help=s.title, description=f"{name}: {s.title}"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return scenario(args.scenario).main(args)


if __name__ == "__main__":
    sys.exit(main())
