"""The model a benchmark runs when it is given none: the default config, seed 0, exported
into a temporary directory (torch is imported only then)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def model_dir_or_default(model_dir: Path | None, log: Callable[[str], None]) -> Iterator[Path]:
    """`model_dir` as it is, or the default model exported for the `with` block's length."""
    if model_dir is not None:
        yield model_dir
        return
    from attnserve.export.model_dir import write_model_dir
    from attnserve.model.config import ModelConfig
    from attnserve.model.encoder import build_encoder

    with tempfile.TemporaryDirectory() as tmp:
        write_model_dir(build_encoder(ModelConfig()), Path(tmp), shapes=[(1, 1)], log=log)
        yield Path(tmp)
