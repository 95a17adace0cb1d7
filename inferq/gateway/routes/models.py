"""``GET /v1/models`` (OpenAI-compatible): the models some worker has served, from the queue
registry (see ``inferq.gateway.served``); ``GET /v1/models/{model}`` one of them, else 404
``model_not_found``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from inferq.gateway.schemas import ERROR_RESPONSES
from inferq.gateway.state import State
from inferq.openai.errors import model_not_found
from inferq.openai.schemas import ModelName

router = APIRouter(tags=["openai"])


def _models(queues: frozenset[str]) -> dict[str, list[str]]:
    tasks: dict[str, list[str]] = {}
    for queue in sorted(queues):
        task, _, model = queue.partition(":")
        if model:
            tasks.setdefault(model, []).append(task)
    return tasks


def _entry(model: str, tasks: list[str]) -> dict[str, Any]:
    # OpenAI's fields, plus the tasks (queues) a worker has served the model for.
    return {"id": model, "object": "model", "created": 0, "owned_by": "inferq", "tasks": tasks}


@router.get("/v1/models", responses=ERROR_RESPONSES, summary="List served models")
async def list_models(state: State) -> dict[str, Any]:
    models = _models(await state.served.queues(state.client, fresh=True))
    return {"object": "list", "data": [_entry(m, t) for m, t in models.items()]}


@router.get("/v1/models/{model}", responses=ERROR_RESPONSES, summary="One served model")
async def get_model(model: ModelName, state: State) -> dict[str, Any]:
    models = _models(await state.served.queues(state.client, fresh=True))
    if model not in models:
        raise model_not_found(model, None)
    return _entry(model, models[model])
