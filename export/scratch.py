"""Writing a directory whole or not at all: everything goes into a scratch directory beside
it first, moved in by rename once checked (a model directory, an SAE's)."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class ExportWriteError(OSError):
    """The directory could not be written (a full disk, say); nothing was left behind."""


@contextmanager
def scratch_beside(out: Path) -> Iterator[Path]:
    """A scratch directory beside `out` (same file system: the files move in by rename),
    removed whatever happens; a full disk becomes an ExportWriteError that says so."""
    scratch = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        yield scratch
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            free = shutil.disk_usage(out.parent).free
            raise ExportWriteError(
                exc.errno,
                f"the disk holding {out.parent} is full ({free / 1e9:.1f} GB free after "
                f"removing the partial export): {exc.strerror}; nothing was written to {out}",
            ) from exc
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
