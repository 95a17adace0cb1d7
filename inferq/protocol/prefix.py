"""The prefix identity of a ``generate`` request, computed at enqueue without a tokenizer.

A claim may prefer the requests whose prefix a worker's engine already holds in its cache
(cache affinity: ``lua/includes/affinity.lua``). For that every generate request carries a
*hash chain* of its natural prefixes, cheap to compute on the producer side:

* chat (``messages``): cumulative hashes over the messages, ``h1 = H(m1)``,
  ``h2 = H(h1, m2)``, ...: the system prompt, then each turn, so turn k+1 of a conversation
  extends the chain of turn k, and two conversations that share a system prompt share ``h1``;
* a plain prompt: cumulative hashes of fixed-size text blocks (``BLOCK_CHARS`` characters; a
  last partial block counts), as llm-d's approximate prefix mode does.

The chain is cut at ``MAX_CHAIN`` links (the first ones: a cache holds prefixes, so the start
of a long prompt is what matters). A hash is ``HASH_HEX`` hex digits of BLAKE2b: 64 bits, so
a collision (two prompts sharing a link by chance) is negligible, and harmless if it happens:
it only changes where a request runs, never what it outputs.

An optional *session* pins a conversation: its identity is a hash of the tenant and the
session id, so one tenant's session never matches another's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from inferq.protocol.generation import ChatMessage

if TYPE_CHECKING:
    from inferq.protocol.codec import RequestPayload

#: Characters per block of a plain prompt (about 64 tokens of English text).
BLOCK_CHARS = 256
#: Links kept of a chain (the first ones).
MAX_CHAIN = 32
HASH_HEX = 16
#: Identities a worker publishes at most (``inferq.worker.generate.prefixcache``).
MAX_HELD = 256
#: The member of a worker's held set that says it is saturated.
SATURATED = "saturated"
#: How far past the head of its band a claim under cache affinity looks (its window).
CLAIM_WINDOW = 64
#: A session id as a caller gives it (SDK ``session=``, the gateway's ``X-Session-Id``).
SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")


def _link(previous: bytes, text: str) -> bytes:
    return hashlib.blake2b(previous + text.encode("utf-8", "surrogatepass"),
                           digest_size=HASH_HEX // 2).digest()


def prompt_chain(prompt: str) -> list[str]:
    """The chain of a plain prompt: one hash per ``BLOCK_CHARS`` block, cumulative."""
    chain: list[str] = []
    previous = b""
    for start in range(0, min(len(prompt), BLOCK_CHARS * MAX_CHAIN), BLOCK_CHARS):
        previous = _link(previous, prompt[start:start + BLOCK_CHARS])
        chain.append(previous.hex())
    return chain


def chat_chain(messages: Sequence[ChatMessage]) -> list[str]:
    """The chain of a chat: one hash per message (its role and content), cumulative."""
    chain: list[str] = []
    previous = b""
    for message in messages[:MAX_CHAIN]:
        # the role, a NUL and the content: no two (role, content) pairs give the same text
        previous = _link(previous, f"{message.role}\0{message.content}")
        chain.append(previous.hex())
    return chain


def chain_of(prompt: str, messages: Sequence[ChatMessage] | None) -> list[str]:
    """The chain of a request: of its messages when it has them, else of its prompt."""
    return chat_chain(messages) if messages is not None else prompt_chain(prompt)


def user_session(user: str) -> str:
    """A session id made of any string (OpenAI's ``user`` field, at the gateway)."""
    return "u-" + _link(b"user\0", user).hex()


def session_key(tenant: str | None, session: str) -> str:
    """The identity a request's session is stored and matched by (per tenant)."""
    return _link((tenant or "").encode() + b"\0", session).hex()


class Affinity(TypedDict):
    """A request's affinity fields of ``ops.EnqueueItem``."""

    session: str
    prefixes: str


def affinity_of(payload: RequestPayload) -> Affinity:
    """The session identity and prefix chain stored with a request (none but for
    ``generate``)."""
    if payload.task != "generate":
        return {"session": "", "prefixes": ""}
    session = "" if payload.session is None else session_key(payload.tenant, payload.session)
    return {"session": session,
            "prefixes": " ".join(chain_of(payload.prompt, payload.messages))}


def identities_of(payload: RequestPayload) -> list[str]:
    """What a worker holds once it cached the request's prompt: its session's identity
    (if any) and every link of its chain."""
    affinity = affinity_of(payload)
    session = [affinity["session"]] if affinity["session"] else []
    return session + affinity["prefixes"].split()


def prompt_prefixes(prompt: str) -> str:
    """``affinity_of``'s prefixes of a plain prompt."""
    return " ".join(prompt_chain(prompt))
