"""A request's cost (its token estimate, counted at enqueue) and the weights of tenants
(fair shares: ``fair``).

Estimated without a tokenizer, so the producer needs none: a token is taken as 4 bytes of
UTF-8 text (``BYTES_PER_TOKEN``; close for English with BPE tokenizers, generous for code and
CJK, whose tokens cover fewer bytes); ``estimate_tokens`` is that estimate, the one fair
shares, the gateway's limits and the gateway's estimated ``usage`` all count with.
``embed``/``score``: the prompt's tokens; ``generate``: prompt + ``max_new_tokens`` (what the
request may make the device do); any other (custom) task: 1, or the ``cost`` the producer
gives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from inferq.errors import ValidationError
from inferq.protocol.generation import GenerationParams

#: The flow of requests that name no tenant.
DEFAULT_TENANT = ""
DEFAULT_WEIGHT = 1
MAX_WEIGHT = 1_000_000
#: Largest cost of one request (2**30 tokens).
MAX_COST = 1 << 30
BYTES_PER_TOKEN = 4
#: ``max_new_tokens`` of a generation that gives none.
DEFAULT_MAX_NEW_TOKENS: int = GenerationParams.model_fields["max_new_tokens"].default
#: When a band's pending set is empty and its virtual clock has passed this, the clock
#: restarts at 0 (a new epoch): tags stay far below the top of the band (``scores.VT_LIMIT``).
RESET_AT = 1 << 29
TEXT_TASKS = frozenset({"embed", "score"})
#: Tasks whose cost is estimated from their text: a producer's ``cost`` is refused for them.
ESTIMATED_TASKS = TEXT_TASKS | {"generate"}


def check_weight(weight: object, what: str = "weight") -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or not (
            1 <= weight <= MAX_WEIGHT):
        raise ValidationError(f"{what} must be an integer in 1..{MAX_WEIGHT}, got {weight!r}")
    return weight


def estimate_tokens(text_bytes: int) -> int:
    """The tokens of ``text_bytes`` bytes of UTF-8 text, at least one."""
    return max(1, math.ceil(text_bytes / BYTES_PER_TOKEN))


def estimate(task: str, text_bytes: int, params: Mapping[str, Any], cost: int | None) -> int:
    """The cost charged to the request's tenant (see the module docstring)."""
    tokens = estimate_tokens(text_bytes)
    if task in TEXT_TASKS:
        value = tokens
    elif task == "generate":
        value = tokens + int(params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
    else:
        value = 1 if cost is None else cost
    return min(value, MAX_COST)
