"""Your own model in one class, served with ``--model NAME=python:package.module:Class``.

``Model`` is the stable, public face of ``BatchModel`` (re-exported as ``inferq.models.Model``).
A subclass fills in at most four things:

* ``tasks``: the tasks it serves (``frozenset({"classify"})``; ``"*"`` for any);
* ``load()``: read weights, build the network; called once in the worker before serving, with
  ``self.device`` already set from ``--device`` and ``self.options`` from the spec's query
  (``python:pkg.mod:Class?weights=/w.npy&classes=3``: every value a string);
* ``prepare_one(payload)``: one request (``payload.prompt``, ``payload.params``) to what
  ``forward`` takes, on a helper thread while the previous batch runs. Return a
  ``ModelInput(tokens, data)`` to tell the packer the request's length, or any value (it then
  counts as one token). Raise ``InvalidInput`` (or ``ValueError``, ``TypeError``, ``KeyError``)
  for a request it cannot take: that request fails alone with ``invalid_input``;
* ``forward(batch)``: the ``data`` of each request in the batch, to one msgpack-serialisable
  output per request, in order. It runs on the model thread; an exception bisects the batch
  until the failing request fails alone (``model_error``, retried within its attempts);
  ``DeviceOutOfMemory`` or torch's out-of-memory error splits the batch and lowers the worker's
  token budget instead, as for the built-in models.

The worker treats a ``Model`` exactly as its built-in models: adaptive windows, length-sorted
packing (by ``tokens``), failure isolation, OOM splitting, leases and metrics.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl

from inferq.errors import ConfigError, InferqError, InvalidInput, ModelLoadError
from inferq.protocol.codec import RequestPayload
from inferq.worker.models.base import BatchModel, ModelInput

#: ``python:package.module:Class``: a user's ``inferq.models.Model`` subclass.
PYTHON_PREFIX = "python:"


class Model(BatchModel):
    """Subclass it: set ``tasks``, override ``load``, ``prepare_one`` and ``forward``."""

    tasks = frozenset({"*"})

    def __init__(self, **options: str) -> None:
        #: The spec's query options (``?key=value``), all strings.
        self.options: dict[str, str] = dict(options)
        #: ``cpu``, ``cuda``, ``cuda:1``, ``mps``: what ``--device`` resolved to.
        self.device = "cpu"
        if not hasattr(self, "model_id"):
            self.model_id = f"python:{type(self).__module__}:{type(self).__qualname__}"

    def load(self) -> None:
        """Load weights and build what ``forward`` needs; runs once before serving."""

    def prepare_one(self, payload: RequestPayload) -> ModelInput | Any:
        """One request to ``forward``'s input (default: its prompt, ~4 characters a token)."""
        return ModelInput(max(1, len(payload.prompt) // 4), payload.prompt)

    def prepare(self, payloads: Sequence[RequestPayload]) -> list[ModelInput | InferqError]:
        out: list[ModelInput | InferqError] = []
        for payload in payloads:
            try:
                item = self.prepare_one(payload)
            except InferqError as exc:
                out.append(exc)
                continue
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                out.append(InvalidInput(f"{type(exc).__name__}: {exc}"))
                continue
            out.append(item if isinstance(item, ModelInput) else ModelInput(1, item))
        return out


def load_python_model(name: str, source: str, device: str) -> BatchModel:
    """``python:package.module:Class[?key=value&...]``: import the class, build it with the
    options, set its device, ``load()`` it. The current folder is importable, as for uvicorn's
    ``module:app``."""
    target, _, query = source[len(PYTHON_PREFIX):].partition("?")
    module_name, sep, class_name = target.partition(":")
    if not sep or not module_name or not class_name:
        raise ConfigError(f"--model {name}={source}: expected python:package.module:Class")
    try:
        options = dict(parse_qsl(query, strict_parsing=True)) if query else {}
    except ValueError as exc:
        raise ConfigError(f"--model {name}={source}: bad options {query!r} ({exc})") from exc
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadError(f"--model {name}={source}: cannot import {module_name!r} ({exc}); "
                             "is it installed or on PYTHONPATH?") from exc
    cls: Any = module
    for part in class_name.split("."):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, BatchModel)):
        raise ConfigError(f"--model {name}={source}: {module_name}.{class_name} is not a "
                          "subclass of inferq.models.Model")
    try:
        model = cls(**options)
    except TypeError as exc:
        raise ConfigError(f"--model {name}={source}: options {sorted(options)} rejected by "
                          f"{class_name}: {exc}") from exc
    model.device = _resolve(device)
    if isinstance(model, Model):
        try:
            model.load()
        except InferqError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"--model {name}={source}: load() failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
    return model


def _resolve(device: str) -> str:
    if device != "auto":
        return device
    try:
        from inferq.worker.models.device import resolve_device
    except ImportError:  # no torch: a numpy model runs on the CPU
        return "cpu"
    return str(resolve_device(device))


def options_of(model: Model, known: Mapping[str, str]) -> dict[str, str]:
    """The model's options with defaults filled in; an unknown option is a ``ConfigError``
    that lists the known ones (for ``load`` to call)."""
    unknown = set(model.options) - set(known)
    if unknown:
        raise ConfigError(f"unknown option(s) {sorted(unknown)} for {type(model).__name__}; "
                          f"known: {', '.join(sorted(known))}")
    return {**known, **model.options}
