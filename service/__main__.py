"""python -m service --model DIR

Until the gRPC server lands, this loads the model, runs one text through it
and prints what came back: the same path a request will take.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import numpy as np

from model.tokenizer import get_tokenizer
from service.errors import AttnserveError
from service.runtime import OrtRuntime
from service.settings import add_settings_arguments, settings_from_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m service",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_settings_arguments(parser, os.environ)
    parser.add_argument("--text", default="attention is all you need", help="text to encode")
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("service").info("settings: %s", settings)

    try:
        runtime = OrtRuntime(settings.model_dir, settings.runtime_options)
        runtime.warmup()
        config = runtime.config
        ids = get_tokenizer(config).encode(args.text)
        start = time.perf_counter()
        embeddings, attentions = runtime.run(np.array([ids], dtype=np.int64))
        elapsed_ms = (time.perf_counter() - start) * 1e3
    except AttnserveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    print(
        f"model      {config.name}: {config.n_layers} layers, {config.n_heads} heads, "
        f"d_model {config.d_model}, max_seq_len {config.max_seq_len} ({runtime.provider})"
    )
    print(f"text       {args.text!r} -> {len(ids)} tokens")
    print(
        f"embeddings {embeddings.shape} {embeddings.dtype}, "
        f"token 0 starts {np.array2string(embeddings[0, 0, :4], precision=4)}"
    )
    print(
        f"attentions {attentions.shape} {attentions.dtype}, "
        f"rows sum to 1 within {np.abs(attentions.sum(-1) - 1).max():.1e}"
    )
    print(f"inference  {elapsed_ms:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
