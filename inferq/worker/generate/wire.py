"""The messages between a ``generate`` worker and its engine process, one frozen type per kind.

Each message is a ``msgspec`` struct encoded as a msgpack array whose first element is its
``Kind`` (as vLLM's ``EngineCoreRequest``/``EngineCoreOutputs`` are): compact, and decoded by
position, but checked: a message whose fields do not match its type (one side added a field,
the other did not) fails to decode with ``msgspec.ValidationError`` instead of being read
shifted. Each side decodes only the kinds it may receive (``ToEngine``, ``ToWorker``) and
dispatches them through a table keyed by type.

At the spawn: ``EngineSpec`` (the model the engine process loads, and its settings).

worker -> engine: ``Submit`` (generations to run, with the tokens a previous attempt streamed),
``Cancel``, ``Withdraw`` (waiting generations taken back) and ``Stop`` (drain).

engine -> worker: ``Ready`` (the budget sized after the weights loaded), ``Steps`` (every step
output not sent yet: per step, the sequences admitted, preempted, advanced and finished),
``Capacity``, ``Cancelled``, ``Failed``, ``OutOfMemory``, ``Withdrawn`` and ``Stopped``. Every
message that changes the engine's occupancy carries its ``EngineState``.

Preemption and resumption travel inside ``StepRecord``: a sequence in ``preempted`` left the
batch at that step's boundary (it keeps its tokens and waits in the engine); when it appears in
``admitted`` again it was resumed (its prompt and tokens prefilled again).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from inferq.worker.generate.settings import GenerationSettings


class Kind(enum.IntEnum):
    SUBMIT = 1
    CANCEL = 2
    WITHDRAW = 3
    STOP = 4
    READY = 10
    STEPS = 11
    CAPACITY = 12
    CANCELLED = 13
    FAILED = 14
    OUT_OF_MEMORY = 15
    WITHDRAWN = 16
    STOPPED = 17


class _Part(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """A value nested in a message (no tag of its own)."""


class _Message(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True,
               tag_field="kind"):
    """A message: its ``Kind`` travels as the array's first element."""


# ----------------------------------------------------------------------- at the spawn


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the engine process loads: the model (as ``CausalLM`` takes it), and the settings
    it sizes its budget from once the weights are loaded."""

    path: str
    device: str
    #: As asked for (``auto``, ``float32``...): resolved here, after the device is in use.
    dtype: str
    model_id: str
    settings: GenerationSettings
    torch_threads: int
    log_level: int
    #: ``transformers`` (``Engine``) or ``vllm`` (``vllm.engine.VllmEngine``), and the vLLM
    #: ``EngineArgs`` given with ``--vllm-option``.
    engine: str = "transformers"
    vllm_options: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------- parts of messages


class GenerationSpec(_Part, frozen=True):
    """A generation as the engine builds it (``Engine.new_generation``)."""

    id: str
    prompt_ids: list[int]
    params: dict[str, Any]
    priority: int
    order: int
    alone: bool
    #: Tokens a previous attempt put in the request's stream, and the text they showed.
    streamed: list[int]
    shown: str
    #: ``Generation.trace_headers``.
    trace_headers: dict[str, str] | None
    #: ``Generation.identities`` (cache affinity).
    identities: list[str] = msgspec.field(default_factory=list)


class BudgetSpec(_Part, frozen=True):
    max_slots: int
    kv_tokens: int
    max_prefill_tokens: int


class EngineState(_Part, frozen=True):
    """The engine's occupancy as of the message that carries it."""

    running: int
    #: Running sequences that reach ``max_new_tokens`` in the step in flight.
    due: int
    #: Slots now (fewer than the budget's after an out-of-memory error).
    max_slots: int
    #: The engine's step count (steps completed).
    step: int
    device_allocated: int = 0
    device_reserved: int = 0
    #: vLLM's KV cache usage (0..1) and the requests it preempted itself, since it started
    #: (``--engine vllm``; 0 with the transformers engine).
    kv_usage: float = 0.0
    engine_preemptions: int = 0
    #: The prefix cache (``prefixcache``): prompt tokens admitted and those taken from it,
    #: since the engine started; and the identities it holds, when they changed since the
    #: last state sent (None: unchanged).
    prefix_prompt_tokens: int = 0
    prefix_reused_tokens: int = 0
    held: list[str] | None = None


