#!/usr/bin/env bash
# Makes docker-compose.yml runnable where no Docker engine exists, as on this project's CI
# machines: installs podman, lets containers start on a host without
# systemd or rlimit rights, and builds the python:3.11-slim base image locally when no image
# registry can be reached. `make test` runs it. Each step is skipped when already done; without
# root and apt-get it changes nothing and the container tests skip, saying why.
set -euo pipefail

BASE_IMAGE=docker.io/library/python:3.11-slim
say() { echo "containers: $*"; }

if docker info >/dev/null 2>&1; then
    say "a Docker engine answers; nothing to set up"
    exit 0
fi

can_install() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }
apt_updated=""
apt_install() {
    [ -n "$apt_updated" ] || { apt-get update -qq; apt_updated=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v podman >/dev/null; then
    if ! can_install; then
        say "no podman, and installing it needs root and apt-get: container tests will skip"
        exit 0
    fi
    say "installing podman (apt-get)"
    apt_install podman runc debootstrap
fi

if ! podman image exists "$BASE_IMAGE"; then
    # A registry, where one is reachable; otherwise Debian bookworm (Python 3.11) from its
    # package mirror, tagged with the official name so `FROM python:3.11-slim` finds it.
    if ! timeout 60 podman pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
        can_install || { say "cannot make $BASE_IMAGE without root"; exit 0; }
        command -v debootstrap >/dev/null || apt_install debootstrap
        rootfs=$(mktemp -d)
        trap 'rm -rf "$rootfs"' EXIT
        say "no registry: building $BASE_IMAGE with debootstrap (about a minute)"
        debootstrap --variant=minbase \
            --include=python3,python3-venv,python-is-python3,ca-certificates \
            bookworm "$rootfs" >/dev/null
        # Package registries are reached through this host's CA bundle.
        cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
        tar -C "$rootfs" -c . | podman import -q - localhost/debian-python:bookworm >/dev/null
        podman tag localhost/debian-python:bookworm "$BASE_IMAGE"
    fi
fi

# Without systemd and rlimit rights containers fail to start ("cgroups in hybrid mode",
# "setrlimit ... not permitted"); runc with no default ulimits works. Only written if needed.
if ! podman run --rm "$BASE_IMAGE" true >/dev/null 2>&1; then
    conf=/etc/containers/containers.conf
    if [ -e "$conf" ] || ! can_install; then
        say "podman cannot start containers and $conf is not ours to change:"
        podman run --rm "$BASE_IMAGE" true || true
        exit 0
    fi
    say "writing $conf (runc, no default ulimits)"
    command -v runc >/dev/null || apt_install runc
    mkdir -p /etc/containers
    printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n' >"$conf"
    podman run --rm "$BASE_IMAGE" true
fi
say "podman $(podman --version | awk '{print $3}') runs containers from $BASE_IMAGE"
