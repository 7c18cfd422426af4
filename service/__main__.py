"""python -m service --model DIR [--port N] [...]: the attnserve gRPC server."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from service.errors import AttnserveError
from service.server import serve
from service.settings import add_settings_arguments, settings_from_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    add_settings_arguments(parser, os.environ)
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("service").info("settings: %s", settings)
    try:
        asyncio.run(serve(settings))
    except (AttnserveError, OSError) as exc:  # model, provider, TLS files, port in use
        logging.getLogger("service").error("cannot serve: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
