"""``CausalLM(weights=False)``: the tokenizer and configs without the weights (what the generate
worker's process holds when the engine process holds the model), with every value the worker
reads equal to a loaded model's, and a clear error where the forward is needed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from inferq.protocol.codec import RequestPayload
from inferq.worker.models.lm import CausalLM, WeightsNotLoaded
from tests.support.tiny import build_tiny_model


def assert_same_as_loaded(path: str, dtype: torch.dtype = torch.float32) -> CausalLM:
    cpu = torch.device("cpu")
    full = CausalLM(path, device=cpu, dtype=dtype, model_id="m")
    bare = CausalLM(path, device=cpu, dtype=dtype, model_id="m", weights=False)
    assert full.has_weights and not bare.has_weights
    for name in ("vocab_size", "max_positions", "eos_ids", "pad_id", "kv", "source", "device",
                 "dtype", "model_id"):
        assert getattr(bare, name) == getattr(full, name), name
    assert bare.kv.bytes_per_token == full.kv.bytes_per_token
    payloads = [RequestPayload(id="a", task="generate", model="m",
                               prompt="What is the capital of France?"),
                RequestPayload.model_validate(
                    {"id": "b", "task": "generate", "model": "m", "prompt": "",
                     "messages": [{"role": "user", "content": "hello there"}]})]
    assert bare.encode(payloads) == full.encode(payloads)
    ids = full.encode(payloads[:1])[0]
    assert isinstance(ids, list)
    assert bare.decode(ids) == full.decode(ids)
    assert (bare.backend is None) == (full.backend is None)
    full.close()
    return bare


def test_the_tiny_llama_without_weights_has_the_loaded_models_values(tiny_path: Path) -> None:
    assert_same_as_loaded(str(tiny_path))
    assert_same_as_loaded(str(tiny_path), torch.bfloat16)  # the KV shape follows the dtype


def test_without_generation_config_json_the_eos_ids_come_from_config_json(
        tiny_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-generation-config"
    shutil.copytree(tiny_path, folder)
    (folder / "generation_config.json").unlink()
    bare = assert_same_as_loaded(str(folder))
    assert bare.eos_ids  # config.json names it


def test_gpt2_without_weights_has_the_loaded_models_values(tmp_path: Path) -> None:
    assert_same_as_loaded(str(build_tiny_model(tmp_path, arch="gpt2")))


def test_smollm2_without_weights_has_the_loaded_models_values() -> None:
    from inferq.worker.models.convert import is_converted, smollm2_folder

    folder = smollm2_folder()
    if not is_converted(folder):
        pytest.skip(f"SmolLM2 is not converted in {folder} (inferq convert-smollm2)")
    assert_same_as_loaded(str(folder))


def test_the_forward_of_a_weightless_lm_fails_saying_why(tiny_path: Path) -> None:
    bare = CausalLM(str(tiny_path), device=torch.device("cpu"), dtype=torch.float32,
                    model_id="tiny", weights=False)
    assert not any(isinstance(v, torch.nn.Module) for v in vars(bare).values())
    for use in (lambda: bare.model, lambda: bare.forward_kwargs(None),
                lambda: bare.attn_implementation):
        with pytest.raises(WeightsNotLoaded, match="model tiny has no weights in this process"):
            use()


def test_a_weightless_worker_side_on_cuda_never_touches_the_device(tiny_path: Path) -> None:
    # What the worker process does with an engine process on a GPU: tokenize, prepare and
    # check generations under the stand-in budget; the real budget needs the weights.
    from inferq.protocol.generation import GenerationParams
    from inferq.worker.generate.engine import Engine
    from inferq.worker.generate.settings import GenerationSettings

    initialized = torch.cuda.is_initialized()  # by another test, on a GPU machine
    cuda = CausalLM(str(tiny_path), device=torch.device("cuda"), dtype=torch.bfloat16,
                    model_id="tiny", weights=False)
    settings = GenerationSettings(max_slots=4, engine_process=True)
    with pytest.raises(WeightsNotLoaded, match="sized from the memory free after the weights"):
        settings.budget(cuda)
    engine = Engine(cuda, settings.provisional_budget(cuda))
    ids = cuda.encode([RequestPayload(id="a", task="generate", model="tiny", prompt="hello")])[0]
    assert isinstance(ids, list)
    g = engine.new_generation("a", ids, GenerationParams(max_new_tokens=8))
    assert engine.fits_alone(g) and g.max_new == 8
    assert GenerationSettings(kv_cache_mb=1).budget(cuda).kv_tokens == (
        2**20 // cuda.kv.bytes_per_token)
    assert torch.cuda.is_initialized() == initialized  # no CUDA context made here
