"""``scheduler.plan``: admissions in priority order, and the running sequences pushed out for a
strictly higher priority that has no room (pure code, no model)."""

from __future__ import annotations

from dataclasses import dataclass

from inferq.worker.generate.scheduler import Budget, Plan, plan


@dataclass(eq=False)
class Seq:
    name: str
    priority: int
    order: int = 0
    prefill_tokens: int = 8
    reserve_tokens: int = 64
    preemptions: int = 0
    entered: int = 0
    due: bool = False

    def __repr__(self) -> str:
        return self.name


def fp(rows: int, longest: int) -> int:
    """A cache of exactly rows x the longest reservation (the real one rounds both up)."""
    return rows * longest


SLOTS = Budget(max_slots=2, kv_tokens=1 << 20, max_prefill_tokens=4096)


def names(p: Plan[Seq, Seq]) -> tuple[list[str], list[str]]:
    return [s.name for s in p.admitted], [s.name for s in p.preempted]


def test_a_higher_priority_waiting_request_pushes_out_the_lowest_running_one() -> None:
    running = [Seq("low", -10, entered=1), Seq("mid", 0, entered=1)]
    assert names(plan([Seq("urgent", 50)], running, SLOTS, fp, max_preemptions=4)) == (
        ["urgent"], ["low"])


def test_among_equal_priorities_the_latest_admitted_goes_first() -> None:
    running = [Seq("early", 0, order=1, entered=3), Seq("late", 0, order=0, entered=9)]
    assert names(plan([Seq("urgent", 1)], running, SLOTS, fp, max_preemptions=4)) == (
        ["urgent"], ["late"])
    same_step = [Seq("first", 0, order=1, entered=3), Seq("second", 0, order=2, entered=3)]
    assert names(plan([Seq("urgent", 1)], same_step, SLOTS, fp, max_preemptions=4)) == (
        ["urgent"], ["second"])


def test_only_a_strictly_higher_priority_preempts() -> None:
    running = [Seq("a", 5), Seq("b", 5)]
    assert names(plan([Seq("same", 5), Seq("lower", 1)], running, SLOTS, fp,
                      max_preemptions=4)) == ([], [])


def test_several_urgent_requests_preempt_as_many_as_they_need_and_no_more() -> None:
    running = [Seq("l1", -10, entered=1), Seq("l2", -10, entered=2), Seq("h", 60)]
    budget = Budget(max_slots=3, kv_tokens=1 << 20, max_prefill_tokens=4096)
    waiting = [Seq("u1", 50, order=1), Seq("u2", 50, order=2), Seq("u3", 50, order=3)]
    # Two lower-priority sequences can make room for two of the three; the one at 60 stays.
    assert names(plan(waiting, running, budget, fp, max_preemptions=4)) == (
        ["u1", "u2"], ["l2", "l1"])


def test_a_sequence_preempted_max_preemptions_times_keeps_its_slot() -> None:
    running = [Seq("tired", -10, preemptions=2), Seq("fresh", -5)]
    assert names(plan([Seq("urgent", 50)], running, SLOTS, fp, max_preemptions=2)) == (
        ["urgent"], ["fresh"])
    running = [Seq("tired", -10, preemptions=2), Seq("tired2", -5, preemptions=2)]
    assert names(plan([Seq("urgent", 50)], running, SLOTS, fp, max_preemptions=2)) == ([], [])


def test_max_preemptions_zero_is_plain_admission() -> None:
    running = [Seq("low", -10), Seq("mid", 0)]
    assert names(plan([Seq("urgent", 50)], running, SLOTS, fp, max_preemptions=0)) == ([], [])


def test_a_slot_that_frees_at_the_end_of_this_step_is_waited_for() -> None:
    running = [Seq("low", -10), Seq("finishing", 0, due=True)]
    assert names(plan([Seq("urgent", 50)], running, SLOTS, fp, max_preemptions=4)) == ([], [])


def test_kv_budget_preemption_removes_just_enough_and_never_in_vain() -> None:
    # Room for 2 rows of 64 tokens; the urgent request needs 64 and there are two running.
    budget = Budget(max_slots=8, kv_tokens=fp(2, 64), max_prefill_tokens=4096)
    running = [Seq("low", -10, entered=1), Seq("mid", 0, entered=2)]
    assert names(plan([Seq("urgent", 50)], running, budget, fp, max_preemptions=4)) == (
        ["urgent"], ["low"])
    # A request that would not fit even with every lower priority gone preempts nothing.
    huge = Seq("huge", 50, reserve_tokens=10_000)
    assert names(plan([huge], running, budget, fp, max_preemptions=4)) == ([], [])


def test_the_prefill_budget_delays_but_never_preempts() -> None:
    budget = Budget(max_slots=4, kv_tokens=1 << 20, max_prefill_tokens=10)
    running = [Seq("low", -10)]
    waiting = [Seq("u1", 50, order=1, prefill_tokens=8), Seq("u2", 50, order=2, prefill_tokens=8)]
    assert names(plan(waiting, running, budget, fp, max_preemptions=4)) == (["u1"], [])


def test_without_waiting_requests_or_running_ones_nothing_happens() -> None:
    assert names(plan([], [Seq("a", 0)], SLOTS, fp, max_preemptions=4)) == ([], [])
    assert names(plan([Seq("a", 0)], [], SLOTS, fp, max_preemptions=4)) == (["a"], [])
