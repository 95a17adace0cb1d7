"""``--engine vllm`` without vLLM: the sampling mapping and what each engine refuses, the
engine options, the capacity read from vLLM's scheduler, and ``VllmEngine`` behind the step
loop over a fake ``LLMEngine`` (``tests.support.fake_vllm``): priority sign, worker-side
preemption and resumption from the streamed tokens, cancellation, reclaimed requests run
alone, stop token ids. The same behaviours on the real vLLM CPU build are in
tests/integration/test_generate_vllm.py."""

from __future__ import annotations

import pytest

from inferq.errors import ConfigError, InvalidInput
from inferq.protocol.generation import FinishReason, GenerationParams
from inferq.worker.generate.engine import Generation
from inferq.worker.generate.scheduler import Budget
from inferq.worker.generate.settings import GenerationSettings
from inferq.worker.generate.steploop import StepLoop
from inferq.worker.generate.vllm.capacity import KV_HIGH_WATERMARK, SchedulerState, usable_slots
from inferq.worker.generate.vllm.engine import MultiTokenStep, VllmEngine
from inferq.worker.generate.vllm.options import engine_kwargs, parse_options
from inferq.worker.generate.vllm.sampling import (
    REFUSED,
    check_supported,
    sampling_kwargs,
    unsupported,
)
from inferq.worker.models.lm import CausalLM
from inferq.worker.models.sampling import seed_for
from tests.support.fake_vllm import FakeCore, fake_requests, next_token
from tests.support.step_events import RecordingEvents

#: Long enough that the low-priority sequences still run when the urgent one arrives.
LONG = 400
BUDGET = Budget(max_slots=2, kv_tokens=1 << 16, max_prefill_tokens=4096)

# ------------------------------------------------------------------------------- sampling


def test_every_generation_param_maps_one_to_one_onto_vllm_sampling_params() -> None:
    params = GenerationParams(max_new_tokens=50, temperature=0.7, top_p=0.9, top_k=40,
                              min_p=0.05, seed=11, stop=["\n\n", "END"],
                              stop_token_ids=[7, 9], ignore_eos=True, repetition_penalty=1.2,
                              min_tokens=5)
    kw = sampling_kwargs(params, max_tokens=30, seed=11)
    assert kw == {"n": 1, "max_tokens": 30, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
                  "min_p": 0.05, "seed": 11, "stop": ["\n\n", "END"], "stop_token_ids": [7, 9],
                  "ignore_eos": True, "repetition_penalty": 1.2, "min_tokens": 5,
                  "logprobs": None}
    # Every field of GenerationParams is mapped, or refused by the vLLM engine.
    mapped = {"max_new_tokens"} | set(kw) | set(REFUSED["vllm"])
    assert set(GenerationParams.model_fields) <= mapped


def test_greedy_defaults_map_to_vllm_defaults_and_no_seed() -> None:
    kw = sampling_kwargs(GenerationParams(), max_tokens=128, seed=99)
    assert kw["temperature"] == 0.0 and kw["seed"] is None
    assert kw["stop"] is None and kw["stop_token_ids"] is None
    assert (kw["top_k"], kw["min_p"], kw["repetition_penalty"]) == (0, 0.0, 1.0)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        sampling_kwargs(GenerationParams(), max_tokens=0, seed=None)


@pytest.mark.parametrize(("extra", "named"), [
    ({"logprobs": True}, ["logprobs"]),
    ({"logprobs": True, "top_logprobs": 3}, ["logprobs", "top_logprobs"]),
])
def test_the_vllm_engine_refuses_logprobs_which_the_transformers_engine_returns(
        extra: dict[str, object], named: list[str]) -> None:
    params = GenerationParams(**extra)  # type: ignore[arg-type]
    assert unsupported(params, "vllm") == named
    assert unsupported(params, "transformers") == []
    with pytest.raises(InvalidInput) as err:
        check_supported(params, "vllm")
    for name in named:
        assert f"params.{name}" in str(err.value)
    check_supported(params, "transformers")
    for engine in ("transformers", "vllm"):  # defaults, and the sampling fields both map
        check_supported(GenerationParams(min_p=0.1, repetition_penalty=1.3, min_tokens=2,
                                         stop_token_ids=[3]), engine)


def test_malformed_sampling_params_are_refused_by_the_params_model() -> None:
    from inferq.errors import ValidationError
    from inferq.protocol.generation import parse_generation_params

    with pytest.raises(ValidationError, match="logprobs"):
        parse_generation_params({"logprobs": 2})
    with pytest.raises(ValidationError, match="min_p"):
        parse_generation_params({"min_p": 1.5})
    with pytest.raises(ValidationError, match="stop_token_ids"):
        parse_generation_params({"stop_token_ids": [-1]})


