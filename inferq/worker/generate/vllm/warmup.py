"""A full burst through vLLM before the worker is advertised.

vLLM's own start warms its model up on one dummy batch of ``max_num_batched_tokens``; the
worker then claims ``max_num_seqs`` sequences at once, and its first real burst (that many
prompts prefilled together, then decoded together) is the first time the engine runs those
shapes end to end (the scheduler, the attention metadata, the sampler with that many rows).
``warm_up`` runs exactly that burst (``slots`` greedy requests of ``prompt_len`` tokens, a few
tokens each) and waits until vLLM has finished them, so that what it costs the first time is
paid before the worker registers, not by its first clients.
"""

from __future__ import annotations

import time
from typing import Any

from inferq.worker.generate.vllm.engine import CoreLike, Requests

#: Tokens each warm-up request decodes (the first comes from the prefill step).
WARM_UP_TOKENS = 4
#: Steps after which a warm-up that has not finished is a bug, not a slow machine.
MAX_STEPS = 1000


def warm_up(core: CoreLike, requests: Requests, *, slots: int, prompt_len: int,
            token_id: int) -> float:
    """Run ``slots`` requests of ``prompt_len`` copies of ``token_id`` to ``WARM_UP_TOKENS``
    tokens each, prefilled and decoded together; the seconds it took."""
    started = time.monotonic()
    params = requests.sampling(n=1, max_tokens=WARM_UP_TOKENS, temperature=0.0,
                               ignore_eos=True, stop_token_ids=None)
    ids = [f"inferq-warm-up-{i}" for i in range(slots)]
    for request_id in ids:
        core.add_request(request_id, requests.prompt([token_id] * prompt_len), params)
    left = set(ids)
    for _ in range(MAX_STEPS):
        outputs: Any = core.step()
        left -= {out.request_id for out in outputs if out.finished}
        if not left:
            return time.monotonic() - started
    core.abort_request(sorted(left))
    raise RuntimeError(f"vLLM's warm-up did not finish {len(left)} requests in {MAX_STEPS} "
                       "steps")
