"""The live dashboard in a real browser (headless Chromium over WebDriver): the token form,
the queue depth changing as requests flow, and a click on requeue that shrinks the
dead-letter set. Skips, saying why, where Chromium or its driver is not installed."""

from __future__ import annotations

import pytest
import redis

import inferq
from tests.integration.test_dead_letters import kill_by_worker
from tests.integration.test_protocol import KEYS, Scripts
from tests.support.gateway import TOKEN
from tests.support.webdriver import chromium, missing

pytestmark = [pytest.mark.skipif(missing() is not None, reason=str(missing())),
              pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")]

PENDING = 'section[data-queue="embed:m"] td.pending'
LETTERS = 'section[data-queue="embed:m"] tr.dead-letter'


def test_the_dashboard_shows_depth_and_requeues_a_dead_letter_on_click(
        gateway: str, client: inferq.Client, r: redis.Redis) -> None:
    base = gateway.removesuffix("/v1")
    scripts = Scripts(r)
    for i in range(3):
        client.enqueue(f"prompt {i}", model="m", id=f"r{i}", max_attempts=1)
    with chromium() as browser:
        browser.get(f"{base}/dashboard")
        browser.type('input[name="token"]', TOKEN)
        browser.click("#sign-in")
        browser.wait(lambda: browser.text(PENDING) == "3", "3 pending")
        assert browser.text('section[data-queue="embed:m"] td.slo-met') == "\u2013"  # none
        # a live worker publishes goodput and admission's prediction error
        seconds, micros = r.time()
        r.zadd(KEYS.workers, {"w1": seconds * 1000 + micros // 1000 + 60_000})
        r.hset(KEYS.window("w1"), mapping={"slo_met": "3", "slo_missed": "1",
                                           "slo_ratio": "0 0 0 0 2 0 0 0 2 0 0 0 0"})
        browser.wait(lambda: browser.text('section[data-queue="embed:m"] td.slo-met')
                     == "3/4 (75.0%)", "goodput shown")
        assert browser.text('section[data-queue="embed:m"] td.slo-ratio') == "1.00 / 1.90"
        # and cache affinity's figures: none yet, then per worker and summed for the queue
        queue_row = 'section[data-queue="embed:m"] tr:not(.worker)'
        worker = 'section[data-queue="embed:m"] tr.worker[data-id="w1"]'
        assert browser.text(f"{queue_row} td.aff-hit") == "\u2013"
        r.hset(KEYS.window("w1"), mapping={"prefix_prompt_tokens": "1000",
                                           "prefix_reused_tokens": "800", "claimed": "8",
                                           "affinity_claimed": "6", "held_prefixes": "4"})
        for css, shown in ((f"{queue_row} td.aff-hit", "80.0%"),
                           (f"{queue_row} td.aff-saved", "800"),
                           (f"{worker} td.aff-hit", "80.0%"),
                           (f"{worker} td.aff-claims", "6/8 (75.0%)"),
                           (f"{worker} td.aff-saved", "800")):
            browser.wait(lambda css=css, shown=shown: browser.text(css) == shown,
                         f"{css} show {shown}")
        r.zrem(KEYS.workers, "w1")
        # requests flow: two more arrive, then a worker takes three and answers them dead
        client.enqueue("prompt 3", model="m", id="r3", max_attempts=1)
        client.enqueue("prompt 4", model="m", id="r4", max_attempts=1)
        browser.wait(lambda: browser.text(PENDING) == "5", "5 pending")
        kill_by_worker(scripts, 3)
        browser.wait(lambda: browser.text(PENDING) == "2", "2 pending")
        browser.wait(lambda: len(browser.find_all(LETTERS)) == 3, "3 dead letters")
        assert browser.text(f'{LETTERS}[data-id="r1"] td.err') == "model_error"
        browser.click(f'{LETTERS}[data-id="r1"] button.requeue')
        browser.wait(lambda: len(browser.find_all(LETTERS)) == 2, "the set shrink to 2")
        assert r.zscore(KEYS.dead, "r1") is None and r.zscore(KEYS.pending, "r1") is not None
        browser.wait(lambda: browser.text(PENDING) == "3", "the requeued request pending")
        browser.click(f'{LETTERS}[data-id="r0"] button.purge')
        browser.wait(lambda: len(browser.find_all(LETTERS)) == 1, "the set shrink to 1")
        assert r.zcard(KEYS.dead) == 1
