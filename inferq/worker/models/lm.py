"""A causal language model and its tokenizer, loaded through the transformers Auto classes, and
the request preparation shared by the ``generate`` and ``score`` tasks (chat template
rendering, tokenization, length checks)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from inferq.errors import InvalidInput, ModelLoadError
from inferq.protocol.codec import RequestPayload

log = logging.getLogger("inferq.worker")


@dataclass(frozen=True, slots=True)
class KVShape:
    """What one token of KV cache costs: per layer, ``kv_heads`` x ``head_dim`` keys and values."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


class _Forward(NamedTuple):
    """How the loaded model's forward is called."""

    cache_kwarg: str
    keeps_logits: bool
    attn_implementation: str


def _kv_shape(config: Any, dtype: torch.dtype) -> KVShape:
    layers = int(getattr(config, "num_hidden_layers", None) or config.n_layer)
    heads = int(getattr(config, "num_attention_heads", None) or config.n_head)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    hidden = int(getattr(config, "hidden_size", None) or config.n_embd)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return KVShape(layers, kv_heads, head_dim, dtype)


def _generation_config(path: str) -> GenerationConfig:
    """The generation config ``from_pretrained`` gives the model: generation_config.json,
    else one made from config.json (as transformers falls back when the file is missing)."""
    try:
        return GenerationConfig.from_pretrained(path)
    except OSError:
        return GenerationConfig.from_pretrained(path, config_file_name="config.json",
                                                _from_model_config=True)


class WeightsNotLoaded(RuntimeError):
    """The model's forward was needed from a ``CausalLM`` loaded without its weights."""


class CausalLM:
    """``AutoModelForCausalLM`` + ``AutoTokenizer`` from a folder or hub id, on one device.

    With ``weights=False`` only the tokenizer and the configs load (``AutoConfig``, and the
    generation config as ``from_pretrained`` reads it): everything but the forward is there
    (rendering, encoding, decoding, ``max_positions``, end-of-sequence and pad ids, the KV
    shape), with the values a loaded model has. The ``generate`` worker's process holds one
    when the engine process (``--engine-process``) holds the weights; ``model`` raises
    ``WeightsNotLoaded`` there."""

    def __init__(self, path: str, *, device: torch.device, dtype: torch.dtype,
                 model_id: str | None = None, weights: bool = True) -> None:
        model: Any = None
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            if weights:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                             attn_implementation="sdpa")
                config = model.config
                generation_config = model.generation_config
            else:
                config = AutoConfig.from_pretrained(path)
                generation_config = _generation_config(path)
        except (OSError, ValueError) as exc:
            what = "causal LM" if weights else "tokenizer and config of causal LM"
            raise ModelLoadError(f"cannot load {what} from {path!r}: {exc}") from exc
        self._model: Any = None if model is None else model.to(device).eval()
        #: Where it was loaded from (the generate worker's engine process loads it again).
        self.source = path
        self.torch_device = device
        self.device = str(device)
        self.dtype = dtype
        self.model_id = model_id or Path(path).name or path
        self.vocab_size = int(config.vocab_size)
        self.max_positions = int(getattr(config, "max_position_embeddings", None)
                                 or getattr(config, "n_positions", None) or 2048)
        self.eos_ids = self._eos_ids(generation_config)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0))
        self.kv = _kv_shape(config, dtype)
        self._call: _Forward | None = None
        if self._model is not None:
            params = inspect.signature(self._model.forward).parameters
            # transformers 5 renamed ``past_key_values`` to ``cache``.
            self._call = _Forward("cache" if "cache" in params else "past_key_values",
                                  "logits_to_keep" in params,
                                  str(getattr(config, "_attn_implementation", "sdpa")))
        #: The Rust tokenizer of a fast tokenizer (incremental decoding), else None.
        self.backend = (getattr(self.tokenizer, "backend_tokenizer", None)
                        if getattr(self.tokenizer, "is_fast", False) else None)

    @property
    def has_weights(self) -> bool:
        return self._model is not None

    @property
    def model(self) -> Any:
        """The ``AutoModelForCausalLM``; ``WeightsNotLoaded`` without weights (or closed)."""
        if self._model is None:
            raise self._no_weights()
        return self._model

    def _forward(self) -> _Forward:
        if self._model is None or self._call is None:
            raise self._no_weights()
        return self._call

    def _no_weights(self) -> WeightsNotLoaded:
        return WeightsNotLoaded(
            f"model {self.model_id} has no weights in this process (loaded without them: "
            "tokenizer and config only; or closed): its forward cannot run here")

    @property
    def cache_kwarg(self) -> str:
        """The forward's KV cache argument (transformers 5 renamed ``past_key_values``)."""
        return self._forward().cache_kwarg

    @property
    def keeps_logits(self) -> bool:
        """Whether the forward takes ``logits_to_keep``."""
        return self._forward().keeps_logits

    @property
    def attn_implementation(self) -> str:
        return self._forward().attn_implementation

    def _eos_ids(self, generation_config: Any) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(generation_config, "eos_token_id", None),
                       self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list | tuple):
                ids.update(int(i) for i in source)
        return frozenset(i for i in ids if i >= 0)

    # ------------------------------------------------------------------------- inputs

    def render(self, payload: RequestPayload) -> str:
        """The prompt text: the chat template applied to ``messages``, or the prompt itself."""
        if payload.messages is None:
            return payload.prompt
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidInput(f"model {self.model_id} has no chat template; send a prompt")
        messages = [m.model_dump() for m in payload.messages]
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)
        except Exception as exc:  # a template that rejects the conversation (jinja raise)
            raise InvalidInput(f"chat template refused the messages: {exc}") from exc
        return str(text)

    def encode(self, payloads: Sequence[RequestPayload]) -> list[list[int] | InvalidInput]:
        """Token ids of each request's rendered prompt. Chat prompts already hold the special
        tokens the template wants; plain prompts get the tokenizer's usual ones (BOS)."""
        out: list[list[int] | InvalidInput] = []
        texts: list[tuple[int, str, bool]] = []
        for i, payload in enumerate(payloads):
            try:
                texts.append((i, self.render(payload), payload.messages is None))
            except InvalidInput as exc:
                out.append(exc)
                continue
            out.append([])
        for special in (True, False):
            group = [(i, text) for i, text, plain in texts if plain == special]
            if not group:
                continue
            encoded = self.tokenizer([text for _, text in group], add_special_tokens=special,
                                     return_attention_mask=False)["input_ids"]
            for (i, _), ids in zip(group, encoded, strict=True):
                out[i] = [int(t) for t in ids]
        for i, ids in enumerate(out):
            if isinstance(ids, list) and not ids:
                out[i] = InvalidInput("the prompt is empty after tokenization")
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True,
                                         clean_up_tokenization_spaces=False))

    def close(self) -> None:
        had_weights, self._model = self._model is not None, None
        if had_weights and self.torch_device.type == "cuda":
            torch.cuda.empty_cache()

    def forward_kwargs(self, cache: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = {self.cache_kwarg: cache, "use_cache": cache is not None}
        if self.keeps_logits:
            kwargs["logits_to_keep"] = 1
        return kwargs
