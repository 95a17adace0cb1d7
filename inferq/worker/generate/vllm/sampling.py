"""inferq's ``GenerationParams`` as vLLM's ``SamplingParams``, one to one, and what each engine
refuses.

Pure code: ``sampling_kwargs`` returns the keyword arguments of ``vllm.SamplingParams`` (the
engine builds it), so the mapping is tested where vLLM is not installed. Every field of
``GenerationParams`` has its vLLM counterpart; a request whose parameters an engine cannot
honour fails alone with ``InvalidInput`` naming them, never silently sampled otherwise.
"""

from __future__ import annotations

from typing import Any

from inferq.errors import InvalidInput
from inferq.protocol.generation import GenerationParams

TRANSFORMERS = "transformers"
VLLM = "vllm"
ENGINES = (TRANSFORMERS, VLLM)

#: Per engine, the fields it cannot honour, with the value that means "off". The transformers
#: engine implements every field; the vLLM engine does not carry log-probabilities back (its
#: steps hand over token ids only).
REFUSED: dict[str, dict[str, Any]] = {TRANSFORMERS: {},
                                      VLLM: {"logprobs": False, "top_logprobs": 0}}


def unsupported(params: GenerationParams, engine: str) -> list[str]:
    """The fields of ``params`` that ``engine`` cannot honour (set to other than their
    default)."""
    return [name for name, off in REFUSED[engine].items() if getattr(params, name) != off]


def check_supported(params: GenerationParams, engine: str) -> None:
    """``InvalidInput`` naming every field of ``params`` that ``engine`` would ignore."""
    refused = unsupported(params, engine)
    if refused:
        raise InvalidInput(
            f"params.{', params.'.join(refused)}: not supported by this worker's "
            f"{engine} engine")


def sampling_kwargs(params: GenerationParams, *, max_tokens: int, seed: int | None
                    ) -> dict[str, Any]:
    """``SamplingParams(**sampling_kwargs(...))`` samples as ``params`` asks.

    ``max_tokens``: what is left of ``max_new_tokens`` (less after a resumption, which
    prefills the tokens already streamed). ``seed``: the seed the transformers engine would
    use (``sampling.seed_for``: the request's, or one derived from its id), None for greedy.
    Text is detokenized by inferq (its stream holds back a possible stop string), so vLLM
    need not; stop strings still end the request in vLLM at the same token."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    return {
        "n": 1,
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,  # 0 disables it in both
        "min_p": params.min_p,
        "seed": None if params.greedy else seed,
        "stop": list(params.stop) or None,
        "stop_token_ids": list(params.stop_token_ids) or None,
        "ignore_eos": params.ignore_eos,
        "repetition_penalty": params.repetition_penalty,
        "min_tokens": params.min_tokens,
        "logprobs": None,
    }
