"""onnxruntime-genai's side of `python -m perf generate`, run in its own environment
(.venv-genai): build its model of a checkpoint with its own builder, or time its greedy
generation; one JSON line out.

    python genai_driver.py build HF_DIR OUT_DIR
    python genai_driver.py time MODEL_DIR PROMPT_IDS NEW_TOKENS REPEATS
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time


def build(source: str, out: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", source, "-o", out,
         "-p", "fp32", "-e", "cpu"],
        check=True,
    )  # fmt: skip


def timed(model_dir: str, prompt: list[int], new_tokens: int, repeats: int) -> dict:
    """Each run's time to the first new token and to the last, and the tokens."""
    import onnxruntime_genai as og

    model = og.Model(model_dir)
    runs = []
    tokens: list[int] = []
    for _ in range(repeats + 1):  # the first run warms up
        params = og.GeneratorParams(model)
        params.set_search_options(
            max_length=len(prompt) + new_tokens, min_length=len(prompt) + new_tokens,
            do_sample=False,
        )  # fmt: skip
        start = time.perf_counter()
        generator = og.Generator(model, params)
        generator.append_tokens([prompt])
        generator.generate_next_token()
        first = time.perf_counter()
        tokens = [int(generator.get_next_tokens()[0])]
        while not generator.is_done():
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
        end = time.perf_counter()
        runs.append({"first_s": first - start, "total_s": end - start, "tokens": len(tokens)})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"runs": runs[1:], "token_ids": tokens, "version": og.__version__, "peak_rss": peak}


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "build":
        build(*rest)
    else:
        model_dir, ids, n, repeats = rest
        print(json.dumps(timed(model_dir, json.loads(ids), int(n), int(repeats))))
