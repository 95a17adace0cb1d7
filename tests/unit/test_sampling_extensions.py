"""vLLM's sampling extensions in the engine, each equal to its reference: transformers' logits
processors step by step, and transformers' ``generate`` over whole generations (repetition
penalty, ``min_tokens``, ``stop_token_ids``, log-probabilities)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from inferq.errors import ValidationError
from inferq.protocol.generation import FinishReason, GenerationParams, parse_generation_params
from inferq.worker.generate.engine import Engine
from inferq.worker.generate.scheduler import Budget
from inferq.worker.models.lm import CausalLM
from inferq.worker.models.sampling import choose, filter_logits, logprobs_of, process_logits
from tests.support.generation import WORDS
from tests.unit.test_generate_engine import drive

VOCAB = 50
EOS = (3,)


@dataclass
class FakeRow:
    params: GenerationParams
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


def reference(logits: torch.Tensor, row: FakeRow) -> torch.Tensor:
    """transformers' processors, in ``GenerationMixin._get_logits_processor``'s order."""
    p = row.params
    ids = torch.tensor([row.prompt_ids + row.tokens])
    procs: list[Any] = []
    if p.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    if p.min_tokens:
        procs.append(MinNewTokensLengthLogitsProcessor(
            len(row.prompt_ids), p.min_tokens, [*EOS, *p.stop_token_ids]))
    if not p.greedy:
        procs.append(TemperatureLogitsWarper(p.temperature))
        if p.top_k:
            procs.append(TopKLogitsWarper(p.top_k))
        if p.top_p < 1.0:
            procs.append(TopPLogitsWarper(p.top_p))
        if p.min_p:
            procs.append(MinPLogitsWarper(p.min_p))
    out: torch.Tensor = LogitsProcessorList(procs)(ids, logits[None].clone())[0]
    return out


def ours(logits: torch.Tensor, row: FakeRow) -> torch.Tensor:
    scores = process_logits(logits, row, EOS)
    return scores if row.params.greedy else filter_logits(scores, row.params)


CASES = [
    dict(repetition_penalty=1.3),
    dict(repetition_penalty=0.7),
    dict(min_tokens=4),
    dict(min_tokens=4, stop_token_ids=[7, 9]),
    dict(temperature=0.8, min_p=0.05),
    dict(temperature=1.0, min_p=0.3),
    dict(temperature=0.7, top_k=10, top_p=0.9, min_p=0.1, repetition_penalty=1.2),
    dict(temperature=1.3, top_p=0.8, repetition_penalty=1.5, min_tokens=2),
]


@pytest.mark.parametrize("kw", CASES)
def test_each_step_equals_transformers_processors(kw: dict[str, Any]) -> None:
    rng = random.Random(0)
    torch.manual_seed(0)
    for _ in range(20):
        row = FakeRow(GenerationParams(**kw), [rng.randrange(VOCAB) for _ in range(8)],
                      [rng.randrange(VOCAB) for _ in range(rng.randrange(6))])
        logits = torch.randn(VOCAB) * 3
        expected, got = reference(logits, row), ours(logits, row)
        assert torch.equal(torch.isinf(expected), torch.isinf(got)), kw
        finite = ~torch.isinf(expected)
        torch.testing.assert_close(got[finite], expected[finite])


def test_min_tokens_keeps_eos_with_ignore_eos_but_masks_stop_token_ids() -> None:
    row = FakeRow(GenerationParams(min_tokens=3, ignore_eos=True, stop_token_ids=[5]), [1, 2])
    scores = process_logits(torch.zeros(VOCAB), row, EOS)
    assert scores[5] == float("-inf") and scores[EOS[0]] == 0.0
    row.tokens = [8, 8, 8]  # reached: nothing masked any more
    assert torch.isfinite(process_logits(torch.zeros(VOCAB), row, EOS)).all()


def test_greedy_rows_with_a_penalty_are_chosen_from_their_processed_logits() -> None:
    logits = torch.zeros(2, VOCAB)
    logits[:, 4] = 2.0
    logits[:, 6] = 1.9
    plain = FakeRow(GenerationParams(), [4])
    penalised = FakeRow(GenerationParams(repetition_penalty=2.0), [4])
    assert choose(logits, [plain, penalised], EOS) == [4, 6]


def test_logprobs_are_the_raw_distribution_with_top_alternatives() -> None:
    logits = torch.randn(2, VOCAB)
    rows = [FakeRow(GenerationParams(logprobs=True, top_logprobs=3,
                                     repetition_penalty=1.5), [1]),
            FakeRow(GenerationParams(), [1])]
    chosen = [11, 12]
    first, second = logprobs_of(logits, rows, chosen)
    expected = torch.log_softmax(logits[0], dim=-1)
    assert second is None and first is not None
    token, logprob, top = first
    assert token == 11 and logprob == pytest.approx(float(expected[11]))
    values, ids = torch.topk(expected, 3)
    assert [t for t, _ in top] == ids.tolist()
    assert [lp for _, lp in top] == pytest.approx(values.tolist())


@pytest.mark.parametrize(("params", "field"), [
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": list(range(65))}, "stop_token_ids"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": "yes"}, "logprobs"),
])
def test_bad_values_are_refused_naming_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        parse_generation_params(params)


# --- whole generations against transformers' generate -------------------------------------


def prompts(lm: CausalLM, n: int) -> list[list[int]]:
    rng = random.Random(3)
    return [lm.tokenizer(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 20))))
            ["input_ids"] for _ in range(n)]


def generate(lm: CausalLM, prompt: list[int], max_new: int, **kw: Any) -> Any:
    with torch.inference_mode():
        return lm.model.generate(torch.tensor([prompt]), max_new_tokens=max_new,
                                 do_sample=False, pad_token_id=lm.pad_id,
                                 attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                                 **kw)


def run(lm: CausalLM, prompts: list[list[int]], params: GenerationParams) -> list[Any]:
    engine = Engine(lm, Budget(max_slots=4, kv_tokens=1 << 20, max_prefill_tokens=64))
    gens = [engine.new_generation(f"r{i}", ids, params) for i, ids in enumerate(prompts)]
    drive(engine, [(i, g) for i, g in enumerate(gens)])  # staggered: batches of mixed ages
    return gens


@pytest.mark.parametrize("penalty", [1.4, 0.8])
def test_repetition_penalty_equals_generate(lm: CausalLM, penalty: float) -> None:
    batch = prompts(lm, 6)
    gens = run(lm, batch, GenerationParams(max_new_tokens=24, repetition_penalty=penalty,
                                           ignore_eos=True))
    for g, ids in zip(gens, batch, strict=True):
        out = generate(lm, ids, 24, repetition_penalty=penalty, eos_token_id=None)
        assert g.tokens == out[0, len(ids):].tolist()
    plain = run(lm, batch, GenerationParams(max_new_tokens=24, ignore_eos=True))
    assert [g.tokens for g in plain] != [g.tokens for g in gens]  # the penalty did something


def test_stop_token_ids_and_min_tokens_equal_generate(lm: CausalLM) -> None:
    batch = prompts(lm, 5)
    free = run(lm, batch, GenerationParams(max_new_tokens=16, ignore_eos=True))
    for g, ids in zip(free, batch, strict=True):
        stop = g.tokens[2]  # a token greedy decoding makes at its third step
        (cut,) = run(lm, [ids], GenerationParams(max_new_tokens=16, ignore_eos=True,
                                                 stop_token_ids=[stop]))
        first = g.tokens.index(stop)
        assert cut.tokens == g.tokens[:first + 1] and cut.finish is FinishReason.STOP
        assert cut.detok.text == lm.decode(g.tokens[:first])  # the stop token is not text
        # min_tokens: the stop token cannot come before 6 tokens, as transformers' processor.
        (late,) = run(lm, [ids], GenerationParams(max_new_tokens=16, ignore_eos=True,
                                                  stop_token_ids=[stop], min_tokens=6))
        ref = generate(lm, ids, 16, eos_token_id=[stop], min_new_tokens=6)[0, len(ids):]
        expected = ref.tolist()
        if stop in expected:
            expected = expected[:expected.index(stop) + 1]
        assert late.tokens == expected and len(late.tokens) >= 6


def test_logprobs_equal_generates_logits(lm: CausalLM) -> None:
    batch = prompts(lm, 4)
    gens = run(lm, batch, GenerationParams(max_new_tokens=10, ignore_eos=True, logprobs=True,
                                           top_logprobs=2))
    for g, ids in zip(gens, batch, strict=True):
        out = generate(lm, ids, 10, eos_token_id=None, output_logits=True,
                       return_dict_in_generate=True)
        assert g.tokens == out.sequences[0, len(ids):].tolist()
        assert g.logprob_output is not None and len(g.logprob_output) == len(g.tokens)
        for token, entry, logits in zip(g.tokens, g.logprob_output, out.logits, strict=True):
            ref = torch.log_softmax(logits[0].float(), dim=-1)
            assert entry["id"] == token and entry["token"] == lm.decode([token])
            assert entry["logprob"] == pytest.approx(float(ref[token]), abs=1e-4)
            assert [t["id"] for t in entry["top"]] == torch.topk(ref, 2).indices.tolist()


def test_a_resumed_generation_has_null_logprobs_for_the_streamed_tokens(lm: CausalLM) -> None:
    (ids,) = prompts(lm, 1)
    params = GenerationParams(max_new_tokens=8, ignore_eos=True, logprobs=True)
    (whole,) = run(lm, [ids], params)
    engine = Engine(lm, Budget(max_slots=4, kv_tokens=1 << 20, max_prefill_tokens=64))
    g = engine.new_generation("r0", ids, params, streamed=whole.tokens[:3],
                              shown=lm.decode(whole.tokens[:3]))
    drive(engine, [(0, g)])
    assert g.tokens == whole.tokens and g.logprob_output is not None
    assert [e["logprob"] for e in g.logprob_output[:3]] == [None] * 3
    assert [e["logprob"] for e in g.logprob_output[3:]] == pytest.approx(
        [e["logprob"] for e in (whole.logprob_output or [])[3:]], abs=1e-4)
