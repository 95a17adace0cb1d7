"""``inferq worker``: serve one queue (``task:model``) with the kind of worker its task needs.

The **window** worker (embed, score, ``generate --batching request``, built-in models) batches
adaptive windows; the **continuous** worker (generate) batches at every decode step. Each kind
owns its flags, and a flag of the other kind is refused with the reason instead of being
ignored. Those flags default to ``SUPPRESS`` (absent unless given), so their defaults live
once, in ``WorkerConfig`` and ``GenerationSettings``. The one CLI module that imports the
worker, lazily.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import logging
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

from inferq.cli.options import Subcommands, add_connection_options, connection_from_args
from inferq.connection import ConnectionSettings, sync_client, wrap_connection_errors
from inferq.errors import BackendUnavailable, ConfigError
from inferq.logs import set_context as set_log_context
from inferq.protocol.generation import GENERATE_TASK
from inferq.worker.core.backoff import STARTUP_WAIT_S, may_pass

if TYPE_CHECKING:
    from inferq.worker.core.lifecycle import QueueWorker

log = logging.getLogger("inferq.worker")

#: ``WorkerConfig`` fields set by flags of the same name, when given.
CONFIG_FLAGS = ("device", "dtype", "lease_ms", "heartbeat_ms", "drain_timeout_s",
                "result_ttl_s", "worker_id", "dead_letter_cap", "max_crashes",
                "suspect_delay_ms")
WINDOW_FLAGS = ("max_batch_size", "max_batch_tokens", "max_wait_ms")
#: ``GenerationSettings`` fields set by flags of the same name, when given.
CONTINUOUS_FLAGS = ("max_slots", "kv_cache_mb", "max_prefill_tokens", "stream_interval_ms",
                    "engine_process", "max_preemptions", "swap_mb", "engine", "vllm_option",
                    "prefix_cache_mb")
#: Continuous-worker flags that only one engine takes, with why the other refuses them.
ENGINE_FLAGS = {
    "transformers": {"vllm_option": "vLLM's engine arguments are for --engine vllm"},
    "vllm": {"swap_mb": "vLLM keeps its KV blocks; a preempted generation is recomputed from "
                        "its streamed tokens",
             "engine_process": "vLLM's engine always runs in the engine process",
             "prefix_cache_mb": "vLLM caches prefixes in its own KV blocks"},
}


def add_parser(sub: Subcommands) -> None:
    w = sub.add_parser(
        "worker", help="run a worker that serves one model (needs inferq[worker])",
        argument_default=argparse.SUPPRESS,
        # --engine must never be taken for an abbreviation of --engine-process.
        allow_abbrev=False,
        description="Serve the queue TASK:NAME: claim requests in batches, run them through "
                    "the model, write each result. Checks Redis and the model's source before "
                    "loading it; stops cleanly on SIGTERM/Ctrl-C (finishes the batch in hand, "
                    "gives unstarted claims back).")
    add_connection_options(w)
    w.add_argument("--model", required=True, metavar="NAME[=PATH_OR_HUB_ID]",
                   help="NAME=PATH_OR_HUB_ID (a local folder, or a Hugging Face hub id), or a "
                        "known NAME: minilm, smollm2, echo, sleep")
    w.add_argument("--task", default="embed", metavar="TASK",
                   help="the queue's task: embed, generate, score, or any task name the "
                        "model serves (echo, sleep and python: models serve any) "
                        "(default: embed)")
    w.add_argument("--device", choices=["auto", "cpu", "cuda"],
                   help="where the model runs (default: auto, CUDA when available)")
    w.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"],
                   help="weights' precision (default: auto, fp16/bf16 on CUDA, fp32 on CPU)")
    w.add_argument("--lease-ms", type=int, metavar="MS",
                   help="a request's lease: a worker that stops renewing it (killed, frozen) "
                        "loses it this long after its last heartbeat (default: 2000)")
    w.add_argument("--heartbeat-ms", type=int, metavar="MS",
                   help="how often the heartbeat thread renews the leases (default: lease / 4)")
    w.add_argument("--drain-timeout-s", type=float, metavar="S",
                   help="after SIGTERM: time to finish the work in hand before the rest is "
                        "abandoned to its leases (default: 30); the process is forced out 5 s "
                        "after that")
    w.add_argument("--result-ttl-s", type=float, metavar="S",
                   help="how long results stay readable (default: 3600)")
    w.add_argument("--dead-letter-cap", type=int, metavar="N",
                   help="dead letters kept per queue shard, the newest (default: 10000); "
                        "what falls off is counted (inferq dead-letter list)")
    w.add_argument("--max-crashes", type=int, metavar="N",
                   help="a request lost with its worker N times while it ran alone is "
                        "dead-lettered crashed_worker (default: 2)")
    w.add_argument("--suspect-delay-ms", type=int, metavar="MS",
                   help="a request lost with its worker again (a crashed batch's half that "
                        "crashed again) reruns no sooner than MS after, such reruns spaced MS "
                        "apart for the queue: a crash poison kills at most about one worker "
                        "per MS (default: the lease; 0: at once)")
    w.add_argument("--worker-id", metavar="ID",
                   help="name in stats, logs and metrics (default: host-pid-random)")
    w.add_argument("--metrics-port", type=int, metavar="PORT",
                   default=int(os.environ["INFERQ_METRICS_PORT"])
                   if os.environ.get("INFERQ_METRICS_PORT") else None,
                   help="serve Prometheus /metrics and /healthz on this port (0: any free one)")
    w.add_argument("--torch-threads", type=int, default=None, metavar="N",
                   help="torch intra-op threads on the CPU (default: torch's choice)")
    window = w.add_argument_group("window worker (embed, score, generate --batching request)")
    window.add_argument("--max-batch-size", type=int, metavar="N",
                        help="rows per batch (default: 32)")
    window.add_argument("--max-batch-tokens", type=int, metavar="N",
                        help="padded-token budget per batch (0 = no budget; default: 8192)")
    window.add_argument("--max-wait-ms", type=float, metavar="MS",
                        help="upper bound of the adaptive batch window (default: 20)")
    g = w.add_argument_group("continuous worker (generate)")
    g.add_argument("--batching", choices=["continuous", "request"],
                   help="generate: join and leave the batch at every decode step "
                        "(continuous, the default), or run whole windows through padded "
                        "generate (request: the window worker)")
    g.add_argument("--max-slots", type=int,
                   help="sequences decoded together in one step (default: 16)")
    g.add_argument("--kv-cache-mb", type=float,
                   help="KV cache budget (default: half the free GPU memory on CUDA, "
                        "1024 MiB on the CPU)")
    g.add_argument("--max-prefill-tokens", type=int,
                   help="prompt tokens prefilled per step (default: 2048)")
    g.add_argument("--stream-interval-ms", type=float,
                   help="write token streams and results at most this often (default: 25)")
    g.add_argument("--max-preemptions", type=int, metavar="N",
                   help="a running generation yields its slot to a waiting one of strictly "
                        "higher priority at most N times, keeping its tokens (default: 32; 0: "
                        "no preemption)")
    g.add_argument("--swap-mb", type=float, metavar="MB",
                   help="host memory for the KV caches of preempted generations, put back "
                        "when they resume; beyond it they are recomputed (default: as much as "
                        "the KV cache budget; 0: always recompute)")
    g.add_argument("--prefix-cache-mb", type=float, metavar="MB",
                   help="the transformers engine's prefix cache: KV of prompt prefixes it "
                        "computed, reused by later prompts that start with them, within what "
                        "running generations leave of the KV budget (default: 256; 0: off)")
    g.add_argument("--engine-process", action=argparse.BooleanOptionalAction,
                   help="run the model, KV cache and step loop in a child process of their "
                        "own, so the steps never wait for the GIL the Redis side holds; the "
                        "weights load only there (this process loads the tokenizer), and the "
                        "KV budget is sized there after them (default: on; "
                        "--no-engine-process runs them on a thread of the worker process)")
    g.add_argument("--engine", choices=["transformers", "vllm"],
                   help="what runs the model: transformers (inferq's own KV-cache loop, the "
                        "default) or vllm (vLLM's engine in the engine process; needs "
                        "inferq[vllm], or vLLM's CPU build: deploy/vllm/install-cpu.sh)")
    g.add_argument("--vllm-option", action="append", metavar="KEY=VALUE",
                   help="--engine vllm: an EngineArgs field passed through to vLLM "
                        "(e.g. tensor_parallel_size=2, enforce_eager=true); repeatable")
    w.set_defaults(run=run)


def given(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: value for name, value in vars(args).items() if name in names}


def _flags(names: dict[str, Any]) -> str:
    return ", ".join("--" + name.replace("_", "-") for name in names)


def refuse_foreign_flags(args: argparse.Namespace, builtin: bool, continuous: bool) -> None:
    """A flag the chosen kind of worker would ignore is an error that says why."""
    batching = vars(args).get("batching")
    if batching is not None and args.task != GENERATE_TASK:
        raise ConfigError(f"--batching: only --task {GENERATE_TASK} has a choice of batching; "
                          f"--task {args.task} is always served in adaptive windows")
    if batching == "continuous" and builtin:
        raise ConfigError(f"--batching continuous: the built-in model {args.model!r} has no "
                          "KV cache; it is served in adaptive windows (--batching request)")
    if continuous and (foreign := given(args, WINDOW_FLAGS)):
        raise ConfigError(f"{_flags(foreign)}: a --task {GENERATE_TASK} worker batches at every "
                          "decode step and has no window; use --max-slots and "
                          "--max-prefill-tokens, or --batching request")
    if not continuous and (foreign := given(args, CONTINUOUS_FLAGS)):
        served = (f"--task {args.task}" if args.task != GENERATE_TASK else
                  f"the built-in model {args.model!r}" if builtin else "--batching request")
        raise ConfigError(f"{_flags(foreign)}: only the continuous {GENERATE_TASK} worker has "
                          f"slots, a KV cache and token streams; this worker ({served}) batches "
                          "adaptive windows")


def refuse_engine_flags(args: argparse.Namespace) -> None:
    """A flag of one engine given to the other is an error that says why."""
    engine = vars(args).get("engine", "transformers")
    foreign = given(args, tuple(ENGINE_FLAGS[engine]))
    if engine == "vllm" and foreign.get("engine_process") is True:
        foreign.pop("engine_process")  # --engine-process is what vllm does anyway
    if foreign:
        name = next(iter(foreign))
        flag = ("--no-engine-process" if name == "engine_process"
                else "--" + name.replace("_", "-"))
        raise ConfigError(f"{flag}: not for --engine {engine}: {ENGINE_FLAGS[engine][name]}")


def generation_settings(args: argparse.Namespace) -> Any:
    """``GenerationSettings`` from the continuous worker's flags (``--vllm-option`` parsed)."""
    from inferq.worker.generate.settings import GenerationSettings
    from inferq.worker.generate.vllm.options import parse_options

    refuse_engine_flags(args)
    flags = given(args, CONTINUOUS_FLAGS)
    options = flags.pop("vllm_option", None)
    if options is not None:
        flags["vllm_options"] = parse_options(options)
    return GenerationSettings(**flags)


