"""Iteration-level ("continuous") batching of generations on one model: our own KV-cache loop.

Every call to ``step`` is one iteration in the sense of Orca/vLLM/TGI: the sequences admitted
now are prefilled (one left-padded batch) and get their first token, and every sequence that
was already running decodes one more token, in one batched forward over the slot KV cache
(``kvcache.SlotKVCache``). Sequences that finish (end-of-sequence token, stop string,
``max_new_tokens``, context length) or are cancelled leave at once and free their slot for the
next step's admissions, which the scheduler picks in priority order under the slot and KV
budgets.

Why our own loop rather than transformers' ``init_continuous_batching``: measured in process on
the same prompts by ``python -m benchmarks engines`` (figures in benchmarks/RESULTS.md, section
``engines``), ours made more tokens/s than transformers' manager on both the tiny Llama and
SmolLM2; static padded batches match it only when every sequence has the same length, and on
the queue's mixed lengths our worker makes more tokens/s than request-level batching (section
``generate``).

transformers' manager was configured as it must be on a CPU (16-token pages instead of 256,
a cache sized for the work instead of from the host's RAM, 16 requests per batch) and is still
the slowest of the three. It also lacks what a queue worker needs: per-request sampling
parameters and seeds, admission in our priority order (it admits FIFO from its own queue),
stop strings. This loop admits in priority order at every step, samples each row with its
own parameters and generator, cancels within a step, and its greedy output equals ``generate``
token for token (tested). Its price is attention over the longest running sequence (a padded
rectangle, not pages), cheap next to the matmuls for the models and contexts served here; a
GPU deployment with long contexts would want paged attention kernels, behind the same
``step`` interface.

Where the loop runs. ``steploop.StepLoop`` can run it on a thread of the worker process, next
to the asyncio loop that claims, streams and completes (``--no-engine-process``); torch
releases the GIL inside its kernels, but every Python line of a step (scheduling, sampling,
detokenizing) waits for the GIL while the event loop encodes Redis calls, and the other way
round. The benchmark (``engines``) measures what that costs (RESULTS.md): next to a busy thread
the engine loses a clear share of its speed, next to a busy process far less. So, as vLLM's
engine core does, the loop runs by default in a child process of its own
(``GenerationSettings.engine_process``, ``inferq worker --engine-process``):
``engine_client.EngineProcess`` spawns it (``spawn``, never ``fork``: a CUDA context does not
survive a fork), the child loads the model and runs ``StepLoop`` over this ``Engine``; the
worker process keeps claims, stream writes, results, leases, cancellation and metrics. The
weights live only in the child: the worker process loads the tokenizer and configs
(``CausalLM(weights=False)``), all it needs to render and tokenize prompts, check them against
the context, and build ``Generation``s here (``new_generation``, ``fits_alone``) without ever
stepping. The KV budget is sized in the child too, after the weights load (on CUDA it is a
share of the memory they leave free), and sent with its ``ready``; the worker adopts it (and
claims nothing before). They talk over one pipe in the typed messages of ``wire``: submissions,
cancellations and withdrawals one way; the step outputs (each running request's new token and
text, finished requests' final text) the other way, as many steps per message as queued while
the worker was busy. Cancellation is a message the child applies at its next step boundary, as
the thread does. The worker notices a dead child when the pipe closes, retries what had started
(alone and from its streamed tokens), gives back the rest and starts a new child, which loads
the weights again before it serves. The price: a second copy of the tokenizer (the worker
tokenizes, the child detokenizes, for stop strings) and a pipe hop per message; not a second
copy of the weights. What it bought, through the queue, is in RESULTS.md (``generate``: the
``process`` variant against ``continuous``). The child runs with a 0.5 ms switch interval: its
pipe reader and sender would otherwise wait up to 5 ms, several small decode steps, for the GIL
the step loop holds."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from inferq.protocol.generation import FinishReason, GenerationParams
from inferq.worker.generate import scheduler
from inferq.worker.generate.kvcache import SlotKVCache, footprint
from inferq.worker.generate.prefixcache import PrefixCache
from inferq.worker.models.detok import Detokenizer
from inferq.worker.models.lm import CausalLM
from inferq.worker.models.sampling import (
    TokenLogprob,
    choose,
    logprobs_of,
    make_generator,
    seed_for,
)

log = logging.getLogger("inferq.worker")


@dataclass(eq=False)
class Generation:
    """One request's generation: its prompt, parameters, progress and slot."""

    id: str
    prompt_ids: list[int]
    params: GenerationParams
    max_new: int
    detok: Detokenizer
    priority: int = 0
    order: int = 0
    generator: torch.Generator | None = None
    #: Whatever the caller attaches (the worker: its claimed job).
    tag: Any = None
    #: W3C trace context headers for an engine that traces (vLLM: its spans join the
    #: request's trace); None without one.
    trace_headers: dict[str, str] | None = None
    tokens: list[int] = field(default_factory=list)
    #: With ``params.logprobs``: one entry per token of ``tokens`` (None for tokens a previous
    #: attempt streamed), and once finished their JSON form (``Engine.logprob_output``).
    logprobs: list[TokenLogprob | None] = field(default_factory=list)
    logprob_output: list[dict[str, Any]] | None = None
    row: int = -1
    #: Positions of this sequence held in the KV cache.
    length: int = 0
    finish: FinishReason | None = None
    #: Decode steps this sequence took part in, and the batch sizes of those steps summed.
    steps: int = 0
    batch_sum: int = 0
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    #: Steps that failed while this sequence took part (see ``steploop``); a suspect is
    #: admitted alone until one step of its own succeeds.
    failures: int = 0
    suspect: bool = False
    #: Runs alone: no other sequence shares its steps (a request whose previous attempt may
    #: have crashed a worker, see ``steploop``).
    alone: bool = False
    #: Times it was preempted for a higher priority, and the engine step at which it was
    #: last admitted (``scheduler.plan`` preempts the latest admitted first).
    preemptions: int = 0
    entered: int = 0
    #: Its KV cache while it is preempted, swapped out to host memory (per layer: keys and
    #: values of its ``length`` positions); None when it runs, or will be recomputed.
    swapped: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    #: Prompt tokens its last admission took from the prefix cache instead of computing.
    cached_tokens: int = 0
    #: Its identities for cache affinity (``inferq.protocol.prefix``: prefix hashes and
    #: session), held by the prefix cache while its prompt is.
    identities: tuple[str, ...] = ()

    def count_step(self, batch: int, now: float) -> None:
        """This sequence took part in a decode step of ``batch`` sequences that ended at
        ``now`` (every engine counts its steps so; the result's batch size and TTFT)."""
        self.steps += 1
        self.batch_sum += batch
        if self.first_token_at is None:
            self.first_token_at = now

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def prefill_ids(self) -> list[int]:
        """What admission prefills: the prompt, plus the tokens generated so far when a
        sequence is admitted again after leaving the batch without finishing (recomputation:
        it goes on from where it was, its stream and sampler state untouched)."""
        return self.prompt_ids + self.tokens if self.tokens else self.prompt_ids

    @property
    def prefill_tokens(self) -> int:
        """Tokens its admission prefills: none for a preempted sequence whose cache was
        swapped out (it is put back)."""
        return 0 if self.swapped is not None else len(self.prompt_ids) + len(self.tokens)

    @property
    def swap_bytes(self) -> int:
        """Host memory its swapped-out cache holds."""
        if self.swapped is None:
            return 0
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size()
                   for k, v in self.swapped)

    @property
    def reserve_tokens(self) -> int:
        return len(self.prompt_ids) + self.max_new

    @property
    def due(self) -> bool:
        """Whether the step in flight gives it its last token (``max_new_tokens``)."""
        return len(self.tokens) + 1 >= self.max_new

    @property
    def in_batch(self) -> bool:
        return self.row >= 0


