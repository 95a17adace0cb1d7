"""Choosing the next token of each running sequence from its logits, with its own parameters.

In transformers' order (``GenerationMixin._get_logits_processor``): the processors first
(repetition penalty over the prompt and the tokens so far, then ``min_tokens``, which masks the
end-of-sequence and ``stop_token_ids`` tokens), then greedy rows take the argmax
(deterministic: the same logits give the same token) and sampling rows apply temperature,
top-k, top-p (nucleus) and min-p, and draw with the sequence's own ``torch.Generator``, seeded
from the request's ``seed`` (or from its id), so a draw does not depend on which other
requests share the batch. Each step equals transformers' logits processors (tested).

Log-probabilities (``logprobs``) are those of the model's raw distribution, before any
processing, as vLLM returns by default.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from typing import Protocol

import torch

from inferq.protocol.generation import GenerationParams


def seed_for(request_id: str, params: GenerationParams) -> int:
    """The request's seed, or one derived from its id (stable across attempts and workers)."""
    if params.seed is not None:
        return params.seed
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def make_generator(seed: int) -> torch.Generator:
    # Draws happen on the CPU: a CPU generator behaves the same on every device.
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return generator


class Row(Protocol):
    """What choosing a sequence's next token reads of it (``engine.Generation``)."""

    params: GenerationParams
    generator: torch.Generator | None
    prompt_ids: list[int]
    tokens: list[int]


#: One generated token's log-probability and the most likely alternatives at its position:
#: ``(token, logprob, [(token, logprob), ...])``.
TokenLogprob = tuple[int, float, list[tuple[int, float]]]


def process_logits(logits: torch.Tensor, row: Row, eos_ids: Collection[int]) -> torch.Tensor:
    """Repetition penalty and ``min_tokens`` applied to one row of float32 logits."""
    params, scores = row.params, logits
    if params.repetition_penalty != 1.0:
        seen = torch.as_tensor(row.prompt_ids + row.tokens, dtype=torch.long,
                               device=scores.device)
        score = scores.gather(0, seen)
        score = torch.where(score < 0, score * params.repetition_penalty,
                            score / params.repetition_penalty)
        scores = scores.scatter(0, seen, score)
    if len(row.tokens) < params.min_tokens:
        banned = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_ids))
        vocab = scores.shape[-1]
        index = [t for t in banned if t < vocab]
        if index:
            scores = scores.index_fill(0, torch.as_tensor(index, device=scores.device),
                                       float("-inf"))
    return scores


def filter_logits(logits: torch.Tensor, params: GenerationParams) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p applied to one row of float32 logits."""
    scores = logits / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (keeps >= 1 token).
        drop = (cumulative - torch.softmax(ordered, dim=-1)) >= params.top_p
        scores = scores.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
    if params.min_p > 0.0:
        probs = torch.softmax(scores, dim=-1)
        drop = probs < params.min_p * probs.max()
        drop[torch.argmax(scores)] = False  # keeps >= 1 token
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def choose(logits: torch.Tensor, rows: Sequence[Row],
           eos_ids: Collection[int] = ()) -> list[int]:
    """Next token per row of ``logits`` ``[n, vocab]``: one batched argmax for the plain
    greedy rows, the rest row by row."""
    chosen = torch.argmax(logits, dim=-1).tolist()
    own = [i for i, r in enumerate(rows) if not r.params.greedy or r.params.processed]
    if own:
        scores = logits[own].float().cpu()
        for j, i in enumerate(own):
            row = rows[i]
            processed = process_logits(scores[j], row, eos_ids)
            if row.params.greedy:
                chosen[i] = int(torch.argmax(processed).item())
                continue
            assert row.generator is not None
            probs = torch.softmax(filter_logits(processed, row.params), dim=-1)
            chosen[i] = int(torch.multinomial(probs, 1, generator=row.generator).item())
    return [int(t) for t in chosen]


def logprobs_of(logits: torch.Tensor, rows: Sequence[Row],
                chosen: Sequence[int]) -> list[TokenLogprob | None]:
    """Per row: the chosen token's log-probability and the ``top_logprobs`` most likely
    tokens' (raw model distribution), for rows that asked for ``logprobs``; else None."""
    out: list[TokenLogprob | None] = [None] * len(rows)
    wanted = [i for i, r in enumerate(rows) if r.params.logprobs]
    if not wanted:
        return out
    logp = torch.log_softmax(logits[wanted].float(), dim=-1).cpu()
    for j, i in enumerate(wanted):
        k = rows[i].params.top_logprobs
        top: list[tuple[int, float]] = []
        if k:
            values, ids = torch.topk(logp[j], k)
            top = [(int(t), float(v)) for t, v in zip(ids.tolist(), values.tolist(),
                                                      strict=True)]
        out[i] = (int(chosen[i]), float(logp[j, chosen[i]]), top)
    return out
