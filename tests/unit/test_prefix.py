"""The prefix identity of generate requests (``inferq.protocol.prefix``), pure."""

from __future__ import annotations

from inferq.protocol import prefix
from inferq.protocol.codec import build_request
from inferq.protocol.generation import ChatMessage

SYSTEM = ChatMessage(role="system", content="You are a careful assistant. " * 40)


def chat(*turns: str) -> list[ChatMessage]:
    return [SYSTEM, *(ChatMessage(role="user" if i % 2 == 0 else "assistant", content=t)
                      for i, t in enumerate(turns))]


def test_turn_k_plus_one_extends_the_chain_of_turn_k() -> None:
    first = prefix.chat_chain(chat("hello"))
    second = prefix.chat_chain(chat("hello", "hi there", "and then?"))
    assert len(first) == 2 and len(second) == 4
    assert second[:2] == first


def test_conversations_share_the_system_prompt_link_only() -> None:
    a, b = prefix.chat_chain(chat("one question")), prefix.chat_chain(chat("another"))
    assert a[0] == b[0] and a[1] != b[1]


def test_role_and_content_both_count() -> None:
    a = prefix.chat_chain([ChatMessage(role="user", content="x")])
    b = prefix.chat_chain([ChatMessage(role="system", content="x")])
    c = prefix.chat_chain([ChatMessage(role="user", content="y")])
    assert len({a[0], b[0], c[0]}) == 3


def test_prompts_hash_fixed_blocks_cumulatively() -> None:
    shared = "x" * (prefix.BLOCK_CHARS * 3)
    a, b = prefix.prompt_chain(shared + "tail one"), prefix.prompt_chain(shared + "tail two")
    assert len(a) == 4 and a[:3] == b[:3] and a[3] != b[3]
    # a change in the first block changes every link after it
    c = prefix.prompt_chain("y" + shared[1:] + "tail one")
    assert all(x != y for x, y in zip(a, c, strict=True))


def test_chains_are_bounded_and_hashes_sized() -> None:
    long = prefix.prompt_chain("z" * (prefix.BLOCK_CHARS * (prefix.MAX_CHAIN + 10)))
    assert len(long) == prefix.MAX_CHAIN
    assert all(len(h) == prefix.HASH_HEX and int(h, 16) >= 0 for h in long)
    many = prefix.chat_chain([ChatMessage(role="user", content=str(i)) for i in range(50)])
    assert len(many) == prefix.MAX_CHAIN


def test_sessions_are_per_tenant() -> None:
    assert prefix.session_key("a", "s1") == prefix.session_key("a", "s1")
    assert prefix.session_key("a", "s1") != prefix.session_key("b", "s1")
    assert prefix.session_key(None, "s1") != prefix.session_key("a", "s1")


def test_only_generate_requests_carry_an_identity() -> None:
    gen = build_request("", id="r1", task="generate", model="m", session="conv-1",
                        messages=[{"role": "user", "content": "hi"}])
    got = prefix.affinity_of(gen)
    assert got["session"] == prefix.session_key(None, "conv-1")
    assert got["prefixes"] == " ".join(prefix.chat_chain(gen.messages or []))
    embed = build_request("text", id="r2", task="embed", model="m", session="conv-1")
    assert prefix.affinity_of(embed) == {"session": "", "prefixes": ""}
