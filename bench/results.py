"""Where a benchmark's results go: NAME.json (its numbers) and NAME.md (its table) in the
results folder, which perf/render.py reads back; progress goes to stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def progress(message: str) -> None:
    """A line of progress on stderr (stdout carries the tables)."""
    print(message, file=sys.stderr, flush=True)


def save(out: Path, name: str, result: dict, table: str) -> None:
    """Write `result` and its markdown `table` under `out`, and print the table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text(table + "\n")
    print(table)
