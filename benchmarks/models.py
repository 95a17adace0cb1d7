"""The models the benchmarks run in their own process (MiniLM as a user without inferq would run
it; the continuous worker's engine with no queue) and where model files come from. The one
benchmarks module that imports ``inferq.worker``; heavy imports stay inside functions.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.harness import say

if TYPE_CHECKING:
    import torch

#: The generation models (``generation_source``) that ``generate`` and ``engines`` compare.
GENERATION_MODELS = ("tiny", "smollm2")
#: torch intra-op threads per worker (all variants alike): the tiny model's matmuls are too
#: small to gain from two threads, and their barriers stall when other tenants use the cores.
TORCH_THREADS: dict[str, int | None] = {"tiny": 1, "smollm2": None}
#: Concurrent sequences of a generation engine (its ``max_slots``).
SLOTS = 16


# --------------------------------------------------------------------------------- MiniLM


def minilm_path() -> str:
    from inferq.worker.models.registry import minilm_path as path

    return str(path())


class BareModel:
    """MiniLM the way a user without inferq would run it, pooled exactly like the worker."""

    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
        self.max_length = _max_seq_length(path, int(self.tokenizer.model_max_length))

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        ids = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)
        return [len(row) for row in ids["input_ids"]]

    def encode(self, texts: Sequence[str], batch_size: int) -> tuple[torch.Tensor, int]:
        """Embeddings of ``texts`` in order, and the padded tokens the batches cost."""
        import torch

        from inferq.worker.models.embedding import mean_pool

        out: list[torch.Tensor] = []
        padded = 0
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                enc = self.tokenizer(list(texts[start:start + batch_size]), padding=True,
                                     truncation=True, max_length=self.max_length,
                                     return_attention_mask=True, return_token_type_ids=False,
                                     return_tensors="pt")
                mask = enc["attention_mask"]
                hidden = self.model(input_ids=enc["input_ids"],
                                    attention_mask=mask).last_hidden_state
                out.append(mean_pool(hidden, mask))
                padded += int(mask.numel())
        return torch.cat(out), padded

    def rates(self, texts: Sequence[str], batch_sizes: Sequence[int]) -> dict[int, float]:
        """Requests/s over ``texts`` at each batch size, in order, tokenization included."""
        rates: dict[int, float] = {}
        for bs in batch_sizes:
            t0 = time.perf_counter()
            self.encode(texts, bs)
            rates[bs] = len(texts) / (time.perf_counter() - t0)
            say(f"  bare model bs={bs:<3} {rates[bs]:6.1f} req/s")
        return rates


def _max_seq_length(path: str, tokenizer_limit: int) -> int:
    config = Path(path) / "sentence_bert_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return value
    return tokenizer_limit


# ----------------------------------------------------------------------------- generation


def generation_source(model: str, out: Path) -> str:
    """The folder of ``model`` (``tiny`` or ``smollm2``), made on first use."""
    if model == "tiny":
        folder = out / "models" / "tiny-llama"
        if not (folder / "config.json").exists():
            from tests.support.tiny import build_tiny_model

            say(f"building the tiny random Llama in {folder}")
            build_tiny_model(folder)
        return str(folder)
    from inferq.worker.models.convert import ensure_smollm2

    return str(ensure_smollm2())


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """The block runs with ``threads`` torch intra-op threads (None: unchanged)."""
    import torch

    default = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(default)


def load_lm(source: str) -> Any:
    """The worker's ``CausalLM`` on the CPU, float32."""
    import torch

    from inferq.worker.models.lm import CausalLM

    return CausalLM(source, device=torch.device("cpu"), dtype=torch.float32)


def worker_engine(lm: Any, slots: int) -> Any:
    """The engine with the budgets the continuous worker gives it at ``--max-slots slots``."""
    from inferq.worker.generate.engine import Engine
    from inferq.worker.generate.settings import GenerationSettings

    return Engine(lm, GenerationSettings(max_slots=slots).budget(lm))


def open_engine(lm: Any, slots: int) -> Any:
    """The engine limited by its slots only (KV and prefill budgets out of the way)."""
    from inferq.worker.generate.engine import Engine
    from inferq.worker.generate.scheduler import Budget

    return Engine(lm, Budget(max_slots=slots, kv_tokens=1 << 24, max_prefill_tokens=4096))


def serve_engine(engine: Any, gens: Sequence[Any],
                 arrivals_s: Sequence[float] | None = None) -> tuple[float, int]:
    """Run ``gens`` through ``engine`` step by step until all finish, each joining the waiting
    line at its offset in ``arrivals_s`` (seconds from the start; None: all at once). Returns
    the start (``time.monotonic``) and how many steps admitted sequences."""
    at = list(arrivals_s) if arrivals_s is not None else [0.0] * len(gens)
    pending, waiting = list(zip(at, gens, strict=True)), []
    admitting = 0
    start = time.monotonic()
    while pending or waiting or engine.running:
        now = time.monotonic() - start
        while pending and pending[0][0] <= now:
            waiting.append(pending.pop(0)[1])
        if not waiting and not engine.running:
            time.sleep(max(0.0, pending[0][0] - now))
            continue
        admitted = engine.select(waiting)
        for g in admitted:
            waiting.remove(g)
        engine.step(admitted)
        admitting += bool(admitted)
    return start, admitting
