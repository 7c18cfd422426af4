"""Issue 68's "nothing slower or bigger for float32 models", in one run: TinyLlama-1.1B's
shape (a random bfloat16 checkpoint) imported in float32 and served by two checkouts,
alternating, with perf/sizes.py's own measurements (import wall time and peak RSS, served
RSS, Encode's p50 with one layer's attention at T = 8 / 128 / 512).

    git worktree add --detach /work/base 0f28a1a   # before issue 68's first commit
    PYTHONPATH=. .venv/bin/python research/float32-unchanged/compare.py \
        --tree before=/work/base --tree after=. --rounds 2 --out bench-results/float32-unchanged

`--precision int8` compares the int8 import and its one-session serving instead.

Each child (`python -m attnserve ...`) runs in its checkout's folder, so `-m` finds that
checkout's package first; the harness (this checkout's perf/sizes.py) only times and
samples them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from perf import sizes
from perf.hf_checkpoints import TINYLLAMA_11B, build_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    trees = {name: Path(path).resolve() for name, path in (t.split("=", 1) for t in args.tree)}
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(dir=args.out) as tmp:
        work = Path(tmp).resolve()
        build_checkpoint("llama", work / "hf", perturb=0.0, dtype=torch.bfloat16, **TINYLLAMA_11B)
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                os.chdir(tree)
                os.environ["PYTHONPATH"] = str(tree)
                model_dir = work / "model"
                command = [sys.executable, "-m", "attnserve", "export", "--from-hf"]
                command += [str(work / "hf"), "--precision", args.precision]
                command += ["--out", str(model_dir)]
                run = {"export": sizes.measured(command)}
                run["serve"] = sizes.served(model_dir, work, args.precision)
                shutil.rmtree(model_dir)
                results[name].append(run)
                print(round_, name, json.dumps(run), flush=True)
    (args.out / f"{args.precision}-unchanged.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


def table(results: dict[str, list[dict]]) -> str:
    """Each checkout's best round (smallest wall, peak, RSS and p50) and the ratio to the
    first checkout's."""
    keys = {
        "import s": lambda r: r["export"]["seconds"],
        "import peak GiB": lambda r: r["export"]["peak_gib"],
        "served warm GiB": lambda r: r["serve"]["rss_warm_gib"],
        "after attention GiB": lambda r: r["serve"]["rss_after_attention_gib"],
        **{
            f"p50 T={t} ms": (lambda r, t=t: 1e3 * r["serve"]["p50_s"][str(t)])
            for t in sizes.LENGTHS
        },
    }
    names = list(results)
    lines = ["| | " + " | ".join(names) + " | ratio |", "|---" * (len(names) + 2) + "|"]
    for label, get in keys.items():
        best = [min(get(r) for r in results[name]) for name in names]
        cells = " | ".join(f"{b:.2f}" for b in best)
        lines.append(f"| {label} | {cells} | {best[-1] / best[0]:.3f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
