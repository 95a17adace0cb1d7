"""The public model API: your own model in one class (stable across minor versions).

    from inferq.models import Model, ModelInput, RequestPayload, InvalidInput

    class Doubler(Model):
        tasks = frozenset({"double"})

        def load(self) -> None:                       # once, before serving
            self.factor = float(self.options.get("factor", "2"))

        def prepare_one(self, payload: RequestPayload) -> ModelInput:
            return ModelInput(1, float(payload.prompt))   # ValueError -> invalid_input

        def forward(self, batch: list[ModelInput]) -> list[float]:
            return [item.data * self.factor for item in batch]

    inferq worker --model dbl=python:mypkg.models:Doubler?factor=3 --task double

See ``inferq.worker.models.custom`` for the contract and docs/guides/own-model.md.
Importing this module needs neither torch nor a worker: the worker extra is needed to serve.
"""

from __future__ import annotations

from inferq.errors import DeviceOutOfMemory, InvalidInput
from inferq.protocol.codec import RequestPayload
from inferq.worker.models.base import BatchModel, ModelInput
from inferq.worker.models.custom import Model, options_of

__all__ = ["BatchModel", "DeviceOutOfMemory", "InvalidInput", "Model", "ModelInput",
           "RequestPayload", "options_of"]
