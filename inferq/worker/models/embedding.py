"""Sentence embeddings from any HF encoder: mean pooling over real tokens, L2-normalised
(the sentence-transformers recipe for all-MiniLM-L6-v2 and its kin)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer

from inferq.errors import InferqError, InvalidInput, ModelLoadError
from inferq.protocol.codec import RequestPayload
from inferq.worker.models.base import BatchModel, ModelInput


def _max_seq_length(path: str, tokenizer: Any, config: Any) -> int:
    """sentence-transformers' ``max_seq_length`` when the folder has one, else the model's."""
    st_config = Path(path) / "sentence_bert_config.json"
    if st_config.is_file():
        value = json.loads(st_config.read_text()).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return value
    limits = [int(tokenizer.model_max_length)]
    if getattr(config, "max_position_embeddings", None):
        limits.append(int(config.max_position_embeddings))
    return min(limits)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the positions where ``mask`` is 1, then L2 normalisation, in float32."""
    weights = mask.unsqueeze(-1).to(torch.float32)
    summed = (hidden.to(torch.float32) * weights).sum(dim=1)
    pooled = summed / weights.sum(dim=1).clamp(min=1e-9)
    return F.normalize(pooled, p=2, dim=1)


class EmbeddingModel(BatchModel):
    tasks = frozenset({"embed"})

    def __init__(self, path: str, *, device: torch.device, dtype: torch.dtype,
                 model_id: str | None = None) -> None:
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModel.from_pretrained(path, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load embedding model from {path!r}: {exc}") from exc
        self.model = model.to(device).eval()
        self.torch_device = device
        self.device = str(device)
        self.dtype = dtype
        self.model_id = model_id or Path(path).name or path
        self.max_length = _max_seq_length(path, self.tokenizer, model.config)
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        self._pinned: torch.Tensor | None = None
        self._lock = threading.Lock()

    def prepare(self, payloads: Sequence[RequestPayload]) -> list[ModelInput | InferqError]:
        if not payloads:
            return []
        out: list[ModelInput | InferqError] = []
        # One token more than the model takes: an input that fills it was cut (the last token,
        # [SEP], is added after truncation and is kept).
        limit = self.max_length
        encoded = self.tokenizer(
            [p.prompt for p in payloads], truncation=True, max_length=limit + 1,
            add_special_tokens=True, return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        for payload, ids in zip(payloads, encoded, strict=True):
            truncated = len(ids) > limit
            if truncated:
                ids = [*ids[:limit - 1], ids[-1]]
            unknown = sorted(set(payload.params) - {"truncate"})
            truncate = payload.params.get("truncate", True)
            if unknown or not isinstance(truncate, bool):
                out.append(InvalidInput(
                    "embed takes one param, truncate (true: cut an input longer than the "
                    f"model's {limit} tokens, the default; false: refuse it), got "
                    f"{dict(payload.params)}"))
            elif truncated and not truncate:
                out.append(InvalidInput(
                    f"input is longer than the model's maximum of {limit} tokens and "
                    "truncate is false: shorten it, or allow truncation"))
            else:
                out.append(ModelInput(len(ids), ids, truncated=truncated))
        return out

    def _host_ids(self, rows: int, cols: int) -> torch.Tensor:
        """A (rows, cols) view of a reusable pinned host buffer (CUDA) or a fresh tensor."""
        if self.torch_device.type != "cuda":
            return torch.empty((rows, cols), dtype=torch.long)
        if self._pinned is None or self._pinned.numel() < rows * cols:
            self._pinned = torch.empty(max(rows * cols, 1 << 16), dtype=torch.long).pin_memory()
        return self._pinned[: rows * cols].view(rows, cols)

    @torch.inference_mode()
    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        if not batch:
            return []
        with self._lock:
            width = max(item.tokens for item in batch)
            ids = self._host_ids(len(batch), width)
            ids.fill_(self.pad_id)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, item in enumerate(batch):
                ids[row, : item.tokens] = torch.as_tensor(item.data, dtype=torch.long)
                mask[row, : item.tokens] = 1
            if self.torch_device.type == "cuda":
                mask = mask.pin_memory()
            input_ids = ids.to(self.torch_device, non_blocking=True)
            attention = mask.to(self.torch_device, non_blocking=True)
            hidden = self.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
            vectors = mean_pool(hidden, attention).cpu()
        result: list[Any] = vectors.tolist()
        return result

    def close(self) -> None:
        del self.model
        if self.torch_device.type == "cuda":
            torch.cuda.empty_cache()