# -------------------------------------------------------------------------------- options


def test_vllm_options_are_read_as_json_or_strings_and_pass_through() -> None:
    options = parse_options(["tensor_parallel_size=2", "enforce_eager=true",
                             "pipeline-parallel-size=1", "quantization=fp8",
                             'compilation_config={"level": 0}'])
    assert options == {"tensor_parallel_size": 2, "enforce_eager": True,
                       "pipeline_parallel_size": 1, "quantization": "fp8",
                       "compilation_config": {"level": 0}}
    kw = engine_kwargs(model="/m", dtype="float32", max_slots=8, options=options,
                       kv_cache_mb=512, device="cuda")
    assert kw["max_num_seqs"] == 8 and kw["scheduling_policy"] == "priority"
    assert kw["tensor_parallel_size"] == 2 and kw["kv_cache_memory_bytes"] == 512 * 2**20
    cpu = engine_kwargs(model="/m", dtype="float32", max_slots=8, options={},
                        kv_cache_mb=512, device="cpu")
    assert "kv_cache_memory_bytes" not in cpu


def test_vllm_prefix_caching_is_on_unless_an_option_turns_it_off() -> None:
    on = engine_kwargs(model="/m", dtype="float32", max_slots=8, options={},
                       kv_cache_mb=None, device="cpu")
    assert on["enable_prefix_caching"] is True
    off = engine_kwargs(model="/m", dtype="float32", max_slots=8,
                        options=parse_options(["enable_prefix_caching=false"]),
                        kv_cache_mb=None, device="cpu")
    assert off["enable_prefix_caching"] is False


