"""What the gateway does with every field that OpenAI-compatible clients send.

A request field is either implemented (a field of the route's body model in ``schemas``) or
listed here as refused: a refused field is accepted only at a value that does nothing (its
default: ``n: 1``, ``logprobs: null``, ``truncate_prompt_tokens: -1``...), so that clients that
always send it (vLLM's benchmark client, LangChain, LiteLLM) get through, and any other value is
a 400 ``unsupported_parameter`` that names the field and says why. A field in neither place is
a 422 (``extra inputs are not permitted``): nothing is silently ignored.

The tables cover OpenAI's chat/completions and completions requests and vLLM's extensions
(``vllm/entrypoints/openai/protocol.py``); the gateway guide says how they are answered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticCustomError

from inferq.protocol.generation import UNSUPPORTED


@dataclass(frozen=True, slots=True)
class Refused:
    """A field inferq does not implement: ``noop`` are the values that change nothing."""

    reason: str
    noop: tuple[Any, ...] = (None,)

    def accepts(self, value: Any) -> bool:
        # ``1 == True`` in Python: compare types too, so ``n: true`` is not ``n: 1``.
        return any(value == ok and type(value) is type(ok) for ok in self.noop)


_TEXT_ONLY = "the models served take and return text only"
_STRUCTURED = "structured output (guided decoding) is not implemented"
_TOOLS = "tool and function calling is not implemented"
_ONE = "one choice per request: send several requests (they batch on the worker)"
_TEMPLATE = "the worker renders chats with the model's own chat template"

#: Refused in both generation routes.
GENERATION: dict[str, Refused] = {
    "n": Refused(_ONE, (None, 1)),
    "best_of": Refused(_ONE, (None, 1)),
    "use_beam_search": Refused("beam search is not implemented", (None, False)),
    "length_penalty": Refused("it applies to beam search, which is not implemented",
                              (None, 1, 1.0)),
    "frequency_penalty": Refused("not implemented (repetition_penalty is)", (None, 0, 0.0)),
    "presence_penalty": Refused("not implemented (repetition_penalty is)", (None, 0, 0.0)),
    "logit_bias": Refused("not implemented", (None, {})),
    "allowed_token_ids": Refused("not implemented", (None,)),
    "bad_words": Refused("not implemented", (None, [])),
    "echo": Refused("the response never repeats the prompt", (None, False)),
    "suffix": Refused("insertion (fill in the middle) is not implemented", (None,)),
    "response_format": Refused(_STRUCTURED, (None, {"type": "text"})),
    "guided_json": Refused(_STRUCTURED),
    "guided_regex": Refused(_STRUCTURED),
    "guided_choice": Refused(_STRUCTURED),
    "guided_grammar": Refused(_STRUCTURED),
    "guided_decoding_backend": Refused(_STRUCTURED),
    "guided_whitespace_pattern": Refused(_STRUCTURED),
    "structural_tag": Refused(_STRUCTURED),
    "structured_outputs": Refused(_STRUCTURED),
    "include_stop_str_in_output": Refused("stop strings are cut from the text", (None, False)),
    "skip_special_tokens": Refused("special tokens are always left out of the text",
                                   (None, True)),
    "spaces_between_special_tokens": Refused("special tokens are never in the text",
                                             (None, True)),
    "truncate_prompt_tokens": Refused(
        "prompts are never truncated: one longer than the model's context is refused",
        (None, -1)),
    "prompt_logprobs": Refused("log-probabilities of the prompt: use the score task",
                               (None, 0)),
    "return_tokens_as_token_ids": Refused("not implemented", (None, False)),
    "logits_processors": Refused("custom logits processors are not implemented"),
    "add_special_tokens": Refused("the worker tokenizes with the model's defaults"),
    "request_id": Refused("give the request's id in the X-Request-Id header"),
    "cache_salt": Refused("prefix caching is not implemented"),
    "kv_transfer_params": Refused("disaggregated prefill is not implemented"),
    "vllm_xargs": Refused("not implemented"),
    "mm_processor_kwargs": Refused(_TEXT_ONLY),
    "store": Refused("inferq stores no completions for later retrieval", (None, False)),
    "metadata": Refused("it applies to stored completions, which inferq does not keep"),
    "service_tier": Refused("use inferq's priority field", (None, "auto", "default")),
    "prediction": Refused("predicted outputs are not implemented"),
    "reasoning_effort": Refused("the models served do not reason"),
    "verbosity": Refused("the models served have no verbosity setting"),
    "web_search_options": Refused("web search is not implemented"),
}

#: Refused in ``/v1/chat/completions`` only.
CHAT: dict[str, Refused] = {
    **GENERATION,
    "tools": Refused(_TOOLS, (None, [])),
    "tool_choice": Refused(_TOOLS, (None, "none", "auto")),
    "parallel_tool_calls": Refused(_TOOLS, (None, True, False)),
    "functions": Refused(_TOOLS, (None, [])),
    "function_call": Refused(_TOOLS, (None, "none", "auto")),
    "audio": Refused(_TEXT_ONLY),
    "modalities": Refused(_TEXT_ONLY, (None, ["text"])),
    "chat_template": Refused(_TEMPLATE),
    "chat_template_kwargs": Refused(_TEMPLATE, (None, {})),
    "add_generation_prompt": Refused(_TEMPLATE + " and always adds the generation prompt",
                                     (None, True)),
    "continue_final_message": Refused(_TEMPLATE + " and never continues the last message",
                                      (None, False)),
    "documents": Refused(_TEMPLATE),
}

COMPLETION: dict[str, Refused] = dict(GENERATION)

EMBEDDINGS: dict[str, Refused] = {
    "dimensions": Refused("models return their native vector size"),
    "truncate_prompt_tokens": Refused(
        "inputs are never truncated: one longer than the model's context is refused",
        (None, -1)),
}

#: Fields of OpenAI's and vLLM's requests that each route implements (the reference page).
SUPPORTED: dict[str, tuple[str, ...]] = {
    "chat": ("model", "messages", "max_tokens", "max_completion_tokens", "temperature",
             "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
             "repetition_penalty", "min_tokens", "logprobs", "top_logprobs", "stream",
             "stream_options", "user"),
    "completion": ("model", "prompt", "max_tokens", "max_completion_tokens", "temperature",
                   "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
                   "repetition_penalty", "min_tokens", "logprobs", "stream", "stream_options",
                   "user"),
    "embeddings": ("model", "input", "encoding_format", "user"),
}


def drop_noops(data: Any, table: Mapping[str, Refused]) -> Any:
    """A body's fields without the refused ones at their no-op values; a refused field at
    any other value raises the refusal (the gateway answers 400 naming it)."""
    if not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        refused = table.get(key)
        if refused is None:
            out[key] = value
        elif not refused.accepts(value):
            raise PydanticCustomError(
                UNSUPPORTED, "{param}: not supported: {reason} (only {noop} is accepted)",
                {"param": key, "reason": refused.reason,
                 "noop": " or ".join(_json(v) for v in refused.noop)})
    return out


def _json(value: Any) -> str:
    return json.dumps(value)
