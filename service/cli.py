"""`attnserve serve --model DIR [--port N] [...]`: the gRPC server."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from attnserve.service.core.errors import AttnserveError
from attnserve.service.settings import add_settings_arguments, settings_from_args

log = logging.getLogger("attnserve.service")


def add_commands(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve a model directory, or a repository of them, over gRPC and HTTP",
        description="Serve a model directory (--model) or a repository of models "
        "(--model-repository) over gRPC and HTTP until SIGTERM/SIGINT, then drain.",
    )
    add_settings_arguments(serve)
    serve.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from attnserve.service.server import serve

    try:
        settings = settings_from_args(args, os.environ)
    except ValueError as exc:
        print(f"attnserve serve: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log.info("settings: %s", settings)
    try:
        asyncio.run(serve(settings))
    except (AttnserveError, OSError) as exc:  # model, provider, TLS files, port in use
        log.error("cannot serve: %s", exc)
        return 1
    return 0
