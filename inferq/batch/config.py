"""The settings of the batch machinery (taken from ``GatewaySettings``)."""

from __future__ import annotations

from dataclasses import dataclass

from inferq.errors import ConfigError
from inferq.protocol.codec import DEFAULT_LIMITS
from inferq.protocol.scores import PRIORITY_MAX, PRIORITY_MIN

MB = 1 << 20
#: The default longest line of a batch input: a prompt at the SDK's limit written as JSON
#: (``json.dumps`` escapes non-ASCII text as ``\uXXXX``: up to 3 times its UTF-8 bytes), its
#: parameters at their limit, and the envelope. A longer line could only be refused when
#: queued, so it is refused at create, and read in memory bounded by this.
MAX_LINE_BYTES = 3 * DEFAULT_LIMITS.max_prompt_bytes + DEFAULT_LIMITS.max_params_bytes + 4096


@dataclass(frozen=True, slots=True)
class BatchConfig:
    #: The priority of batch lines unless a batch's ``metadata.priority`` says otherwise:
    #: well below the default 0 of online requests, so those are always claimed first.
    priority: int = -50
    lease_s: float = 15.0
    #: Lines read, queued or drained per step.
    chunk: int = 256
    #: The most lines of one batch waiting in the queue at once (see ``feed``).
    max_outstanding: int = 4096
    min_outstanding: int = 64
    #: How long a runner waits (blocking on Redis) when it has nothing to do.
    idle_s: float = 1.0
    #: OpenAI's limits: 512 MB per file, 200 MB and 50,000 lines per batch input.
    max_file_bytes: int = 512 * MB
    max_batch_bytes: int = 200 * MB
    max_batch_lines: int = 50_000
    #: The longest line of a batch input (bytes, its newline not counted).
    max_line_bytes: int = MAX_LINE_BYTES

    def __post_init__(self) -> None:
        if not PRIORITY_MIN <= self.priority <= PRIORITY_MAX:
            raise ConfigError(f"batch priority must be in [{PRIORITY_MIN}, {PRIORITY_MAX}], "
                              f"got {self.priority}")
        if self.lease_s <= 0 or self.idle_s <= 0 or self.chunk < 1:
            raise ConfigError(f"batch lease_s, idle_s must be > 0 and chunk >= 1, got "
                              f"{self.lease_s}, {self.idle_s}, {self.chunk}")
        if self.max_line_bytes < 1:
            raise ConfigError(f"batch max_line_bytes must be >= 1, got {self.max_line_bytes}")
        if not 1 <= self.min_outstanding <= self.max_outstanding:
            raise ConfigError(f"need 1 <= min_outstanding <= max_outstanding, got "
                              f"{self.min_outstanding}, {self.max_outstanding}")
