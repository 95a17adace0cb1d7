"""The tiny random Llama as the generation tests use it: its queue name, the reference output
(transformers' own ``generate`` on one request alone), and a generate worker's config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferq.connection import ConnectionSettings
from inferq.worker.core.config import WorkerConfig

if TYPE_CHECKING:  # torch and transformers load slowly: only the tests that use them pay
    from inferq.worker.models.lm import CausalLM

MODEL = "tiny"
WORDS = ["the", "queue", "worker", "asks", "what", "is", "the", "capital", "of", "France",
         "and", "a", "token", "stream"]


def greedy_reference(lm: CausalLM, prompt_ids: list[int], max_new: int, *,
                     ignore_eos: bool = False) -> list[int]:
    """The request alone through transformers' own ``generate`` (greedy)."""
    import torch

    # ignore_eos: generation goes on past an end-of-sequence token, which stays in the output.
    kwargs: dict[str, Any] = {"eos_token_id": None} if ignore_eos else {}
    with torch.inference_mode():
        out = lm.model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new,
                                do_sample=False, pad_token_id=lm.pad_id,
                                attention_mask=torch.ones((1, len(prompt_ids)),
                                                          dtype=torch.long), **kwargs)
    tokens: list[int] = out[0, len(prompt_ids):].tolist()
    return tokens


def gen_config(url: str, **kw: Any) -> WorkerConfig:
    base: dict[str, Any] = dict(connection=ConnectionSettings(url), model_name=MODEL,
                                model_spec="tiny",
                                task="generate", lease_ms=5_000, worker_id="gen-worker")
    base.update(kw)
    return WorkerConfig(**base)
