"""MiniLM behind LitServe, the ``litserve`` variant of the ``serve`` scenario, set up as
LitServe's documentation recommends for an embedding model: dynamic batching, the OpenAI
embedding spec (one input per request, as LitServe requires when it batches), one inference
worker and one API server process, ``fast_queue``; the computation is the worker's
(``BareModel``: truncation to 256 tokens, mean pooling, L2 norm, float32 on the CPU).

    python -m benchmarks.serve_litserve --port 8100 --max-batch-size 32 --batch-timeout 0.01
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import litserve as ls
from litserve.specs import OpenAIEmbeddingSpec


class MiniLMAPI(ls.LitAPI):  # type: ignore[misc]
    def setup(self, device: str) -> None:
        import torch

        from benchmarks.models import BareModel, minilm_path

        torch.set_grad_enabled(False)
        self.bare = BareModel(minilm_path())

    def predict(self, inputs: list[str]) -> Any:
        vectors, _ = self.bare.encode(list(inputs), len(inputs))
        return vectors.numpy()

    def encode_response(self, output: Any) -> dict[str, Any]:
        # One input per request: usage is not counted (as inferq's gateway estimates it).
        return {"embeddings": output, "prompt_tokens": 0, "total_tokens": 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_litserve")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-timeout", type=float, default=0.01)
    parser.add_argument("--api-servers", type=int, default=1)
    args = parser.parse_args(argv)
    api = MiniLMAPI(max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout,
                    spec=OpenAIEmbeddingSpec())
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, fast_queue=True)
    server.run(port=args.port, host="127.0.0.1", num_api_servers=args.api_servers,
               generate_client_file=False, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
