from __future__ import annotations

import pytest

from inferq.errors import ValidationError
from inferq.protocol import scores
from inferq.protocol.keys import QueueKeys, queue_name


def test_higher_priority_sorts_first_and_fifo_within_priority() -> None:
    entries = [(0, 1), (5, 3), (0, 2), (5, 4), (-3, 0), (100, 9)]
    ordered = sorted(entries, key=lambda e: scores.encode(*e))
    assert ordered == [(100, 9), (5, 3), (5, 4), (0, 1), (0, 2), (-3, 0)]


def test_scores_stay_exact_in_a_double() -> None:
    worst = scores.encode(scores.PRIORITY_MIN, scores.SEQ_LIMIT - 1)
    assert worst < 2**53
    assert int(float(worst)) == worst
    assert scores.decode(float(scores.encode(-7, 123456789))) == (-7, 123456789)


@pytest.mark.parametrize("bad", [101, -101, 1.5, "3", True, None])
def test_priority_out_of_range_or_not_int_is_a_validation_error(bad: object) -> None:
    with pytest.raises(ValidationError, match="priority"):
        scores.check_priority(bad)


def test_every_key_of_a_queue_shares_one_hash_tag() -> None:
    keys = QueueKeys.for_model("embed", "minilm")
    names = [keys.pending, keys.inflight, keys.seq, keys.wake, keys.dead, keys.workers,
             keys.stats, keys.tuning("m"), keys.window("w"), keys.request("r1"),
             keys.result("r1")]
    assert all(name.startswith("inferq:{embed:minilm}:") for name in names)
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "{tag}", "x" * 65])
def test_bad_queue_names_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError):
        queue_name("embed", bad)


def test_shard_zero_keeps_the_original_layout_and_other_shards_get_their_own_tag() -> None:
    from inferq.protocol.keys import QueueKeys

    keys = QueueKeys.for_model("embed", "minilm")
    assert keys.prefix == "inferq:{embed:minilm}:"
    assert keys.for_shard(2).prefix == "inferq:{embed:minilm#2}:"
    assert [k.shard for k in keys.shards(3)] == [0, 1, 2]
    assert keys.for_shard(2).config == keys.config == "inferq:{embed:minilm}:config"


def test_an_id_always_lands_on_the_same_shard_and_ids_spread() -> None:
    from inferq.protocol.keys import shard_of

    assert shard_of("abc", 1) == 0
    assert shard_of("abc", 3) == shard_of("abc", 3)
    assert {shard_of(f"id-{i}", 3) for i in range(100)} == {0, 1, 2}


def test_queue_settings_parse_a_config_hash_and_keep_defaults_for_bad_fields() -> None:
    from inferq.protocol.settings import QueueSettings, settings_from_hash

    assert settings_from_hash({}) == QueueSettings()
    parsed = settings_from_hash({b"shards": b"2", b"shards_seen": b"3", b"max_depth": b"500"})
    assert parsed == QueueSettings(2, 3, 500) and parsed.claim_shards == 3
    assert settings_from_hash({"shards": "x", "shards_seen": "0"}) == QueueSettings()