def check_vllm() -> None:
    """``--engine vllm`` where vLLM cannot be imported: say how to install it, now."""
    from inferq.worker.generate.vllm.load import vllm_available

    if not vllm_available():
        raise ConfigError("--engine vllm: vLLM is not installed here (CUDA: pip install "
                          "'inferq[vllm]'; CPU: deploy/vllm/install-cpu.sh, see "
                          "docs/guides/generation.md)")


#: How long ``check_server`` asks again a server that refuses connections or is loading.
SERVER_WAIT_S = STARTUP_WAIT_S


def check_server(settings: ConnectionSettings, wait_s: float | None = None) -> None:
    """A PING: a wrong URL, a server that is down, hung or not Redis fails in seconds, with
    the reason, before minutes of model loading. A server that cannot be reached or is loading
    its data is asked again (backoff) for up to ``wait_s`` (``SERVER_WAIT_S``) first: a
    supervisor restarts workers at the moment the server restarts too (the chaos run's kills
    just before a Redis restart), and a replacement that gave up at once would leave the fleet
    short for another start. A refused password fails at once."""
    give_up = time.monotonic() + (SERVER_WAIT_S if wait_s is None else wait_s)
    delay = 0.05
    client = sync_client(settings)
    try:
        while True:
            try:
                with wrap_connection_errors(settings):
                    client.ping()
                return
            except BackendUnavailable as exc:
                if not may_pass(exc) or time.monotonic() + delay > give_up:
                    raise
                if delay == 0.05:
                    log.warning("Redis not available yet (%s): asking again for up to %g s",
                                exc.message, give_up - time.monotonic())
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
    finally:
        client.close()


