#!/usr/bin/env bash
# Build the base images docker-compose.yml and the Dockerfile need, from Debian packages only,
# for hosts that cannot reach an image registry (air-gapped, or this project's CI). Run as root
# with a Docker engine running and a Debian mirror reachable (or MIRROR pointing at one):
#
#   deploy/docker/build-base-images.sh            # python:3.11-slim-bookworm, redis:7,
#                                                 # prom/prometheus:v2.54.1
#
# Each image is `debootstrap`ped Debian bookworm (minbase) plus the packages it needs, imported
# with `docker import` and tagged with the name the compose file uses, so `docker compose build`
# and `docker compose up` then run without pulling anything. Images that already exist are
# kept (FORCE=1 rebuilds). Grafana has no Debian package and is not built here.
set -euo pipefail

MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SUITE="${SUITE:-bookworm}"
WORK="${WORK:-/var/tmp/inferq-base-images}"
PYTHON_IMAGE="${PYTHON_IMAGE:-python:3.11-slim-bookworm}"
REDIS_IMAGE="${REDIS_IMAGE:-redis:7}"
PROMETHEUS_IMAGE="${PROMETHEUS_IMAGE:-prom/prometheus:v2.54.1}"

command -v debootstrap >/dev/null || { echo "needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }
command -v docker >/dev/null || { echo "needs docker (apt-get install docker.io)" >&2; exit 2; }
mkdir -p "$WORK"

have() { [ -z "${FORCE:-}" ] && docker image inspect "$1" >/dev/null 2>&1; }

# A minimal bookworm root (cached), copied per image.
root="$WORK/bookworm-minbase"
if [ ! -x "$root/bin/sh" ]; then
    rm -rf "$root.tmp"
    debootstrap --variant=minbase "$SUITE" "$root.tmp" "$MIRROR"
    rm -rf "$root.tmp/var/cache/apt/archives/"*.deb
    mv "$root.tmp" "$root"
fi

# image TAG "packages..." "docker import --change lines..."
image() {
    local tag="$1" packages="$2"; shift 2
    if have "$tag"; then echo "$tag: exists"; return; fi
    local dir="$WORK/$(echo "$tag" | tr '/:' '__')"
    rm -rf "$dir"
    cp -a "$root" "$dir"
    cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
    chroot "$dir" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -c \
        "apt-get update -q && apt-get install -y -q --no-install-recommends $packages \
         && apt-get clean && rm -rf /var/lib/apt/lists/*"
    if [ -n "${ENTRYPOINT_SCRIPT:-}" ]; then
        printf '%s\n' "$ENTRYPOINT_SCRIPT" > "$dir/usr/local/bin/docker-entrypoint.sh"
        chmod 755 "$dir/usr/local/bin/docker-entrypoint.sh"
    fi
    local changes=()
    for change in "$@"; do changes+=(--change "$change"); done
    tar -C "$dir" -c . | docker import "${changes[@]}" - "$tag"
    rm -rf "$dir"
    echo "$tag: built"
}

# Python 3.11 with venv and pip: the Dockerfile's base (it adds tini itself).
image "$PYTHON_IMAGE" "python3 python3-venv python3-pip ca-certificates" \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    'ENV LANG=C.UTF-8' 'CMD ["python3"]'
# Redis 7 (bookworm ships 7.0): redis-server and redis-cli on PATH, data in /data. As the
# official image, redis-server runs with --protected-mode no: connections through a published
# port come from the bridge, not loopback, and protected mode would refuse them (compose binds
# the port to 127.0.0.1 only).
ENTRYPOINT_SCRIPT='#!/bin/sh
if [ "${1#-}" != "$1" ]; then set -- redis-server "$@"; fi
if [ "$1" = redis-server ]; then set -- "$@" --protected-mode no; fi
exec "$@"' \
image "$REDIS_IMAGE" "redis-server redis-tools" \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    'WORKDIR /data' 'EXPOSE 6379' 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
    'CMD ["redis-server"]'
# Prometheus from Debian's package, with the official image's entrypoint and storage path.
image "$PROMETHEUS_IMAGE" "prometheus" \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    'WORKDIR /prometheus' 'EXPOSE 9090' \
    'ENTRYPOINT ["/usr/bin/prometheus"]' \
    'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]'
