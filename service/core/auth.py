"""The bearer-token check both transports make (gRPC metadata, HTTP header)."""

from __future__ import annotations

import hmac

from attnserve.service.core.errors import UnauthenticatedError


def check_bearer(given: str, token: str, where: str) -> None:
    """UnauthenticatedError unless `given` is "Bearer <token>" (compared in constant time)."""
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise UnauthenticatedError(f"missing or wrong {where}")