class Advanced(_Part, frozen=True):
    id: str
    token: int
    #: The text this token made visible (maybe '').
    text: str


class Finished(_Part, frozen=True):
    id: str
    finish: str
    #: The generation's whole text.
    text: str
    #: With ``logprobs``: per token, its log-probability and top alternatives
    #: (``Engine.logprob_output``).
    logprobs: list[dict[str, Any]] | None = None


class StepRecord(_Part, frozen=True):
    #: The engine's step number (1 for its first step).
    step: int
    #: When the step ended, on the engine's clock (``time.monotonic``, shared by the processes).
    at: float
    elapsed_s: float
    admitted: list[str]
    prefill_tokens: int
    preempted: list[str]
    advanced: list[Advanced]
    finished: list[Finished]


# ------------------------------------------------------------------ worker -> engine


class Submit(_Message, frozen=True, tag=int(Kind.SUBMIT)):
    generations: list[GenerationSpec]


class Cancel(_Message, frozen=True, tag=int(Kind.CANCEL)):
    ids: list[str]


class Withdraw(_Message, frozen=True, tag=int(Kind.WITHDRAW)):
    seq: int
    ids: list[str]


class Stop(_Message, frozen=True, tag=int(Kind.STOP)):
    pass


# ------------------------------------------------------------------ engine -> worker


class Ready(_Message, frozen=True, tag=int(Kind.READY)):
    budget: BudgetSpec
    load_s: float


class Steps(_Message, frozen=True, tag=int(Kind.STEPS)):
    steps: list[StepRecord]
    state: EngineState


class Capacity(_Message, frozen=True, tag=int(Kind.CAPACITY)):
    state: EngineState


class Cancelled(_Message, frozen=True, tag=int(Kind.CANCELLED)):
    ids: list[str]
    #: Steps the engine finished between the cancellation's arrival and its effect.
    lag_steps: int


class Failed(_Message, frozen=True, tag=int(Kind.FAILED)):
    code: str
    message: str
    retryable: bool
    ids: list[str]


class OutOfMemory(_Message, frozen=True, tag=int(Kind.OUT_OF_MEMORY)):
    sequences: int


class Withdrawn(_Message, frozen=True, tag=int(Kind.WITHDRAWN)):
    seq: int
    ids: list[str]


class Stopped(_Message, frozen=True, tag=int(Kind.STOPPED)):
    #: Generations still waiting when the engine stopped (never admitted).
    waiting: list[str]


ToEngine = Submit | Cancel | Withdraw | Stop
ToWorker = Ready | Steps | Capacity | Cancelled | Failed | OutOfMemory | Withdrawn | Stopped

#: Every message type by kind (a test checks that each kind has exactly one).
MESSAGES: dict[Kind, type[_Message]] = {
    Kind(cls.__struct_config__.tag): cls
    for cls in (*ToEngine.__args__, *ToWorker.__args__)
}

_encoder = msgspec.msgpack.Encoder()
_to_engine = msgspec.msgpack.Decoder(ToEngine)
_to_worker = msgspec.msgpack.Decoder(ToWorker)


def encode(message: _Message) -> bytes:
    return _encoder.encode(message)


def decode_to_engine(data: bytes) -> ToEngine:
    message: ToEngine = _to_engine.decode(data)
    return message


def decode_to_worker(data: bytes) -> ToWorker:
    message: ToWorker = _to_worker.decode(data)
    return message
