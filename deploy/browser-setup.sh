#!/usr/bin/env bash
# Installs Debian's Chromium for the explorer page's browser tests (Playwright drives it; it
# never downloads a browser of its own). `make test` runs it. Skipped when Chromium is already
# there; without root and apt-get it changes nothing and the browser tests skip, saying why.
set -euo pipefail
say() { echo "browser: $*"; }

if command -v chromium >/dev/null; then
    say "$(chromium --version 2>/dev/null || echo chromium) is installed"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "no chromium, and installing it needs root and apt-get: browser tests will skip"
    exit 0
fi
say "installing chromium (apt-get)"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
say "$(chromium --version)"
