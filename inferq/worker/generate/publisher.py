"""The stream publisher of a ``generate`` worker: each step's new text into every running
request's Redis Stream, and the results of finished ones.

Each stream entry carries the text and the ids of the tokens generated since the previous
one: the tokens in a stream are what its producer was shown, and a retried or reclaimed
generation goes on from them (``streamed``, read back with one XRANGE when it is claimed) instead
of generating again, so its stream never contradicts itself.

One pipelined round trip per write (``QueueLink.publish``: ``stream``, token checked;
``complete``; ``stream_end``), at most once per ``stream_interval_ms``: queued steps are merged
into one write, so a fast model is not slowed by a write per step. The ``stream`` call reports
requests whose lease is gone: cancelled by their producer (``Handle.cancel``) or taken over.
Nothing is appended for them after that and the model thread drops them at its next step
boundary, freeing the slot."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferq.protocol import ops
from inferq.protocol.codec import Usage
from inferq.protocol.fields import StreamField
from inferq.protocol.generation import FinishReason
from inferq.worker.core.failures import Failure, failure_of
from inferq.worker.core.metrics import exemplar_of
from inferq.worker.core.queue_link import QueueLink, ScriptPipeline
from inferq.worker.core.results import Claim, completion
from inferq.worker.generate.engine import Generation
from inferq.worker.generate.stats import GenerationStats
from inferq.worker.generate.steploop import StepOutput, Steps

#: The scripts of one write, loaded on the publisher's own connection.
PUBLISHER_SCRIPTS = ("stream", "complete", "stream_end")


def streamed(entries: Sequence[tuple[Any, Mapping[Any, Any]]]) -> tuple[list[int], str]:
    """The token ids and the text a stream (``XRANGE`` entries) holds."""
    tokens: list[int] = []
    text: list[str] = []
    for _entry_id, fields in entries:
        values = {ops.as_str(k): ops.as_str(v) for k, v in fields.items()}
        tokens += [int(t) for t in values.get(StreamField.TOKENS, "").split()]
        text.append(values.get(StreamField.TEXT, ""))
    return tokens, "".join(text)


@dataclass(slots=True)
class StreamClaim(Claim):
    #: When the stream first showed text (this worker's monotonic clock).
    first_visible: float | None = None
    #: Engine steps between the step that made the first text and its hand-over to this
    #: publisher (``StepOutput.delivered``).
    first_text_lag: int | None = None


def claim_of(g: Generation) -> StreamClaim:
    """The claim a generation was made from (its ``tag``)."""
    claim = g.tag
    assert isinstance(claim, StreamClaim)
    return claim


@dataclass(eq=False)
class StreamPublisher:
    link: QueueLink
    stats: GenerationStats
    steps: Steps
    pipeline: ScriptPipeline
    interval_s: float
    max_slots: int
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _stop: bool = field(default=False, init=False)
    _failures: list[list[ops.Completion]] = field(default_factory=list, init=False)
    _done: list[StepOutput] = field(default_factory=list, init=False)

    def wake(self) -> None:
        """Outputs are waiting (called on the event loop)."""
        self._wake.set()

    def stop(self) -> None:
        """Write what is left, then end ``run``."""
        self._stop = True
        self._wake.set()

    def finished(self, generations: Sequence[Generation]) -> None:
        """Generations that were finished when claimed (their stream already held every
        token: the previous attempt died before its result was written): written with the
        next write, as if a step had finished them."""
        self._done.append(StepOutput([], list(generations), 0, 0, 0.0))
        self._wake.set()

    def fail(self, exc: Exception | Failure, victims: Sequence[Generation]) -> None:
        """A forward raised (or the engine process died): every sequence of the step fails
        (retried with backoff while attempts remain, as a crashed batch in the window
        worker); written in step order."""
        failure = exc if isinstance(exc, Failure) else failure_of(exc)
        now_ms = self.link.now_ms()
        self._failures.append([completion(self.link.config, claim_of(g), failure,
                                          finished_ms=now_ms) for g in victims])
        self._wake.set()

    async def run(self) -> None:
        """Write the steps' text and results in step order (one coroutine: ordered), at most
        once per interval: the steps that finish meanwhile are merged into one write (a tiny
        model steps every couple of ms; a write per step would cost more CPU, shared with the
        model thread, than the step itself)."""
        last = -self.interval_s
        while True:
            self._wake.clear()
            outs = self.steps.take_outputs(arm=True)
            outs, self._done = self._done + outs, []
            failures, self._failures = self._failures, []
            if not outs and not failures:
                if self._stop:
                    return
                await self._wake.wait()
                continue
            wait = last + self.interval_s - self.link.clock()
            if wait > 0:
                await asyncio.sleep(wait)
                outs += self.steps.take_outputs(arm=False)
            last = self.link.clock()
            for completions in failures:
                written = await self.link.complete(completions, scripts=self.pipeline.scripts)
                if written is not None:
                    self.stats.count(self.link.metrics, completions, written)
            if outs:
                await self._publish(outs)
                for out in outs:
                    self._record(out)

    def _trace(self, outs: list[StepOutput]) -> None:
        """Each step that admitted sequences: an ``admit`` span linked to their requests (a
        ``admit`` event on each, with the prefill); ``preempted`` events."""
        traces = self.link.traces
        assert traces is not None
        for out in outs:
            at = self.link.to_ns(out.at)
            if out.entered:
                traces.group("admit", [g.id for g in out.entered],
                             at - int(out.elapsed_s * 1e9), at,
                             {"inferq.step": out.step,
                              "inferq.prefill_tokens": out.prefill_tokens},
                             {"inferq.step": out.step}, event=True)
            for g in out.preempted:
                traces.event(g.id, "preempted", {"inferq.step": out.step,
                                                 "gen_ai.usage.output_tokens": len(g.tokens)},
                             at)

    async def _publish(self, outs: list[StepOutput]) -> None:
        if self.link.traces is not None:
            self._trace(outs)
        merged: dict[str, tuple[Generation, list[int], str]] = {}
        for out in outs:
            for g, token, text in out.advanced:
                if text and (claim := claim_of(g)).first_text_lag is None:
                    claim.first_text_lag = out.delivered - out.step
                    self.stats.first_text_lags.append(claim.first_text_lag)
                prev = merged.get(g.id)
                if prev is None:
                    merged[g.id] = (g, [token], text)
                else:
                    prev[1].append(token)
                    merged[g.id] = (g, prev[1], prev[2] + text)
        finished = [g for out in outs for g in out.finished]
        deltas = [ops.StreamDelta(g.id, claim_of(g).claimed.token, claim_of(g).claimed.attempt,
                                  text, tokens) for g, tokens, text in merged.values()]
        completions = [self._result(g) for g in finished]
        published = await self.link.publish(deltas, completions, pipeline=self.pipeline)
        if published is None:
            return
        now = self.link.clock()
        for g, _tokens, text in merged.values():
            claim = claim_of(g)
            if text and g.id not in published.lost and claim.first_visible is None:
                claim.first_visible = now
                if self.link.traces is not None:
                    self.link.traces.event(g.id, "first token", at_ns=self.link.to_ns(now))
        done = {c.id for c in completions}
        running_lost = [i for i in published.lost if i not in done]
        if running_lost:
            self.steps.cancel(running_lost)
        if completions:
            self.stats.count(self.link.metrics, completions, published.written, published.lost)
            for g, ok in zip(finished, published.written, strict=True):
                if ok:
                    self._observe_latency(g)

    def _record(self, out: StepOutput) -> None:
        self.stats.record(out)
        m = self.link.metrics
        if out.preempted:
            m.preemptions.labels(m.queue, "priority").inc(len(out.preempted))
        size = len(out.advanced)
        if not size:
            return
        m.observe_batch(size, self.max_slots, out.elapsed_s, size + out.prefill_tokens)
        m.generated_tokens.labels(m.queue).inc(size)

    def _observe_latency(self, g: Generation) -> None:
        claim, m = claim_of(g), self.link.metrics
        m.observe_latency(claim, self.link.now_ms())
        if claim.first_visible is not None:
            m.ttft.labels(m.queue, str(claim.payload.priority)).observe(
                max(claim.first_visible - claim.arrival, 0.0), exemplar_of(claim))

    def _result(self, g: Generation) -> ops.Completion:
        claim = claim_of(g)
        finished_at = g.finished_at if g.finished_at is not None else self.link.clock()
        # A text that became visible in this very write is visible when the write returns;
        # "now" is within that round trip.
        first = claim.first_visible if claim.first_visible is not None else self.link.clock()
        finish = g.finish or FinishReason.LENGTH
        self.stats.reasons[finish.value] += 1
        if self.link.traces is not None:
            self.link.traces.annotate(g.id, {"gen_ai.response.finish_reasons": [finish.value]})
        output: dict[str, Any] = {"text": g.detok.text, "token_ids": g.tokens}
        if g.logprob_output is not None:
            output["logprobs"] = g.logprob_output
        finished_ms = self.link.to_ms(finished_at)
        # ttft is measured on the local clock, total on Redis' integer clock: never let the
        # rounding between the two make the first token come after the end.
        ttft_ms = min(round(max(0.0, first - claim.arrival) * 1e3, 3),
                      float(max(finished_ms - claim.claimed.enqueued_ms, 0)))
        return completion(
            self.link.config, claim, output, batch_size=round(g.batch_sum / max(g.steps, 1)),
            input_tokens=g.prompt_tokens, finished_ms=finished_ms,
            compute_ms=round((finished_at - (g.admitted_at or finished_at)) * 1e3, 3),
            finish_reason=finish,
            usage=Usage(prompt_tokens=g.prompt_tokens, completion_tokens=len(g.tokens)),
            ttft_ms=ttft_ms)
