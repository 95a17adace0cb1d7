"""A handle on one queued request: what ``Handle`` (sync) and ``AsyncHandle`` share.

Everything a handle asks Redis is a plan (``inferq.plans``) written once here: its result
(sliced blocking reads of the result key), its stored result, its state, its bookkeeping
(``RequestInfo``) and its cancellation. ``Handle`` runs these plans with the sync driver and
``AsyncHandle`` with the async one; results of requests the client enqueued itself arrive
through its reply inbox instead (``producer.inbox``).
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from inferq.connection import ConnectionSettings
from inferq.errors import ResultTimeout
from inferq.plans import Direct, Do, Plan, call
from inferq.producer import waits
from inferq.producer.info import CancelOutcome, RequestInfo, as_info
from inferq.producer.options import ClientOptions
from inferq.producer.replies import RequestState, parse_result, raise_for_status, state_of
from inferq.protocol import ops
from inferq.protocol.codec import Result
from inferq.protocol.fields import Field
from inferq.protocol.keys import QueueKeys


class AnyClient(Protocol):
    """What a handle needs of its client (``Client`` or ``AsyncClient``)."""

    options: ClientOptions
    connection: ConnectionSettings
    scripts: dict[str, Any]


C = TypeVar("C", bound=AnyClient)


class HandleBase(Generic[C]):
    def __init__(self, client: C, keys: QueueKeys, request_id: str, outcome: str, *,
                 via_inbox: bool = False) -> None:
        self._client = client
        self.keys = keys
        self.id = request_id
        #: What enqueue found: ``queued``, or ``pending``/``inflight``/``done`` for a repeated id.
        self.outcome = outcome
        # Requests this client enqueued announce their result in its inbox (one listener
        # for all waiters); a handle made from a bare id, or for a duplicate id enqueued by
        # someone else, blocks on the result key.
        self._via_inbox = via_inbox and outcome == "queued"
        #: Under admission by prediction: the ms to its result (first token) predicted at
        #: enqueue, for a request with an objective (``inferq.protocol.slo``).
        self.predicted_ms: int | None = None

    @property
    def duplicate(self) -> bool:
        return self.outcome != "queued"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(id={self.id!r}, queue={self.keys.queue!r}, "
                f"outcome={self.outcome!r})")

    # ------------------------------------------------------------------ plans, run by each

    def _wait(self, timeout: float | None) -> Plan[Any]:
        """The raw result from its key, blocking in slices (``waits``), or None."""
        key = self.keys.result(self.id)
        for block in waits.slices(timeout, self._client.connection.socket_timeout):
            raw = yield Direct(call("blmove", key, key, block, "LEFT", "LEFT"))
            if raw is not None:
                return raw
        return None

    @staticmethod
    def _checked(timeout: float | None) -> float | None:
        if timeout is not None:
            waits.block_timeout(timeout)  # validates
        return timeout

    def _outcome(self, raw: Any, timeout: float | None) -> Result:
        result = parse_result(raw, self._client.options)
        if result is None:
            raise ResultTimeout(f"no result for request {self.id} within {timeout} s")
        return raise_for_status(result)

    def _peek(self) -> Plan[Result | None]:
        raw = yield Direct(call("lindex", self.keys.result(self.id), 0))
        return parse_result(raw, self._client.options)

    def _status(self) -> Plan[RequestState]:
        state, raw = yield [call("hget", self.keys.request(self.id), Field.STATE),
                            call("lindex", self.keys.result(self.id), 0)]
        return state_of(state, raw, self._client.options)

    def _info(self) -> Plan[RequestInfo]:
        replies = yield [call("hmget", self.keys.request(self.id), *RequestInfo.FIELDS),
                         call("lindex", self.keys.result(self.id), 0)]
        return as_info(self.id, replies, self._client.options)

    def _cancel(self) -> Plan[CancelOutcome]:
        keys, args = ops.cancel_call(self.keys, self.id,
                                     int(self._client.options.result_ttl_s * 1000))
        script = self._client.scripts["cancel"]
        return CancelOutcome.parse((yield Do(lambda: script(keys=keys, args=args))))
