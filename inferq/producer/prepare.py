"""Requests made ready for the enqueue script: ``prepare`` validates one request (``enqueue``'s
arguments) into the script's item, ``prepare_many`` a list of them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from inferq.errors import ValidationError
from inferq.producer.options import ENQUEUE_KEYS, ClientOptions
from inferq.protocol import ops, scores
from inferq.protocol.codec import build_request, decode_payload_fields, encode_request, pack
from inferq.protocol.cost import estimate
from inferq.protocol.generation import check_task_params
from inferq.protocol.keys import QueueKeys
from inferq.protocol.prefix import affinity_of, prompt_prefixes


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated request ready for the enqueue script."""

    keys: QueueKeys
    item: ops.EnqueueItem
    task: str
    model: str
    priority: int = 0


def prepare(prompt: object, request: Mapping[str, Any], options: ClientOptions,
            reply_to: str | None = None) -> Prepared:
    """Validate one request (``enqueue``'s arguments, see ``EnqueueOptions``) into the
    enqueue script's item. Unknown or missing arguments are a ``TypeError``, as for a
    function's own keywords."""
    unknown = sorted(request.keys() - ENQUEUE_KEYS)
    if unknown:
        raise TypeError(f"enqueue() got an unexpected keyword argument {unknown[0]!r}")
    if "model" not in request:
        raise TypeError("enqueue() missing 1 required keyword-only argument: 'model'")
    fields = {"task": "embed", **request}  # the other defaults are ``RequestPayload``'s
    if fields.get("id") is None:
        fields["id"] = uuid.uuid4().hex
    if (params := fields.get("params")) is not None:
        if not isinstance(params, Mapping):
            raise ValidationError(f"params must be a mapping, got {type(params).__name__}")
        fields["params"] = dict(params)
    payload = build_request(prompt, **fields)
    # generate/score params are checked here too, so a typo fails at enqueue, not in a worker.
    check_task_params(payload.task, payload.params, payload.messages is not None)
    keys = QueueKeys.for_model(payload.task, payload.model, options.namespace)
    item = ops.EnqueueItem(
        depth_limit=options.shedding.limit(payload.priority, options.max_queue_depth),
        id=payload.id,
        band=scores.band(payload.priority),
        payload=encode_request(payload, options.limits),
        deadline_ms=None if payload.deadline_s is None else max(1, round(payload.deadline_s * 1e3)),
        max_attempts=payload.max_attempts,
        reply_to=reply_to,
        tenant=payload.tenant or "",
        cost=payload.fair_cost,
        slo_ms=payload.ttft_slo_ms or 0,
        **affinity_of(payload),
    )
    return Prepared(keys=keys, item=item, task=payload.task, model=payload.model,
                    priority=payload.priority)


def prepare_many(
    requests: Iterable[str | Mapping[str, Any]], defaults: Mapping[str, Any],
    options: ClientOptions, reply_to: str | None = None,
) -> list[Prepared]:
    """Each request is a prompt or a mapping of ``enqueue`` keyword arguments (with ``prompt``);
    ``defaults`` fills what a mapping leaves out. A list of plain prompts takes
    ``_prepare_prompts``, which gives the same requests for less CPU."""
    if isinstance(requests, str | bytes | Mapping) or not isinstance(requests, Iterable):
        raise ValidationError(
            f"requests must be a list of prompts or mappings, got {type(requests).__name__}")
    requests = requests if isinstance(requests, Sequence) else list(requests)
    if (len(requests) > 1 and defaults.get("id") is None and defaults.get("messages") is None
            and all(type(r) is str for r in requests)):
        return _prepare_prompts(cast("Sequence[str]", requests), defaults, options, reply_to)
    return [_prepare_one(index, request, defaults, options, reply_to)
            for index, request in enumerate(requests)]


def _prepare_one(index: int, request: object, defaults: Mapping[str, Any],
                 options: ClientOptions, reply_to: str | None) -> Prepared:
    """``prepare`` of request #index of ``prepare_many``, its errors naming the index."""
    spec: dict[str, Any] = dict(defaults)
    if isinstance(request, str):
        spec["prompt"] = request
    elif isinstance(request, Mapping):
        spec.update(request)
    else:
        raise ValidationError(
            f"request #{index} must be a str or a mapping, got {type(request).__name__}"
        )
    if "prompt" not in spec or "model" not in spec:
        raise ValidationError(f"request #{index} needs a prompt and a model")
    prompt = spec.pop("prompt")
    try:
        return prepare(prompt, spec, options, reply_to)
    except TypeError as exc:  # an unknown keyword in the mapping
        raise ValidationError(f"request #{index}: {exc}") from exc
    except ValidationError as exc:
        raise type(exc)(f"request #{index}: {exc.message}", field=exc.field) from exc


def uuid4_hexes(n: int) -> list[str]:
    """``[uuid.uuid4().hex for _ in range(n)]``, from one read of the OS's randomness: the
    same random version-4 UUIDs, without building a ``UUID`` each."""
    raw = bytearray(os.urandom(16 * n))
    raw[6::16] = bytes((b & 0x0F) | 0x40 for b in raw[6::16])  # version 4
    raw[8::16] = bytes((b & 0x3F) | 0x80 for b in raw[8::16])  # RFC 4122 variant
    text = raw.hex()
    return [text[i:i + 32] for i in range(0, 32 * n, 32)]


def _prepare_prompts(prompts: Sequence[str], defaults: Mapping[str, Any],
                     options: ClientOptions, reply_to: str | None) -> list[Prepared]:
    """``prepare_many`` of plain prompts sharing ``defaults``: the first is prepared (and so
    every argument validated) by ``prepare``; the others differ from it only in their id,
    prompt, payload and cost, so each takes a copy of its payload's fields with those
    replaced, checked as ``prepare`` checks them (a non-blank prompt of valid Unicode within
    the size limits). A prompt that fails a check goes through ``prepare``, which raises the
    same error as for a list of mappings. ``tests/unit/test_prepare_prompts.py`` proves the
    requests equal to ``prepare``'s."""
    first = _prepare_one(0, prompts[0], defaults, options, reply_to)
    template = decode_payload_fields(first.item.payload)
    task, params, cost = template["task"], template["params"], defaults.get("cost")
    item, limits = first.item, options.limits
    out = [first]
    ids = uuid4_hexes(len(prompts) - 1)
    for index in range(1, len(prompts)):
        prompt = prompts[index]
        try:
            size = len(prompt.encode("utf-8"))
        except UnicodeEncodeError:
            size = -1
        payload = b""
        if 0 <= size <= limits.max_prompt_bytes and prompt.strip():
            template["id"], template["prompt"] = ids[index - 1], prompt
            payload = pack(template)
        if not payload or len(payload) > limits.max_payload_bytes:
            out.append(_prepare_one(index, prompt, defaults, options, reply_to))
            continue
        out.append(Prepared(first.keys, ops.EnqueueItem(
            template["id"], item.band, payload, item.deadline_ms, item.max_attempts,
            item.reply_to, item.depth_limit, item.tenant, item.weight,
            estimate(task, size, params, cost), item.tenant_limit, item.slo_ms, item.policy,
            item.session, prompt_prefixes(prompt) if item.prefixes else ""),
            first.task, first.model, first.priority))
    return out
