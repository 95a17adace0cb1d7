"""The engine process' outbox: every step output leaves as soon as it exists, whatever events
went out before it (the regression: an event sent with the step loop disarmed left later
outputs waiting for the next event, often the end of a generation), and events keep their
order behind the outputs that came before them; written by the thread that has them while the
pipe has room (no thread woken per step), by the sender thread when it has not, and never
waited for by the step thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from inferq.worker.generate import wire
from inferq.worker.generate.engine_core import Outbox
from inferq.worker.generate.steploop import StepOutput

TIMEOUT_S = 30.0


class FakeSteps:
    """``StepLoop``'s output contract: ``take_outputs(arm=True)`` that finds nothing asks to be
    told (``outputs_ready``) at the next output; any take clears that."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outputs: list[StepOutput] = []
        self.armed = False
        self.outbox: Outbox | None = None
        self.step = 0

    def take_outputs(self, *, arm: bool) -> list[StepOutput]:
        with self.lock:
            out, self.outputs = self.outputs, []
            self.armed = arm and not out
            return out

    def produce(self) -> int:
        with self.lock:
            self.step += 1
            self.outputs.append(StepOutput([], [], 0, 0, 0.001, step=self.step))
            notify, self.armed = self.armed, False
        if notify:
            assert self.outbox is not None
            self.outbox.outputs_ready()
        return self.step


class FakeConn:
    """A pipe end that records each message and the thread that wrote it; ``room`` is
    whether it takes a write without blocking, ``gate`` holds writes while cleared."""

    def __init__(self, *, room: bool = True) -> None:
        self.sent: list[wire.ToWorker] = []
        self.writers: list[str] = []
        self.cond = threading.Condition()
        self.room = room
        self.gate = threading.Event()
        self.gate.set()

    def send_bytes(self, data: bytes) -> None:
        assert self.gate.wait(TIMEOUT_S)
        with self.cond:
            self.sent.append(wire.decode_to_worker(data))
            self.writers.append(threading.current_thread().name)
            self.cond.notify_all()

    def wait_for(self, predicate: Any) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self.sent), TIMEOUT_S), self.sent

    def steps_sent(self) -> list[int]:
        with self.cond:
            return [r.step for m in self.sent if isinstance(m, wire.Steps) for r in m.steps]


def state() -> wire.EngineState:
    return wire.EngineState(running=1, due=0, max_slots=4, step=0)


def start(*, room: bool = True) -> tuple[FakeSteps, FakeConn, Outbox, threading.Thread]:
    steps, conn = FakeSteps(), FakeConn(room=room)
    outbox = Outbox(conn, steps, state, writable=lambda: conn.room)  # type: ignore[arg-type]
    steps.outbox = outbox
    sender = threading.Thread(target=outbox.run, name="sender", daemon=True)
    sender.start()
    return steps, conn, outbox, sender


ROOM = pytest.mark.parametrize("room", [True, False], ids=["pipe-has-room", "pipe-full"])


@ROOM
def test_outputs_keep_leaving_one_step_at_a_time_after_events(room: bool) -> None:
    steps, conn, outbox, sender = start(room=room)
    outbox.put(wire.Ready(wire.BudgetSpec(4, 1024, 512), 0.1))
    for round_ in range(3):
        # A step's output leaves before the next step exists...
        n = steps.produce()
        conn.wait_for(lambda sent, n=n: n in [r.step for m in sent
                                              if isinstance(m, wire.Steps) for r in m.steps])
        # ...then an event (a cancellation applied; capacity), taken without arming...
        outbox.put(wire.Cancelled([f"a{round_}"], 0))
        outbox.put(wire.Capacity(state()))
        # ...and the outputs of the steps after it still leave one at a time.
        for _ in range(3):
            n = steps.produce()
            conn.wait_for(lambda sent, n=n: n in [r.step for m in sent
                                                  if isinstance(m, wire.Steps)
                                                  for r in m.steps])
    assert conn.steps_sent() == list(range(1, steps.step + 1))
    outbox.close(wire.Stopped([]))
    sender.join(TIMEOUT_S)
    assert not sender.is_alive() and isinstance(conn.sent[-1], wire.Stopped)


@ROOM
def test_an_event_goes_out_after_the_step_outputs_taken_before_it(room: bool) -> None:
    steps, conn, outbox, sender = start(room=room)
    with steps.lock:  # two steps queue up without waking anyone (the sender is not armed yet)
        steps.outputs += [StepOutput([], [], 0, 0, 0.0, step=1), StepOutput([], [], 0, 0, 0.0,
                                                                             step=2)]
        steps.step = 2
    outbox.put(wire.Cancelled(["x"], 1))
    steps.produce()
    outbox.close(wire.Stopped(["w"]))
    sender.join(TIMEOUT_S)
    kinds = [(type(m).__name__, [r.step for r in m.steps] if isinstance(m, wire.Steps) else None)
             for m in conn.sent]
    assert kinds[0] == ("Steps", [1, 2])
    assert kinds[1] == ("Cancelled", None)
    assert [s for k, s in kinds[2:] if k == "Steps"] == [[3]]
    assert kinds[-1] == ("Stopped", None)


def test_while_the_pipe_has_room_the_step_thread_writes_its_output_itself() -> None:
    steps, conn, outbox, sender = start()
    outbox.put(wire.Ready(wire.BudgetSpec(4, 1024, 512), 0.1))  # arms the step loop
    for _ in range(5):
        n = steps.produce()
        # Written before produce() returned, by the thread that produced it: nobody woken.
        assert conn.steps_sent()[-1] == n
    assert set(conn.writers) == {threading.current_thread().name}
    outbox.close(wire.Stopped([]))
    sender.join(TIMEOUT_S)
    assert conn.writers[-1] == "sender"


