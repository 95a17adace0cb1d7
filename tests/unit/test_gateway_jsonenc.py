"""The gateway's response encoder writes the same JSON values as the standard library."""

from __future__ import annotations

import json

from inferq.openai import jsonenc


def test_floats_round_trip_exactly_and_the_fast_encoder_serves() -> None:
    vector = [0.1, -2.5e-8, 1 / 3, 123456.789, 0.0, -0.0]
    body = {"object": "list", "data": [{"index": 0, "embedding": vector}], "model": "m"}
    assert json.loads(jsonenc.dumps(body)) == body
    assert jsonenc.ENCODER == "orjson"  # the gateway extra installs it