@pytest.mark.parametrize(("pair", "message"), [
    ("max_num_seqs=4", "set by inferq (--max-slots)"),
    ("scheduling_policy=fcfs", "set by inferq"),
    ("model=/x", "set by inferq (--model)"),
    ('speculative_config={"method": "ngram"}', "refused: speculative decoding"),
    ("no-equals-sign", "expected KEY=VALUE"),
    ("2bad=1", "expected KEY=VALUE"),
])
def test_vllm_options_that_would_break_a_queue_guarantee_are_refused(
        pair: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_options([pair])
    with pytest.raises(ConfigError, match="given twice"):
        parse_options(["enforce_eager=true", "enforce_eager=false"])


def test_engine_settings_refuse_the_other_engines_settings() -> None:
    with pytest.raises(ConfigError, match="engine must be"):
        GenerationSettings(engine="tgi")
    with pytest.raises(ConfigError, match="engine_process"):
        GenerationSettings(engine="vllm", engine_process=False)
    with pytest.raises(ConfigError, match="swap_mb"):
        GenerationSettings(engine="vllm", swap_mb=10)
    with pytest.raises(ConfigError, match="vllm_options"):
        GenerationSettings(vllm_options={"enforce_eager": True})
    assert GenerationSettings(engine="vllm", vllm_options={"enforce_eager": True}).engine == "vllm"


# ------------------------------------------------------------------------------- capacity


@pytest.mark.parametrize(("state", "held", "slots"), [
    (SchedulerState(running=1, waiting=0, kv_usage=0.1), 1, 4),
    (SchedulerState(running=2, waiting=1, kv_usage=0.5), 3, 3),    # vLLM queues: no more
    (SchedulerState(running=3, waiting=0, kv_usage=KV_HIGH_WATERMARK), 3, 3),
    (SchedulerState(running=0, waiting=0, kv_usage=0.0), 0, 4),
    (SchedulerState(running=5, waiting=2, kv_usage=1.0), 9, 4),    # never above max_slots
])
def test_slots_come_from_vllms_scheduler_state(state: SchedulerState, held: int,
                                               slots: int) -> None:
    assert usable_slots(4, held, state) == slots


# ---------------------------------------------------------------- VllmEngine + StepLoop


def engine_on(lm: CausalLM, core: FakeCore, budget: Budget = BUDGET) -> VllmEngine:
    return VllmEngine(lm, budget, core, fake_requests(), block_size=16)


def gen(engine: VllmEngine, lm: CausalLM, rid: str, *, priority: int = 0, max_new: int = 12,
        order: int = 0, **params: object) -> Generation:
    ids = lm.tokenizer(f"request {rid} asks")["input_ids"]
    return engine.new_generation(rid, ids, GenerationParams(
        max_new_tokens=max_new, ignore_eos=True, **params),  # type: ignore[arg-type]
        priority=priority, order=order)


def run(loop: StepLoop, events: RecordingEvents, until: list[Generation]) -> None:
    while not all(g.finish is not None for g in until):
        if not loop.take_outputs(arm=True):
            assert events.changed.wait(30), "no progress"
            events.changed.clear()


def expected_tokens(prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(next_token(prompt + out))
    return out


def test_the_trace_context_reaches_vllm_only_when_vllm_traces(lm: CausalLM) -> None:
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    for traces in (True, False):
        core = FakeCore()
        engine = VllmEngine(lm, BUDGET, core, fake_requests(), block_size=16, traces=traces)
        ids = lm.tokenizer("request t asks")["input_ids"]
        traced = engine.new_generation("t", ids, GenerationParams(max_new_tokens=2),
                                       trace_headers=headers)
        plain = engine.new_generation("p", ids, GenerationParams(max_new_tokens=2))
        engine.step([traced, plain])
        assert [r.trace_headers for r in core.added] == [headers if traces else None, None]


def test_a_generation_streams_vllms_tokens_with_its_priority_reversed(lm: CausalLM) -> None:
    core = FakeCore()
    engine = engine_on(lm, core)
    g = gen(engine, lm, "a", priority=7, max_new=5, temperature=0.8, seed=3)
    advanced = engine.step([g])
    assert advanced == [g] and g.first_token_at is not None
    (request,) = core.added
    assert request.priority == -7  # vLLM serves the lowest value first
    assert request.prompt == g.prompt_ids and request.params["max_tokens"] == 5
    assert request.params["seed"] == seed_for("a", g.params) == 3
    while g.finish is None:
        engine.step()
    assert g.tokens == expected_tokens(g.prompt_ids, 5) and g.finish is FinishReason.LENGTH
    assert g.detok.text == lm.decode(g.tokens)
    assert not engine.running and engine.in_core == 0 and core.aborted == []


def test_a_higher_priority_preempts_the_lowest_which_resumes_from_its_streamed_tokens(
        lm: CausalLM) -> None:
    core = FakeCore(max_num_seqs=2, gated=True)
    engine = engine_on(lm, core)
    events = RecordingEvents()
    loop = StepLoop(engine, events, swap_bytes=0)
    low = [gen(engine, lm, f"low{i}", priority=-5, max_new=LONG, order=i) for i in range(2)]
    loop.start()
    try:
        loop.submit(low)
        core.allow(4)  # then the loop waits inside its fifth step
        while min(len(g.tokens) for g in low) < 4:
            loop.take_outputs(arm=True) or events.changed.wait(10)
            events.changed.clear()
        assert loop.capacity() == 0  # both slots taken
        assert all(g.finish is None for g in low)
        high = gen(engine, lm, "high", priority=5, max_new=6, order=9)
        loop.submit([high])
        core.allow(100_000)
        run(loop, events, [high])
        run(loop, events, low)
    finally:
        loop.stop()
        loop.join(10)
    victim = low[1]  # equal priorities: the latest admitted
    assert core.aborted == [victim.id] and victim.preemptions == 1 and low[0].preemptions == 0
    resumed = [r for r in core.added if r.id == victim.id]
    assert len(resumed) == 2
    # Resumed as a token prompt of prompt + the tokens streamed so far, max_tokens reduced.
    streamed = len(resumed[1].prompt) - len(victim.prompt_ids)
    assert streamed == 5 and resumed[1].prompt == victim.prompt_ids + victim.tokens[:streamed]
    assert resumed[1].params["max_tokens"] == LONG - streamed
    # High ran while the victim waited: never three in vLLM's batch.
    assert all(len(b) <= 2 for b in core.batches)
    assert high.finish is FinishReason.LENGTH
    for g in low:  # as if never preempted
        assert g.tokens == expected_tokens(g.prompt_ids, LONG), g.id


def test_a_cancelled_generation_is_aborted_at_the_next_step_and_reported(
        lm: CausalLM) -> None:
    core = FakeCore(gated=True)
    engine = engine_on(lm, core)
    events = RecordingEvents()
    loop = StepLoop(engine, events)
    a, b = gen(engine, lm, "a", max_new=200), gen(engine, lm, "b", max_new=8, order=1)
    loop.start()
    try:
        loop.submit([a, b])
        core.allow(2)  # two steps, then the loop waits inside the third
        while len(a.tokens) < 2:
            loop.take_outputs(arm=True) or events.changed.wait(10)
            events.changed.clear()
        loop.cancel(["a"])
        core.allow(1000)
        run(loop, events, [a, b])
    finally:
        loop.stop()
        loop.join(10)
    assert a.finish is FinishReason.CANCELLED and core.aborted == ["a"]
    assert len(a.tokens) <= 3  # the step in flight when the cancellation came, at most
    assert [g.id for batch in events.left_batches for g in batch] == ["a"]
    assert max(loop.cancel_lags) <= 1
    assert b.finish is FinishReason.LENGTH and len(b.tokens) == 8
    assert "a" not in core.requests and engine.in_core == 0


def test_a_reclaimed_generation_resumes_from_its_stream_as_a_token_prompt(
        lm: CausalLM) -> None:
    core = FakeCore()
    engine = engine_on(lm, core)
    prompt = lm.tokenizer("request r asks")["input_ids"]
    reference = expected_tokens(prompt, 10)
    g = engine.new_generation("r", prompt, GenerationParams(max_new_tokens=10, ignore_eos=True),
                              alone=True, streamed=reference[:6],
                              shown=lm.decode(reference[:6]))
    while g.finish is None:
        engine.step([] if g.in_batch else [g])
    (request,) = core.added
    assert request.prompt == prompt + reference[:6] and request.params["max_tokens"] == 4
    assert g.tokens == reference


def test_reclaimed_requests_run_alone_and_claim_nothing_meanwhile(lm: CausalLM) -> None:
    core = FakeCore(max_num_seqs=4)
    engine = engine_on(lm, core, Budget(max_slots=4, kv_tokens=1 << 16, max_prefill_tokens=4096))
    events = RecordingEvents()
    loop = StepLoop(engine, events)
    suspect = gen(engine, lm, "suspect", max_new=6)
    suspect.alone = True
    others = [gen(engine, lm, f"o{i}", max_new=6, order=i + 1) for i in range(2)]
    loop.start()
    try:
        loop.submit([suspect, *others])
        assert loop.capacity() == 0
        run(loop, events, [suspect, *others])
    finally:
        loop.stop()
        loop.join(10)
    alone_steps = [b for b in core.batches if "suspect" in b]
    assert alone_steps and all(b == ["suspect"] for b in alone_steps)


def test_stop_token_ids_and_vllms_own_stop_end_the_generation(lm: CausalLM) -> None:
    core = FakeCore()
    engine = engine_on(lm, core)
    g = gen(engine, lm, "s", max_new=20, stop_token_ids=[77])
    engine.step([g])
    core.requests["s"].params["force"] = [77]
    while g.finish is None:
        engine.step()
    assert g.finish is FinishReason.STOP and g.tokens[-1] == 77 and len(g.tokens) == 2
    assert "s" not in core.requests and core.aborted == []


def test_claims_stop_when_vllm_queues_or_its_kv_cache_fills(lm: CausalLM) -> None:
    core = FakeCore(max_num_seqs=4)
    engine = engine_on(lm, core, Budget(max_slots=4, kv_tokens=1 << 16, max_prefill_tokens=64))
    events = RecordingEvents()
    loop = StepLoop(engine, events)
    assert loop.capacity() == 4
    g = gen(engine, lm, "x", max_new=500)
    loop.start()
    try:
        loop.submit([g])
        while not g.tokens:
            loop.take_outputs(arm=True) or events.changed.wait(10)
            events.changed.clear()
        assert loop.capacity() == 3
        engine.stats.record(SchedulerState(running=1, waiting=0, kv_usage=0.95), 0)
        assert loop.capacity() == 0
        engine.stats.record(SchedulerState(running=0, waiting=1, kv_usage=0.2), 2)
        assert loop.capacity() == 0 and engine.stats.preemptions == 2
        engine.stats.record(SchedulerState(running=1, waiting=0, kv_usage=0.2), 0)
        assert loop.capacity() == 3
        loop.cancel(["x"])
        run(loop, events, [g])
    finally:
        loop.stop()
        loop.join(10)


def test_several_tokens_in_one_step_fail_the_step_instead_of_losing_tokens(
        lm: CausalLM) -> None:
    core = FakeCore()
    engine = engine_on(lm, core)
    g = gen(engine, lm, "spec", max_new=10)
    engine.step([g])
    core.requests["spec"].params["burst"] = True
    with pytest.raises(MultiTokenStep, match="2 tokens in one step"):
        engine.step()
    assert len(g.tokens) == 1  # nothing half-applied
    assert engine.clear() == [g] and core.aborted == ["spec"] and engine.in_core == 0