def test_the_step_thread_never_waits_for_a_blocked_pipe_and_the_order_holds() -> None:
    steps, conn, outbox, sender = start(room=False)
    conn.gate.clear()  # the worker reads nothing: the sender's write blocks
    outbox.put(wire.Ready(wire.BudgetSpec(4, 1024, 512), 0.1))
    done = threading.Event()

    def step_thread() -> None:
        for _ in range(20):
            steps.produce()
        outbox.put(wire.Capacity(state()))
        done.set()

    threading.Thread(target=step_thread, daemon=True).start()
    assert done.wait(TIMEOUT_S)  # ended while the pipe was blocked
    conn.room = True  # room again: the sender still writes first what queued behind it
    conn.gate.set()
    steps.produce()
    conn.wait_for(lambda sent: 21 in [r.step for m in sent if isinstance(m, wire.Steps)
                                      for r in m.steps])
    assert conn.steps_sent() == list(range(1, 22))
    kinds = [type(m).__name__ for m in conn.sent]
    capacity = kinds.index("Capacity")
    assert kinds[0] == "Ready"
    assert [r.step for m in conn.sent[:capacity] if isinstance(m, wire.Steps)
            for r in m.steps] == list(range(1, 21))
    outbox.close(wire.Stopped([]))
    sender.join(TIMEOUT_S)
    assert not sender.is_alive()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def paced(gap_s: float) -> tuple[FakeSteps, FakeConn, Outbox, Clock]:
    steps, conn, clock = FakeSteps(), FakeConn(), Clock()
    outbox = Outbox(conn, steps, state, gap_s=gap_s,  # type: ignore[arg-type]
                    writable=lambda: True, clock=clock)
    steps.outbox = outbox
    return steps, conn, outbox, clock


def steps_messages(conn: FakeConn) -> list[list[int]]:
    return [[r.step for r in m.steps] for m in conn.sent if isinstance(m, wire.Steps)]


def test_step_outputs_leave_at_most_once_per_gap_merged_and_the_first_after_it_takes_them(
        ) -> None:
    steps, conn, outbox, clock = paced(0.025)
    outbox.put(wire.Ready(wire.BudgetSpec(4, 1024, 512), 0.1))
    steps.produce()  # the gap since the last write (Ready, at once) is not over
    assert steps_messages(conn) == []
    clock.now += 0.010
    steps.produce()
    assert steps_messages(conn) == []
    clock.now += 0.020  # over: the next output writes every one gathered, as one message
    steps.produce()
    assert steps_messages(conn) == [[1, 2, 3]]
    clock.now += 0.030  # after a quiet while, an output leaves at once
    steps.produce()
    assert steps_messages(conn) == [[1, 2, 3], [4]]


@pytest.mark.parametrize(("message", "at_once"), [
    (wire.Cancelled(["x"], 0), True),
    (wire.Failed("model_error", "boom", True, ["x"]), True),
    (wire.Withdrawn(3, ["x"]), True),
    # as many free slots as the last state written (state(): 4 - 1 + 0): it waits
    (wire.Capacity(wire.EngineState(running=1, due=0, max_slots=4, step=0)), False),
    # a sequence due in the step in flight frees a slot: at once
    (wire.Capacity(wire.EngineState(running=1, due=1, max_slots=4, step=0)), True),
    # the engine is idle: at once
    (wire.Capacity(wire.EngineState(running=0, due=0, max_slots=4, step=0)), True),
], ids=["cancelled", "failed", "withdrawn", "capacity-same", "capacity-frees", "idle"])
def test_what_answers_frees_or_ends_goes_at_once_with_the_outputs_before_it(
        message: wire.ToWorker, at_once: bool) -> None:
    steps, conn, outbox, clock = paced(0.025)
    outbox.put(wire.Ready(wire.BudgetSpec(4, 1024, 512), 0.1))
    clock.now += 0.030
    steps.produce()  # written at once: the state it carries says 3 slots free
    steps.produce()  # within the gap: gathered
    outbox.put(message)
    sent = [type(m) for m in conn.sent]
    if at_once:
        assert steps_messages(conn) == [[1], [2]] and sent[-1] is type(message)
    else:
        assert steps_messages(conn) == [[1]] and type(message) not in sent
        clock.now += 0.030
        steps.produce()
        assert steps_messages(conn) == [[1], [2], [3]]
        assert [type(m) for m in conn.sent][-2:] == [type(message), wire.Steps]


@pytest.mark.parametrize("starts", [True, False], ids=["admitted", "finished"])
def test_a_step_that_admitted_or_finished_sequences_leaves_at_once(starts: bool) -> None:
    steps, conn, outbox, _ = paced(0.025)
    outbox.put(wire.Ready(wire.BudgetSpec(4, 1024, 512), 0.1))
    steps.produce()  # within the gap: gathered
    gen = Gen("g")
    with steps.lock:
        steps.step += 1
        steps.outputs.append(StepOutput(  # type: ignore[list-item]
            [], [] if starts else [gen], 1, 5, 0.001, step=steps.step,
            entered=[gen] if starts else []))
        notify, steps.armed = steps.armed, False
    assert notify
    outbox.outputs_ready()
    assert steps_messages(conn) == [[1, 2]]
    last = conn.sent[-1].steps[-1]  # type: ignore[union-attr]
    assert (last.admitted, [f.id for f in last.finished]) == ((["g"], []) if starts
                                                              else ([], ["g"]))


class Gen:
    def __init__(self, id: str) -> None:
        self.id = id
        self.finish = None
        self.detok = self
        self.text = "done"
        self.logprob_output = None
