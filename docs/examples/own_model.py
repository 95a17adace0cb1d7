"""Your own model: one subclass of ``inferq.models.Model``.

Serve it (from the folder this file is in) with

    inferq worker --model dbl='python:own_model:Doubler?factor=3' --task double

Run as a script, it loads the model and runs one batch without a queue.
"""

from inferq.models import InvalidInput, Model, ModelInput, RequestPayload


class Doubler(Model):
    tasks = frozenset({"double"})  # the task(s) it serves

    def load(self) -> None:  # once, before serving; options: the spec's ?key=value
        self.factor = float(self.options.get("factor", "2"))

    def prepare_one(self, payload: RequestPayload) -> ModelInput:  # each request, alone
        try:
            value = float(payload.prompt)
        except ValueError:
            raise InvalidInput(f"not a number: {payload.prompt!r}") from None
        return ModelInput(tokens=1, data=value)  # tokens: the length packing sorts by

    def forward(self, batch: list[ModelInput]) -> list[float]:  # one output per request
        return [item.data * self.factor for item in batch]


if __name__ == "__main__":
    model = Doubler(factor="3")
    model.load()
    batch = [model.prepare_one(RequestPayload(id=str(i), task="double", model="dbl", prompt=p))
             for i, p in enumerate(["1", "2.5"])]
    print(model.forward(batch))  # [3.0, 7.5]