class AdmissionFailed(Exception):
    """The prefill of a step's admissions raised. The running sequences decoded their token
    (``advanced``, as ``Engine.step`` returns it); ``rejected`` did not join the batch and
    are as they were before the step."""

    def __init__(self, advanced: list[Generation], rejected: list[Generation],
                 cause: Exception) -> None:
        super().__init__(f"prefill of {len(rejected)} sequences failed: {cause}")
        self.advanced = advanced
        self.rejected = rejected
        self.cause = cause


class Engine:
    """Owns the model's KV cache and the running sequences. Not thread-safe: one thread calls
    ``step`` and ``cancel``, one at a time."""

    def __init__(self, lm: CausalLM, budget: scheduler.Budget, *,
                 clock: Any = time.monotonic, prefix_cache_bytes: int = 0) -> None:
        self.lm = lm
        self.budget = budget
        self.clock = clock
        self.cache = SlotKVCache(lm.kv, lm.torch_device, budget.max_slots)
        self.running: list[Generation] = []
        self.steps = 0
        self.decoded_tokens = 0
        #: The prefix cache (``prefixcache``), None when off: bounded by its own limit and by
        #: what the running sequences' reservations leave of the KV budget.
        self.prefix = PrefixCache(prefix_cache_bytes, self._prefix_room) \
            if prefix_cache_bytes > 0 else None
        self._reserved = 0

    def _prefix_room(self) -> int:
        """Bytes of the KV budget the running sequences do not reserve."""
        return (self.budget.kv_tokens - self._reserved) * self.lm.kv.bytes_per_token

    # ------------------------------------------------------------------------- building

    def new_generation(self, request_id: str, prompt_ids: list[int], params: GenerationParams,
                       *, priority: int = 0, order: int = 0, tag: Any = None,
                       alone: bool = False, streamed: Sequence[int] = (),
                       shown: str = "", trace_headers: dict[str, str] | None = None,
                       identities: Sequence[str] = ()) -> Generation:
        """A generation ready to admit; ``max_new`` is capped by the model's context.

        ``streamed``: the tokens a previous attempt already put in the request's stream, whose
        text ``shown`` the producer has seen. The generation goes on from them (admission
        prefills prompt + ``streamed``); they count towards ``max_new``, and a generation they
        already finish (end of sequence, stop string, length) is returned finished."""
        room = self.lm.max_positions - len(prompt_ids)
        generator = None if params.greedy else make_generator(seed_for(request_id, params))
        g = Generation(
            id=request_id, prompt_ids=prompt_ids, params=params,
            max_new=max(0, min(params.max_new_tokens, room)),
            detok=Detokenizer(self.lm.decode, prompt_ids, params.stop, backend=self.lm.backend),
            priority=priority, order=order, generator=generator, tag=tag, alone=alone,
            trace_headers=trace_headers, identities=tuple(identities),
        )
        if streamed:
            self._resume(g, streamed, shown)
        return g

    def _resume(self, g: Generation, streamed: Sequence[int], shown: str) -> None:
        for token in streamed:
            if g.finish is not None:
                break
            self._accept(g, int(token))
        if g.finish is not None:
            self._close(g, self.clock())
        if not g.detok.text.startswith(shown):
            log.warning("request %s: the text of its %d streamed tokens does not start with "
                        "the %d characters its stream shows", g.id, len(g.tokens), len(shown))
        g.detok.emitted = min(len(shown), len(g.detok.text))

    def footprint(self, rows: int, longest: int) -> int:
        return footprint(rows, longest, self.budget.max_slots)

    def slots_now(self) -> int:
        """Slots that may hold a sequence now: the budget's (the vLLM engine offers fewer
        when its scheduler has no room, see ``vllm.capacity``)."""
        return self.budget.max_slots

    def fits_alone(self, generation: Generation) -> bool:
        return scheduler.fits_alone(generation.reserve_tokens, self.budget, self.footprint)

    def select(self, waiting: Sequence[Generation]) -> list[Generation]:
        """Which of ``waiting`` to admit at the next step (priority order, budgets)."""
        return scheduler.admit(waiting, [g.reserve_tokens for g in self.running], self.budget,
                               self.footprint)

    def plan(self, waiting: Sequence[Generation], max_preemptions: int
             ) -> scheduler.Plan[Generation, Generation]:
        """``select``, and the running sequences to preempt for it (``scheduler.plan``)."""
        return scheduler.plan(waiting, self.running, self.budget, self.footprint,
                              max_preemptions=max_preemptions)

    # ---------------------------------------------------------------------------- steps

    @torch.inference_mode()
    def step(self, admitted: Sequence[Generation] = ()) -> list[Generation]:
        """One iteration: prefill ``admitted``, decode one token for every sequence already
        running. Returns the sequences that advanced; finished ones have left the batch.

        A failed decode raises before any sequence changed (the caller ``clear``s the batch);
        a failed prefill raises ``AdmissionFailed`` after the running sequences advanced."""
        if len(self.running) + len(admitted) > self.budget.max_slots:
            raise ValueError("admitting more sequences than there are slots")
        swapped = [g for g in admitted if g.swapped is not None]
        fresh = [g for g in admitted if g.swapped is None]
        if self.prefix is not None:  # the running sequences' room comes first
            every = (*self.running, *admitted)
            self._reserved = self.footprint(len(every), max(
                (g.reserve_tokens for g in every), default=0)) if every else 0
            self.prefix.shrink()
        if swapped:  # resumed with their cache: they decode with the others
            self._swap_in(swapped)
        decoding = list(self.running)
        if decoding:
            self._decode(decoding)
        cause: Exception | None = None
        if fresh:
            try:
                self._prefill(fresh)
            except Exception as exc:
                cause = exc
                del self.running[len(decoding):]
                for g in fresh:
                    g.row = -1
        self.steps += 1
        advanced = [*decoding, *fresh] if cause is None else decoding
        now = self.clock()
        for g in advanced:
            g.count_step(len(advanced), now)
            if g.finish is not None:
                self._close(g, now)
                self._leave(g)
        if cause is not None:
            if not self.running:
                self.cache.release()
            raise AdmissionFailed(advanced, fresh, cause) from cause
        return advanced

    @torch.inference_mode()
    def cancel(self, generation: Generation) -> None:
        """Free a running sequence's slot now (between steps)."""
        if generation.in_batch:
            generation.finish = FinishReason.CANCELLED
            generation.finished_at = self.clock()
            self._leave(generation)

    @torch.inference_mode()
    def preempt(self, generation: Generation, *, swap: bool) -> None:
        """Push a running sequence out of the batch (between steps) for a higher priority: its
        slot and cache row are freed; it keeps its tokens, sampler and text. With ``swap``, its
        cache is copied to host memory and put back into a free row when it is admitted again
        (nothing is computed twice); otherwise it is recomputed then, by prefilling its prompt
        and tokens (``prefill_ids``)."""
        if generation.in_batch:
            if swap:
                generation.swapped = self.cache.save_row(generation.row, generation.length)
            self._leave(generation)
            if not swap:
                generation.length = 0
            generation.preemptions += 1

    def _swap_in(self, resumed: list[Generation]) -> None:
        """Put preempted sequences' saved caches back, into the rows after the running ones."""
        n = len(self.running)
        longest = max(g.reserve_tokens for g in (*self.running, *resumed))
        self.cache.ensure(n + len(resumed), longest)
        for r, g in enumerate(resumed):
            assert g.swapped is not None
            self.cache.load_row(n + r, g.swapped)
            g.swapped = None
            g.row, g.entered = n + r, self.steps
            self.running.append(g)

    def clear(self) -> list[Generation]:
        """Drop every running sequence (after a failed step); returns them."""
        dropped, self.running = self.running, []
        for g in dropped:
            g.row = -1
        self.cache.release()
        return dropped

    # -------------------------------------------------------------------------- internals

    def _close(self, g: Generation, now: float) -> None:
        g.detok.flush()
        g.finished_at = now
        if g.params.logprobs:
            g.logprob_output = self.logprob_output(g)

    def logprob_output(self, g: Generation) -> list[dict[str, Any]]:
        """Per generated token: its text, id and log-probability, and the top alternatives
        (the result's ``logprobs``)."""
        out: list[dict[str, Any]] = []
        for token, entry in zip(g.tokens, g.logprobs, strict=True):
            top = [] if entry is None else entry[2]
            out.append({"token": self.lm.decode([token]), "id": token,
                        "logprob": None if entry is None else entry[1],
                        "top": [{"token": self.lm.decode([t]), "id": t, "logprob": lp}
                                for t, lp in top]})
        return out

    def _leave(self, generation: Generation) -> None:
        row = generation.row
        last = self.running[-1]
        if last is not generation:
            self.cache.move_row(last.row, row, last.length)
            last.row = row
            self.running[row] = last
        self.running.pop()
        generation.row = -1
        if not self.running:
            self.cache.release()

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """A 4D mask as the attention implementation takes it: boolean for SDPA, additive
        float for eager attention."""
        if self.lm.attn_implementation == "eager":
            zero = torch.zeros((), dtype=self.lm.dtype, device=allowed.device)
            return torch.where(allowed, zero, torch.finfo(self.lm.dtype).min)
        return allowed

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
        out = self.lm.model(input_ids=input_ids, attention_mask=self._mask(mask),
                            position_ids=positions, **self.lm.forward_kwargs(self.cache))
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    def _prefill(self, admitted: list[Generation]) -> None:
        hits = [self.prefix.lookup(g.prefill_ids) for g in admitted] \
            if self.prefix is not None else []
        if any(length for length, _ in hits):
            logits = self._prefill_after(admitted, hits)
        else:
            logits = self._prefill_all(admitted)
        for g in admitted:
            g.length = len(g.prefill_ids)
        for g, (length, _) in zip(admitted, hits, strict=False):  # none: the cache is off
            g.cached_tokens = length
        firsts = self._admit(admitted, logits)
        if self.prefix is not None:  # before any sequence leaves: the rows are as computed
            for g in admitted:
                length = min(g.length, len(g.prompt_ids))
                self.prefix.insert(g.prompt_ids, length, partial(self.cache.read_block, g.row))
                self.prefix.tie(g.identities, g.prompt_ids, length)
        for g, (token, lp) in zip(admitted, firsts, strict=True):
            self._accept(g, token, lp)

    def _prefill_after(self, admitted: list[Generation],
                       hits: list[tuple[int, list[torch.Tensor]]]) -> torch.Tensor:
        """The prefill when some prompts start with cached blocks: those are copied into the
        rows, and only the rest of each prompt is computed, attending over the whole row."""
        device = self.lm.torch_device
        n, k = len(self.running), len(admitted)
        starts = [length for length, _ in hits]
        full = [g.prefill_ids for g in admitted]
        lengths = [len(ids) - start for ids, start in zip(full, starts, strict=True)]
        width = max(lengths)
        ids = torch.full((k, width), self.lm.pad_id, dtype=torch.long)
        for r, (row_ids, start) in enumerate(zip(full, starts, strict=True)):
            ids[r, width - lengths[r]:] = torch.as_tensor(row_ids[start:], dtype=torch.long)
        longest = max(g.reserve_tokens for g in (*self.running, *admitted))
        self.cache.ensure(n + k, longest)
        for r, (start, blocks) in enumerate(hits):
            if start:
                self.cache.load_prefix(n + r, blocks)
        kv_len = self.cache.plan_extend(n, starts, lengths, width)
        cols = torch.arange(width)
        pad = torch.tensor([width - length for length in lengths])
        query_pos = torch.tensor(starts)[:, None] + cols[None, :] - pad[:, None]   # [k, W]
        keys = torch.arange(kv_len)
        allowed = keys[None, None, :] <= query_pos[:, :, None]                     # [k, W, L]
        # a padding column attends to position 0 only (a row of no keys would give NaN)
        allowed |= (query_pos < 0)[:, :, None] & (keys == 0)[None, None, :]
        return self._forward(ids.to(device), allowed[:, None].to(device),
                             query_pos.clamp(min=0).to(device))

    def _prefill_all(self, admitted: list[Generation]) -> torch.Tensor:
        device = self.lm.torch_device
        n, k = len(self.running), len(admitted)
        lengths = [g.prefill_tokens for g in admitted]
        width = max(lengths)
        ids = torch.full((k, width), self.lm.pad_id, dtype=torch.long)
        for r, g in enumerate(admitted):
            ids[r, width - lengths[r]:] = torch.as_tensor(g.prefill_ids, dtype=torch.long)
        cols = torch.arange(width)
        start = torch.tensor([width - length for length in lengths])
        key_ok = cols[None, :] >= start[:, None]                      # [k, W] real keys
        causal = cols[None, :] <= cols[:, None]                       # [W(q), W(k)]
        allowed = (causal[None] & key_ok[:, None, :]) | torch.eye(width, dtype=torch.bool)[None]
        positions = (cols[None, :] - start[:, None]).clamp(min=0)
        longest = max(g.reserve_tokens for g in (*self.running, *admitted))
        self.cache.ensure(n + k, longest)
        self.cache.plan_prefill(list(range(n, n + k)), lengths, width)
        return self._forward(ids.to(device), allowed[:, None].to(device), positions.to(device))

    def _admit(self, admitted: list[Generation], logits: torch.Tensor
               ) -> list[tuple[int, TokenLogprob | None]]:
        """After a prefill's forward: the admitted sequences take their rows (after the
        running ones); returns the first token of each (and its logprob)."""
        tokens = choose(logits, admitted, self.lm.eos_ids)
        logprobs = logprobs_of(logits, admitted, tokens)
        now = self.clock()
        n = len(self.running)
        for r, g in enumerate(admitted):
            g.row, g.entered = n + r, self.steps
            g.admitted_at = now if g.admitted_at is None else g.admitted_at
            self.running.append(g)
        return list(zip(tokens, logprobs, strict=True))

    def _decode(self, decoding: list[Generation]) -> None:
        device = self.lm.torch_device
        ids = torch.tensor([[g.tokens[-1]] for g in decoding], dtype=torch.long)
        lengths = [g.length for g in decoding]
        positions = torch.tensor(lengths, dtype=torch.long)
        kv_len = max(lengths) + 1
        allowed = torch.arange(kv_len)[None, :] <= positions[:, None]      # [n, kv_len]
        positions_d = positions.to(device)
        self.cache.plan_decode(positions_d, kv_len)
        logits = self._forward(ids.to(device), allowed[:, None, None, :].to(device),
                               positions_d[:, None])
        tokens = choose(logits, decoding, self.lm.eos_ids)
        logprobs = logprobs_of(logits, decoding, tokens)
        for g, token, lp in zip(decoding, tokens, logprobs, strict=True):
            g.length += 1
            self._accept(g, token, lp)
        self.decoded_tokens += len(decoding)

    def _accept(self, g: Generation, token: int, logprob: TokenLogprob | None = None) -> None:
        g.tokens.append(token)
        if g.params.logprobs:
            g.logprobs.append(logprob)
        if ((token in self.lm.eos_ids and not g.params.ignore_eos)
                or token in g.params.stop_token_ids):
            g.finish = FinishReason.STOP
            return
        g.detok.add(token)
        if g.detok.stopped:
            g.finish = FinishReason.STOP
        elif len(g.tokens) >= g.max_new:
            g.finish = FinishReason.LENGTH
