"""Causal-LM tasks that run as whole batches in the window worker (``window/worker.py``):

* ``ScoringModel`` (task ``score``): per-token log-probabilities of a given text, one batched
  forward (right-padded, no cache) per window, for ranking and evaluation;
* ``RequestLevelGenerator`` (task ``generate`` with ``--batching request``): request-level
  batching, the baseline continuous batching is measured against. A window of requests runs
  as one left-padded ``model.generate`` until its longest member is done; nothing joins or
  leaves in between, and no text streams (it arrives with the result).
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from inferq.errors import InferqError, InvalidInput, ValidationError
from inferq.protocol.codec import RequestPayload
from inferq.protocol.generation import (
    GenerationParams,
    check_task_params,
    parse_generation_params,
)
from inferq.worker.models.base import BatchModel, ModelInput
from inferq.worker.models.detok import Detokenizer
from inferq.worker.models.lm import CausalLM
from inferq.worker.models.sampling import seed_for


class _CausalLMTask(BatchModel):
    """A causal-LM task run as whole batches: every payload is encoded, its params checked
    (``_params`` raises ``ValidationError``) and its length checked against the context."""

    #: What the text is called in errors; positions it must leave free in the context.
    noun = "text"
    spare = 0

    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm
        self.model_id = lm.model_id
        self.device = lm.device
        self._lock = threading.Lock()

    def prepare(self, payloads: Sequence[RequestPayload]) -> list[ModelInput | InferqError]:
        out: list[ModelInput | InferqError] = []
        encoded = self.lm.encode(payloads) if payloads else []
        for payload, ids in zip(payloads, encoded, strict=True):
            try:
                params = self._params(payload)
            except ValidationError as exc:
                out.append(InvalidInput(exc.message))
                continue
            if isinstance(ids, InferqError):
                out.append(ids)
            elif len(ids) + self.spare > self.lm.max_positions:
                out.append(InvalidInput(f"the {self.noun} has {len(ids)} tokens; the model's "
                                        f"context is {self.lm.max_positions}"))
            else:
                out.append(ModelInput(len(ids), self._data(payload, ids, params)))
        return out

    @abstractmethod
    def _params(self, payload: RequestPayload) -> Any: ...

    @abstractmethod
    def _data(self, payload: RequestPayload, ids: list[int], params: Any) -> Any: ...


class ScoringModel(_CausalLMTask):
    """Output per request: ``token_ids``, ``tokens`` (each decoded alone), ``logprobs``
    (``None`` for the first token, which has no context), ``sum_logprob`` and
    ``mean_logprob`` over the scored tokens."""

    tasks = frozenset({"score"})

    def _params(self, payload: RequestPayload) -> None:
        check_task_params("score", payload.params, payload.messages is not None)

    def _data(self, payload: RequestPayload, ids: list[int], params: Any) -> list[int]:
        return ids

    @torch.inference_mode()
    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        if not batch:
            return []
        width = max(item.tokens for item in batch)
        ids = torch.full((len(batch), width), self.lm.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, item in enumerate(batch):
            ids[row, : item.tokens] = torch.as_tensor(item.data, dtype=torch.long)
            mask[row, : item.tokens] = 1
        device = self.lm.torch_device
        with self._lock:
            logits = self.lm.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                                   use_cache=False).logits
        outputs = []
        for row, item in enumerate(batch):
            n = item.tokens
            targets = torch.as_tensor(item.data[1:], dtype=torch.long, device=logits.device)
            logprobs = torch.log_softmax(logits[row, : n - 1].float(), dim=-1)
            picked = logprobs.gather(1, targets[:, None])[:, 0].tolist() if n > 1 else []
            scored = [float(x) for x in picked]
            outputs.append({
                "token_ids": list(item.data),
                "tokens": [self.lm.decode([t]) for t in item.data],
                "logprobs": [None, *scored],
                "sum_logprob": sum(scored),
                "mean_logprob": sum(scored) / len(scored) if scored else None,
            })
        return outputs


@dataclass(frozen=True, slots=True)
class _Request:
    id: str
    ids: list[int]
    params: GenerationParams


class RequestLevelGenerator(_CausalLMTask):
    """Padded ``generate`` over a whole window (the request-level batching baseline).

    Greedy requests of a window share one ``generate`` call that runs until the longest
    ``max_new_tokens`` (finished rows keep computing: that is request-level batching's
    waste); sampled requests run one by one with their own parameters and seed. Output:
    ``text``, ``token_ids``, ``finish_reason`` and ``completion_tokens``."""

    tasks = frozenset({"generate"})
    noun = "prompt"
    spare = 1  # room for at least one new token

    def _params(self, payload: RequestPayload) -> GenerationParams:
        params = parse_generation_params(payload.params)
        if params.extended:
            # Refused, never ignored: the continuous engine implements them.
            raise ValidationError("params: repetition_penalty, min_p, min_tokens, "
                                  "stop_token_ids and logprobs need the continuous-batching "
                                  "worker (this one runs --batching request)")
        return params

    def _data(self, payload: RequestPayload, ids: list[int], params: Any) -> _Request:
        return _Request(payload.id, ids, params)

    @torch.inference_mode()
    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        requests: list[_Request] = [item.data for item in batch]
        outputs: list[Any] = [None] * len(requests)
        with self._lock:
            for ignore_eos in (False, True):
                greedy = [i for i, r in enumerate(requests)
                          if r.params.greedy and r.params.ignore_eos == ignore_eos]
                if greedy:
                    rows = self._generate([requests[i] for i in greedy], None)
                    for i, row in zip(greedy, rows, strict=True):
                        outputs[i] = row
            for i, r in enumerate(requests):
                if not r.params.greedy:
                    outputs[i] = self._generate([r], r.params)[0]
        return [self._finish(r, tokens) for r, tokens in zip(requests, outputs, strict=True)]

    def _generate(self, requests: list[_Request],
                  sampling: GenerationParams | None) -> list[list[int]]:
        width = max(len(r.ids) for r in requests)
        ids = torch.full((len(requests), width), self.lm.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, r in enumerate(requests):
            ids[row, width - len(r.ids):] = torch.as_tensor(r.ids, dtype=torch.long)
            mask[row, width - len(r.ids):] = 1
        max_new = max(min(r.params.max_new_tokens, self.lm.max_positions - len(r.ids))
                      for r in requests)
        # ignore_eos: keep going after an end-of-sequence token (it stays in the output), as
        # the continuous worker does.
        eos = None if requests[0].params.ignore_eos else (sorted(self.lm.eos_ids) or None)
        kwargs: dict[str, Any] = {"do_sample": False}
        if sampling is not None:
            torch.manual_seed(seed_for(requests[0].id, sampling))
            kwargs = {"do_sample": True, "temperature": sampling.temperature,
                      "top_p": sampling.top_p, "top_k": sampling.top_k or None}
        device = self.lm.torch_device
        out = self.lm.model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new,
            pad_token_id=self.lm.pad_id, eos_token_id=eos, **kwargs)
        return [row[width:].tolist() for row in out.cpu()]

    def _finish(self, r: _Request, generated: list[int]) -> dict[str, Any]:
        max_new = min(r.params.max_new_tokens, self.lm.max_positions - len(r.ids))
        detok = Detokenizer(self.lm.decode, r.ids, r.params.stop, backend=self.lm.backend)
        tokens: list[int] = []
        reason = "length"
        for token in generated[:max_new]:
            tokens.append(token)
            if token in self.lm.eos_ids and not r.params.ignore_eos:
                reason = "stop"
                break
            detok.add(token)
            if detok.stopped:
                reason = "stop"
                break
        detok.flush()
        return {"text": detok.text, "token_ids": tokens, "finish_reason": reason,
                "completion_tokens": len(tokens)}
