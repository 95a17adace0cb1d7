"""A stand-in for vLLM's ``LLMEngine`` with its interface (``add_request``, ``abort_request``,
``step``) and its observable behaviour, for tests of ``VllmEngine`` where vLLM is absent.

Like vLLM: it serves the lowest ``priority`` value first, runs at most ``max_num_seqs``
requests, emits one token per running request and step (``RequestOutputKind.DELTA``), ends a
request at ``max_tokens`` ("length") or at one of its ``stop_token_ids`` ("stop"), and reports
nothing for an aborted request. Its next token is a function of the whole token history
(prompt + output), as greedy decoding is: a request resumed from its tokens goes on exactly as
one never interrupted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from inferq.worker.generate.vllm.engine import Requests

#: Tokens the fake emits stay in this range (clear of the tiny tokenizer's special ids).
LOW, SPAN = 40, 400


def next_token(history: list[int]) -> int:
    return LOW + (sum(history) * 31 + len(history) * 7) % SPAN


@dataclass
class FakeRequest:
    id: str
    prompt: list[int]
    params: dict[str, Any]
    priority: int
    arrival: int
    output: list[int] = field(default_factory=list)
    #: What vLLM's tracing would continue (given only when the engine traces).
    trace_headers: Any = None


class FakeCore:
    def __init__(self, max_num_seqs: int = 4, *, gated: bool = False) -> None:
        self.max_num_seqs = max_num_seqs
        #: With ``gated``, each step takes a permit (``allow``): a test paces the engine.
        self.gate = threading.Semaphore(0) if gated else None
        self.requests: dict[str, FakeRequest] = {}
        self.added: list[FakeRequest] = []
        self.aborted: list[str] = []
        self.steps = 0
        #: Ids in each step's batch.
        self.batches: list[list[str]] = []

    def add_request(self, request_id: str, prompt: Any, params: Any, *,
                    trace_headers: Any = None, priority: int = 0) -> str:
        assert request_id not in self.requests, f"{request_id} added twice"
        request = FakeRequest(request_id, list(prompt["prompt_token_ids"]), dict(params),
                              priority, len(self.added), trace_headers=trace_headers)
        self.requests[request_id] = request
        self.added.append(request)
        return request_id

    def abort_request(self, request_ids: list[str]) -> None:
        for i in request_ids:
            if self.requests.pop(i, None) is not None:
                self.aborted.append(i)

    def allow(self, steps: int) -> None:
        assert self.gate is not None
        self.gate.release(steps)

    def step(self) -> list[Any]:
        if self.gate is not None:
            assert self.gate.acquire(timeout=30), "the test never allowed this step"
        self.steps += 1
        batch = sorted(self.requests.values(), key=lambda r: (r.priority, r.arrival))
        batch = batch[:self.max_num_seqs]
        self.batches.append([r.id for r in batch])
        outputs = []
        for r in batch:
            token = next_token(r.prompt + r.output)
            forced = r.params.get("force")
            if forced:
                token = forced.pop(0)
            r.output.append(token)
            tokens = [token]
            if r.params.get("burst"):  # as speculative decoding would: two tokens at once
                tokens.append(next_token(r.prompt + r.output))
                r.output.append(tokens[-1])
            reason = None
            if token in (r.params["stop_token_ids"] or ()):
                reason = "stop"
            elif len(r.output) >= r.params["max_tokens"]:
                reason = "length"
            if reason is not None:
                del self.requests[r.id]
            outputs.append(SimpleNamespace(
                request_id=r.id, finished=reason is not None,
                outputs=[SimpleNamespace(token_ids=tokens, finish_reason=reason)]))
        return outputs


def fake_requests() -> Requests:
    return Requests(sampling=lambda **kw: kw, prompt=lambda ids: {"prompt_token_ids": ids})
