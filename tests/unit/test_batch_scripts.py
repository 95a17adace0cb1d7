"""The batch scripts against their one Python description (``inferq.batch.ops``), as the queue's
scripts are checked in ``test_script_headers``; the batch hash's field names against their
source; the feed's target with a fake clock; the file envelope checks."""

from __future__ import annotations

import re

import pytest

from inferq.batch import ops
from inferq.batch.envelope import FileInvalid, check_file, line_request_id, read_lines
from inferq.batch.feed import Feed
from inferq.batch.fields import BatchField
from inferq.batch.keys import BatchKeys
from inferq.protocol import scripts
from inferq.protocol.codec import Status
from tests.unit.test_script_headers import LUA, SHARD_KEYS, parse_header

KEYS = BatchKeys.of("batch_x", "embed", "m")
NAMED = {KEYS.batch: "batch", KEYS.inbox: "inbox", **SHARD_KEYS}
CALLS = {
    "lease": lambda n: ops.lease_call(KEYS, "tok", 1000),
    "commit": lambda n: ops.commit_call(KEYS, "tok", ops.Step(0, True, 0, 1, 10)),
    "status": lambda n: ops.status_call(KEYS, "tok", ("in_progress",), "cancelling",
                                        "cancelling_at", [("f", "v")] * n),
    "withdraw": lambda n: ops.withdraw_call(KEYS, "tok", "cancel", 1000,
                                            [f"r{i}" for i in range(n)]),
}


def test_every_batch_script_has_a_file_and_a_call() -> None:
    assert {p.stem for p in (LUA / "batch").glob("*.lua")} == set(ops.NAMES) == set(CALLS)


@pytest.mark.parametrize("name", ops.NAMES)
def test_the_header_matches_the_call(name: str) -> None:
    header = parse_header(f"batch/{name}")
    for n in (1, 3):
        keys, args = CALLS[name](n)
        assert [NAMED.get(str(k), k) for k in keys] == header.keys, name
        rows = 0 if header.rows_from is None else n * header.width
        assert len(args) == len(header.fixed) + rows, name
        for i, arg_name in header.fixed:
            if arg_name == "prefix":
                assert args[i - 1] == KEYS.queue.prefix
    body = (LUA / "batch" / f"{name}.lua").read_text().split("]]", 1)[1]
    assert {int(i) for i in re.findall(r"KEYS\[(\d+)\]", body)} == set(
        range(1, len(header.keys) + 1))
    assert {int(i) for i in re.findall(r"ARGV\[(\d+)\]", body)} <= set(
        range(1, len(header.fixed) + 1))


def test_batch_scripts_spell_no_batch_field_and_get_the_queue_prelude() -> None:
    # result statuses ('expired') share some names with counters: not fields where used
    values = {f.value for f in BatchField} - {s.value for s in Status}
    for name in ops.NAMES:
        text = (LUA / "batch" / f"{name}.lua").read_text()
        text = re.sub(r"--\[\[.*?\]\]", "", text, flags=re.S)
        literals = set(re.findall(r"'([^'\\]*)'", text))
        assert not literals & values, f"{name}.lua spells {literals & values}: use B_ names"
        assert ops.ALL[name].startswith(scripts.constants())


def test_the_feed_fills_idle_capacity_and_yields_to_online_traffic() -> None:
    feed = Feed(floor=10, ceiling=1000, lead_s=1.0, busy_floor=4, quiet_s=1.0)
    assert feed.target(0.0) == 10 and feed.room(4, 0.0) == 6 and feed.room(50, 0.0) == 0
    feed.observe(0.0, queue_done=0, batch_done=0)
    feed.observe(1.0, queue_done=400, batch_done=400)  # the batch alone: 400/s
    assert feed.target(1.0) == 400  # the whole fleet for one lead time
    feed.observe(2.0, queue_done=800, batch_done=500)  # online: 300/s of the 400
    # online traffic gets twice its rate first: nothing left but the busy floor
    assert feed.target(2.0) == 4
    feed.observe(2.5, queue_done=880, batch_done=580)  # online stops
    assert feed.target(2.9) == 4  # not quiet for quiet_s yet
    assert feed.target(3.1) == 400  # quiet: the fleet is the batch's again
    feed.observe(3.5, queue_done=1880, batch_done=1580)  # a burst of the batch: capped
    assert feed.target(4.0) == 1000
    busy = Feed(floor=10, ceiling=1000, lead_s=1.0, busy_floor=4)
    busy.observe(0.0, 0, 0)
    busy.observe(1.0, 500, 400)  # light online traffic (100/s) leaves the batch 300/s
    assert busy.target(1.0) == 300


def test_read_lines_tracks_offsets_across_blocks() -> None:
    blocks = [b'{"a"', b':1}\n{"b":2}\n', b'{"c":3}']
    assert list(read_lines(blocks)) == [(8, b'{"a":1}'), (16, b'{"b":2}'), (23, b'{"c":3}')]
    assert list(read_lines([b'{"c":3}\n'], offset=16)) == [(24, b'{"c":3}')]


def test_line_ids_are_derived_from_batch_and_custom_id() -> None:
    assert line_request_id("batch_1", "x") == line_request_id("batch_1", "x")
    assert line_request_id("batch_1", "x") != line_request_id("batch_2", "x")
    assert line_request_id("batch_1", "x") != line_request_id("batch_1", "y")


def test_an_empty_file_is_refused() -> None:
    with pytest.raises(FileInvalid) as refused:
        check_file([b""], "/v1/embeddings", 10)
    assert refused.value.code == "empty_file" and refused.value.line is None


def test_the_sleep_model_answers_vectors_when_asked() -> None:
    from inferq.errors import ConfigError
    from inferq.worker.models.base import ModelInput
    from inferq.worker.models.builtin import SleepModel

    model = SleepModel.from_options({"batch_ms": "0", "vector": "1"})
    assert model.forward([ModelInput(1, "abc")]) == [[3.0, 1.0]]
    assert SleepModel.from_options({"batch_ms": "0"}).forward([ModelInput(1, "abc")]) == [
        "abc"]
    with pytest.raises(ConfigError):
        SleepModel.from_options({"vector": "yes"})


def test_batch_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from inferq.gateway.batch_state import batch_config
    from inferq.gateway.settings import GatewaySettings

    monkeypatch.setenv("INFERQ_GATEWAY_FILE_STORE", "s3://bucket/prefix")
    monkeypatch.setenv("INFERQ_GATEWAY_FILE_STORE_OPTIONS", '{"endpoint_url": "http://s3:9000"}')
    monkeypatch.setenv("INFERQ_GATEWAY_BATCH_PRIORITY", "-20")
    monkeypatch.setenv("INFERQ_GATEWAY_BATCH_MAX_OUTSTANDING", "10")
    settings = GatewaySettings.from_env()
    assert settings.file_store == "s3://bucket/prefix"
    assert settings.file_store_options == {"endpoint_url": "http://s3:9000"}
    config = batch_config(settings)
    assert (config.priority, config.max_outstanding, config.min_outstanding) == (-20, 10, 10)
    monkeypatch.setenv("INFERQ_GATEWAY_BATCH_PRIORITY", "-200")
    with pytest.raises(ValidationError, match="batch_priority"):
        GatewaySettings.from_env()
