"""Is anyone serving this queue? The producer's early warning for a model or task that no
worker serves (a typo, a worker not started yet), instead of a silent wait.

After an enqueue, the clients check the queue's live workers (the ``workers`` sorted set,
scored by liveness deadlines that the heartbeat renews, on Redis's clock) and warn with a
``NoWorkerWarning`` (``warnings``) when there is none. The request stays queued: durable
queues may wait for workers that start later, and it is served as soon as one does. The same
round trip adds the queue to the set of requested queues (``requested_registry``), so
``inferq stats`` lists queues that have requests and no worker. One check per queue every
``CHECK_EVERY_S`` at most: one pipelined round trip (TIME, ZRANGE, SADD), not one per
enqueue.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from types import FrameType

from inferq import plans
from inferq.plans import Plan, call
from inferq.protocol.keys import QueueKeys, requested_registry

CHECK_EVERY_S = 5.0
#: The SDK's files (this package, the plans' drivers): a warning names the first caller
#: outside them, whatever the path through them (sync or async, traced or not).
_SDK_FILES = (str(Path(__file__).parent) + "/", plans.__file__)


class NoWorkerWarning(UserWarning):
    """No live worker serves the queue a request was just added to; it waits there until one
    starts (see ``inferq.producer.presence``)."""


class WorkerPresence:
    """Per-client cache of "does this queue have a live worker", refreshed at most every
    ``every_s`` seconds per queue."""

    def __init__(self, namespace: str, every_s: float = CHECK_EVERY_S, *,
                 warn: bool = True) -> None:
        self.namespace = namespace
        self.every_s = every_s
        #: False: check and register, but do not warn (the gateway answers 404 instead).
        self.warn = warn
        self._checked: dict[str, float] = {}

    def due(self, queues: Iterable[QueueKeys]) -> list[QueueKeys]:
        now = time.monotonic()
        out = []
        for keys in queues:
            if now - self._checked.get(keys.queue, -1e18) >= self.every_s:
                self._checked[keys.queue] = now
                out.append(keys)
        return out

    def check(self, due: list[QueueKeys]) -> Plan[list[str]]:
        """The check and registration of queues (``due`` ones) in one round trip (TIME, and
        per queue ZRANGE of its workers and SADD to the requested registry): the queues
        without a live worker (``warn_about`` them)."""
        # TIME as a raw command: redis-py's cluster pipelines refuse their ``time()`` method.
        commands = [call("execute_command", "TIME")]
        for keys in due:
            # Workers register on shard 0 of a queue, whatever shard this request went to.
            commands.append(call("zrange", keys.for_shard(0).workers, -1, -1, withscores=True))
            commands.append(call("sadd", requested_registry(self.namespace), keys.queue))
        replies = yield commands
        seconds, micros = replies[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        return [keys.queue for i, keys in enumerate(due)
                if not (top := replies[1 + 2 * i]) or float(top[0][1]) < now_ms]

    def warn_about(self, idle: Iterable[str]) -> None:
        """A ``NoWorkerWarning`` per queue (unless ``warn`` is off), naming the line that
        called the client."""
        if self.warn:
            for queue in idle:
                warnings.warn(no_worker_message(queue), NoWorkerWarning,
                              stacklevel=_outside_sdk())


def _outside_sdk() -> int:
    """The ``stacklevel`` of ``warn_about``'s ``warnings.warn`` that names the first frame
    outside the SDK."""
    level = 1  # warn_about's own frame
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_SDK_FILES):
        frame, level = frame.f_back, level + 1
    return level


def no_worker_message(queue: str) -> str:
    task, _, model = queue.partition(":")
    return (f"no live worker serves queue {queue}: the request stays queued and runs once a "
            f"worker starts (inferq worker --task {task} --model {model.partition('#')[0]})")
