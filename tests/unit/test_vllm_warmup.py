"""``vllm.warmup``: a full burst of ``max_num_seqs`` requests through the engine before the
worker is advertised, on the fake ``LLMEngine``."""

from __future__ import annotations

from inferq.worker.generate.vllm.warmup import WARM_UP_TOKENS, warm_up
from tests.support.fake_vllm import FakeCore, fake_requests


def test_warm_up_runs_one_full_burst_to_the_end_and_leaves_nothing_behind() -> None:
    core = FakeCore(max_num_seqs=6)
    seconds = warm_up(core, fake_requests(), slots=6, prompt_len=64, token_id=5)
    assert seconds >= 0
    assert len(core.added) == 6 and all(r.prompt == [5] * 64 for r in core.added)
    assert all(r.params["max_tokens"] == WARM_UP_TOKENS and r.params["temperature"] == 0.0
               and r.params["ignore_eos"] for r in core.added)
    # Prefilled and decoded together: every step ran the whole burst.
    assert core.batches == [[r.id for r in core.added]] * WARM_UP_TOKENS
    assert not core.requests and not core.aborted
