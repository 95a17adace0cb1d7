"""``inferq worker``."""

from __future__ import annotations

import argparse
import asyncio
import logging

from inferq.cli import generate_cmd
from inferq.logs import set_context as set_log_context
from inferq.worker.core.config import WorkerConfig, default_worker_id
from inferq.worker.models.registry import load_model, parse_model_arg
from inferq.worker.window.worker import Worker

log = logging.getLogger("inferq.worker")


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    spec = parse_model_arg(args.model)
    return WorkerConfig(
        redis_url=args.redis_url,
        model_name=spec.name,
        model_spec=spec.source,
        task=args.task,
        max_batch_size=args.max_batch_size,
        max_batch_tokens=args.max_batch_tokens or None,
        max_wait_ms=args.max_wait_ms,
        device=args.device,
        dtype=args.dtype,
        lease_ms=args.lease_ms,
        result_ttl_s=args.result_ttl_s,
        worker_id=args.worker_id or default_worker_id(),
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        metrics_port=args.metrics_port,
    )


def run_worker(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    set_log_context(worker=config.worker_id, queue=f"{config.task}:{config.model_name}")
    if args.torch_threads is not None:
        import torch

        torch.set_num_threads(args.torch_threads)
    log.info("connecting to %s%s", config.connection.redacted_url,
             f" (CA {config.tls_ca})" if config.tls_ca else "")
    spec = parse_model_arg(args.model)
    if generate_cmd.serves_continuous(args, config.task, spec.source):
        return generate_cmd.run_generation_worker(args, config)
    model = load_model(spec, config.task, device=config.device, dtype=config.dtype)
    try:
        asyncio.run(Worker(config, model).run())
    finally:
        model.close()
    return 0
