"""Tools that `make test` installs may be missing on a developer's machine, never in CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def skip_or_fail_in_ci(why: str) -> NoReturn:
    """Skip saying why; but fail in CI, where `make test` sets the tools up (containers:
    deploy/podman-setup.sh, a browser: deploy/browser-setup.sh), so a skip there would
    hide a broken setup."""
    if os.environ.get("CI"):
        pytest.fail(f"a tool `make test` installs is missing in CI: {why}")
    pytest.skip(why)
