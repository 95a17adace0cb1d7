"""The engine process' outbox: every step output leaves as soon as it exists, whatever events
went out before it (the regression: an event sent with the step loop disarmed left later
outputs waiting for the next event, often the end of a generation), and events keep their
order behind the outputs that came before them."""

from __future__ import annotations

import threading
from typing import Any

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
    def __init__(self) -> None:
        self.sent: list[wire.ToWorker] = []
        self.cond = threading.Condition()

    def send_bytes(self, data: bytes) -> None:
        with self.cond:
            self.sent.append(wire.decode_to_worker(data))
            self.cond.notify_all()

    def wait_for(self, predicate: Any) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self.sent), TIMEOUT_S), self.sent

    def steps_sent(self) -> list[int]:
        with self.cond:
            return [r.step for m in self.sent if isinstance(m, wire.Steps) for r in m.steps]


def state() -> wire.EngineState:
    return wire.EngineState(running=1, due=0, max_slots=4, step=0)


def start() -> tuple[FakeSteps, FakeConn, Outbox, threading.Thread]:
    steps, conn = FakeSteps(), FakeConn()
    outbox = Outbox(conn, steps, state)  # type: ignore[arg-type]
    steps.outbox = outbox
    sender = threading.Thread(target=outbox.run, daemon=True)
    sender.start()
    return steps, conn, outbox, sender


def test_outputs_keep_leaving_one_step_at_a_time_after_events() -> None:
    steps, conn, outbox, sender = start()
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


def test_an_event_goes_out_after_the_step_outputs_taken_before_it() -> None:
    steps, conn, outbox, sender = start()
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
