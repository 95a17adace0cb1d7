"""Choosing the next token of each running sequence from its logits, with its own parameters.

Greedy rows take the argmax (deterministic: the same logits give the same token). Sampling
rows apply temperature, then top-k, then top-p (nucleus), and draw with the sequence's own
``torch.Generator``, seeded from the request's ``seed`` (or from its id), so a draw does not
depend on which other requests share the batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

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


def filter_logits(logits: torch.Tensor, params: GenerationParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to one row of float32 logits."""
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
    return scores


def choose(logits: torch.Tensor, params: Sequence[GenerationParams],
           generators: Sequence[torch.Generator | None]) -> list[int]:
    """Next token per row of ``logits`` ``[n, vocab]``."""
    chosen = torch.argmax(logits, dim=-1).tolist()
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        rows = logits[sampled].float().cpu()
        for j, i in enumerate(sampled):
            generator = generators[i]
            assert generator is not None
            probs = torch.softmax(filter_logits(rows[j], params[i]), dim=-1)
            chosen[i] = int(torch.multinomial(probs, 1, generator=generator).item())
    return [int(t) for t in chosen]
