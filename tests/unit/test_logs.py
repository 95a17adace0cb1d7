"""Structured logs: the JSON formatter and the context every line carries."""

from __future__ import annotations

import io
import json
import logging

from inferq.logs import JsonFormatter, set_context


def test_json_logs_carry_context_and_extras() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("inferq.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    set_context(worker="w-1", queue="embed:t")
    logger.warning("batch %d done", 7, extra={"batch_id": 7, "request_ids": ["a", "b"]})
    entry = json.loads(stream.getvalue())
    assert entry["msg"] == "batch 7 done" and entry["level"] == "warning"
    assert entry["worker"] == "w-1" and entry["queue"] == "embed:t"
    assert entry["batch_id"] == 7 and entry["request_ids"] == ["a", "b"]
