"""An OpenAI request body as ``enqueue``'s arguments: the one mapping per endpoint that the
gateway's routes and the batch runner both use. What the caller adds (priority, deadline,
tenant, id) is theirs: a route takes it from the key and the headers, a batch from its own
settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferq.openai.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingsRequest
from inferq.protocol.generation import GENERATE_TASK

EMBED_TASK = "embed"


@dataclass(frozen=True, slots=True)
class Enqueue:
    """``enqueue(prompt, **fields)``: the body's prompt and the keyword arguments it sets
    (``model``, ``task``, and for a generation ``params`` and a chat's ``messages``)."""

    prompt: str
    fields: dict[str, Any]


def generation_request(body: ChatCompletionRequest | CompletionRequest) -> Enqueue:
    """A completion's ``prompt``, or a chat's ``messages`` (rendered with the model's chat
    template on the worker), as one ``generate`` request."""
    fields: dict[str, Any] = {"model": body.model, "task": GENERATE_TASK,
                              "params": body.params()}
    if isinstance(body, ChatCompletionRequest):
        fields["messages"] = [m.model_dump() for m in body.messages]
        return Enqueue("", fields)
    return Enqueue(body.prompt, fields)


def embedding_texts(body: EmbeddingsRequest) -> list[str]:
    """The texts of an embeddings call: one ``embed`` request each."""
    return [body.input] if isinstance(body.input, str) else body.input


def embeddings_fields(body: EmbeddingsRequest) -> dict[str, Any]:
    """The keyword arguments of each text's ``embed`` request."""
    return {"model": body.model, "task": EMBED_TASK}


def text_bytes(body: ChatCompletionRequest | CompletionRequest) -> int:
    """The size of a generation's input, for its token estimate and byte budget."""
    if isinstance(body, ChatCompletionRequest):
        return sum(len(m.content.encode("utf-8")) for m in body.messages)
    return len(body.prompt.encode("utf-8"))
