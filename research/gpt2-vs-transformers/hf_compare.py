"""A distilgpt2-sized GPT-2 (random weights): ONNX Runtime vs transformers, side by side.

    .venv/bin/python research/gpt2-vs-transformers/hf_compare.py --out DIR [--max-seq-len 1024]

The checkpoint goes through the same import and export as a real one
(save_pretrained -> `export.hf_import` -> model directory), so the numbers are
those of serving such a model. transformers is the reference users trust; it
is only a benchmark and test dependency.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from attnserve.bench.latency import measure_cell
from attnserve.export.hf_import import load_hf
from attnserve.export.model_dir import write_model_dir
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions

DISTILGPT2 = {"n_layer": 6, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257}
PAIRS = {  # ours -> the transformers engine returning the same outputs
    "ort-cpu": "transformers-eager",
    "ort-cpu-emb": "transformers-sdpa",
}


def run_hf_compare(out: Path, max_seq_len: int = 1024, quick: bool = False) -> dict:
    from transformers import GPT2Config, GPT2Model

    log = lambda msg: tqdm.write(msg, file=sys.stderr)  # noqa: E731
    seq_lens = [t for t in (8, 16, 32, 64, 128, 256, 512, 1024) if t <= max_seq_len]
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, model_dir = Path(tmp) / "distilgpt2-sized", Path(tmp) / "model"
        torch.manual_seed(0)
        GPT2Model(GPT2Config(**DISTILGPT2)).eval().save_pretrained(hf_dir)
        write_model_dir(load_hf(hf_dir)[0], model_dir, shapes=[(1, 1), (1, seq_lens[-1])], log=log)
        eager = GPT2Model.from_pretrained(hf_dir, attn_implementation="eager").eval()
        sdpa = GPT2Model.from_pretrained(hf_dir, attn_implementation="sdpa").eval()
        runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))

        def hf(model, attentions: bool):
            def run(ids: np.ndarray) -> object:
                with torch.inference_mode():
                    return model(torch.from_numpy(ids), output_attentions=attentions)

            return run

        engines = {
            "transformers-eager": hf(eager, True),
            "ort-cpu": runtime.run,
            "transformers-sdpa": hf(sdpa, False),
            "ort-cpu-emb": runtime.embed,
        }
        rows = []
        rng = np.random.default_rng(0)
        for t in tqdm(seq_lens, desc="transformers vs ORT", unit="length", file=sys.stderr):
            ids = rng.integers(0, DISTILGPT2["vocab_size"], size=(1, t), dtype=np.int64)
            samples = measure_cell(engines, ids, quick)["samples"]
            p50 = {name: float(np.median(s)) * 1e3 for name, s in samples.items()}
            rows.append({"seq_len": t, **{f"{k}_p50_ms": round(v, 3) for k, v in p50.items()}})
            log(f"  seq_len {t:>4}: " + "  ".join(f"{k} {v:.1f} ms" for k, v in p50.items()))
    result = {"model": DISTILGPT2, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "hf.md").write_text(markdown(result) + "\n")
    print(markdown(result))
    return result


def markdown(result: dict) -> str:
    lines = [
        "| seq len | transformers eager (+attentions) | ORT CPU (+attentions) | ratio "
        "| transformers sdpa (embeddings) | ORT CPU embeddings-only | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        cells = []
        for ours, theirs in PAIRS.items():
            a, b = r[f"{theirs}_p50_ms"], r[f"{ours}_p50_ms"]
            cells.append(f"{a:.2f} ms | {b:.2f} ms | {a / b:.1f}x")
        lines.append(f"| {r['seq_len']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="for hf.json/.md")
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="few repeats (smoke)")
    args = parser.parse_args()
    run_hf_compare(args.out, args.max_seq_len, args.quick)