def check_metrics_port(port: int | None) -> None:
    """``--metrics-port`` taken by another process: say so now, not after the model load."""
    if not port:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as exc:
            reason = ("already in use" if exc.errno == errno.EADDRINUSE
                      else exc.strerror or str(exc))
            raise ConfigError(f"--metrics-port {port}: {reason} (choose another port, or 0 for "
                              "any free one)") from None


def quiet_progress_bars() -> None:
    """transformers draws a "Loading weights" bar on stderr; in a log file (not a terminal) it
    lands between the log lines twice (0 % and 100 %). The log says what is loading instead."""
    import sys

    if sys.stderr.isatty():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def check_source(spec: Any) -> None:
    from inferq.worker.models.registry import check_source as check

    check(spec)


def run(args: argparse.Namespace) -> int:
    from inferq.worker.core.config import WorkerConfig
    from inferq.worker.models.custom import PYTHON_PREFIX
    from inferq.worker.models.registry import BUILTIN_PREFIX, parse_model_arg

    spec = parse_model_arg(args.model)
    # A built-in model or your own class (python:...) is served in adaptive windows.
    builtin = spec.source.startswith((BUILTIN_PREFIX, PYTHON_PREFIX))
    continuous = (args.task == GENERATE_TASK and not builtin
                  and vars(args).get("batching", "continuous") == "continuous")
    refuse_foreign_flags(args, builtin, continuous)
    settings = generation_settings(args) if continuous else None
    if settings is not None and settings.engine == "vllm":
        check_vllm()
    window = given(args, WINDOW_FLAGS)
    if "max_batch_tokens" in window:
        window["max_batch_tokens"] = window["max_batch_tokens"] or None
    config = WorkerConfig(
        connection=connection_from_args(args), model_name=spec.name, model_spec=spec.source,
        task=args.task, metrics_port=args.metrics_port, **given(args, CONFIG_FLAGS), **window)
    set_log_context(worker=config.worker_id, queue=f"{config.task}:{config.model_name}")
    if args.torch_threads is not None:
        import torch

        torch.set_num_threads(args.torch_threads)
    ca = config.connection.ssl_ca_certs
    log.info("connecting to %s%s", config.connection.redacted_url, f" (CA {ca})" if ca else "")
    # Everything that can be checked in a second is checked before the (slow) model load.
    check_server(config.connection)
    check_metrics_port(args.metrics_port)
    check_source(spec)
    quiet_progress_bars()
    if continuous:
        from inferq.worker.generate.worker import GenerationWorker
        from inferq.worker.models.registry import load_causal_lm

        assert settings is not None
        # With an engine process the weights load there, and only there: this process needs
        # the tokenizer and configs (prompts, context length, end-of-sequence ids).
        weights = not settings.engine_process
        what = "model" if weights else "the tokenizer and config of"
        log.info("loading %s %s (%s) for %s on device %s...", what, spec.name, spec.source,
                 config.task, config.device)
        started = time.monotonic()
        lm = load_causal_lm(spec, device=config.device, dtype=config.dtype, weights=weights)
        log.info("loaded %s %s in %.1f s%s", what, spec.name, time.monotonic() - started,
                 "" if weights else "; the engine process loads the weights")
        worker: QueueWorker[Any] = GenerationWorker(config, lm, settings)
        settle_garbage_collector()
        try:
            code = asyncio.run(worker.run())
        finally:
            lm.close()
        return finish(worker, code)
    log.info("loading model %s (%s) for %s on device %s...", spec.name, spec.source,
             config.task, config.device)
    started = time.monotonic()
    from inferq.worker.models.registry import load_model
    from inferq.worker.window.worker import WindowWorker

    model = load_model(spec, config.task, device=config.device, dtype=config.dtype)
    log.info("loaded model %s in %.1f s", spec.name, time.monotonic() - started)
    worker = WindowWorker(config, model)
    settle_garbage_collector()
    try:
        code = asyncio.run(worker.run())
    finally:
        model.close()
    return finish(worker, code)


#: Allocations of container objects between two young-generation collections (CPython's
#: default: 700).
GC_YOUNG_THRESHOLD = 20_000


def settle_garbage_collector() -> None:
    """Before serving: the objects of the imports and the model load are kept out of every
    collection from now on (``gc.freeze``), and the young generation is collected after
    20,000 allocations instead of 700. The hot path makes a few short-lived dicts and lists per
    request, which reference counting frees; with the defaults the collector ran hundreds of
    times a second over them (the echo drain measured ~15% less worker CPU per request without
    it, ``benchmarks/hotpath.py``). Reference cycles are still collected, less often."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def finish(worker: QueueWorker[Any], code: int) -> int:
    """The exit code; a worker that abandoned a forward at its drain timeout exits at once
    (the interpreter would otherwise wait for the model thread at exit)."""
    if worker.abandoned:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return code
