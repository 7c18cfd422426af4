"""`python -m perf together`: Encodes and generation on one server, this checkout's engine
against `--ref`'s (the two schedulers per model before it), alternating in one run.

SmolLM2-135M's shape (random float32 weights, built by transformers and imported by each
build's own exporter; `--one-export`: both serve the directory `--ref`'s exporter wrote, so
that only the serving code differs), one server per build, over gRPC. Each round, on each
server in turn:
- alone: an Encode's p50 at T = 8, 128 and 512; one text's decode speed (tokens 2..64 over
  their time); 8 texts' aggregate tokens/s (128 tokens each, all at once);
- an Encode at T = 128 sent while 8 texts generate (one at a time, PAUSE_S apart: each
  alone among the texts, not a stream of Encodes, which the next row is): its p50, against
  its p50 alone (issue 84's target: <= 1.5x);
- 8 texts while Encodes at T = 128 keep arriving one after another (one client, closed
  loop): their aggregate tokens/s against theirs alone (target: >= 0.6x).
The medians over rounds, each server's resident memory at the end, and the ratios of this
checkout to `--ref` (target: Encode p50s and generation within 3%).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from attnserve.bench.results import save
from attnserve.client import AsyncEncoderClient, ClientOptions
from attnserve.service.process import ServerProcess, spawn_server
from perf.hf_checkpoints import SMOLLM2_135M, build_checkpoint
from perf.sizes import tree_rss
from perf.sources import environment, sources_of

BEFORE_ENGINE = "ed4f6bb"  # two schedulers per model (the Batcher and the Generator)
LENGTHS = (8, 128, 512)
PROMPT_TOKENS, TEXTS, TEXT_TOKENS, SOLO_TOKENS = 32, 8, 128, 64
ENCODE_CALLS, MIXED_ENCODES, PAUSE_S = 20, 12, 0.5
ENCODE_TARGET, GENERATION_TARGET, SAME_TARGET = 1.5, 0.6, 0.03
QUICK = dict(SMOLLM2_135M, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)  # fmt: skip
GiB = 2**30


def export(checkpoint: Path, out: Path, src: Path | None) -> None:
    """`attnserve export --from-hf` of `src`'s build (None: this checkout's)."""
    command = [sys.executable, "-m", "attnserve", "export", "--from-hf", str(checkpoint)]
    command += ["--out", str(out), "--max-seq-len", "1024"]
    subprocess.run(command, check=True, capture_output=True, cwd=src, env=environment(src))


class Probe:
    """One server's client, and the measurements of one round on it."""

    def __init__(self, client: AsyncEncoderClient, vocab: int) -> None:
        self.client = client
        self.ids = lambda n, at=0: [(7 * i + 13 * at) % vocab for i in range(n)]

    async def encode_s(self, t: int) -> float:
        start = time.perf_counter()
        await self.client.encode([self.ids(t)])
        return time.perf_counter() - start

    async def text(self, tokens: int, at: int, started: asyncio.Event | None = None) -> list:
        """(arrival time) of each token of one greedy text."""
        times = []
        prompt = self.ids(PROMPT_TOKENS, at)
        options = dict(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        async for _ in self.client.generate(prompt, **options):
            times.append(time.perf_counter())
            if started is not None:
                started.set()
        return times

    async def encode_p50(self, t: int) -> float:
        await self.encode_s(t)  # warm
        return statistics.median([await self.encode_s(t) for _ in range(ENCODE_CALLS)])

    async def solo_decode(self) -> float:
        times = await self.text(SOLO_TOKENS, 0)
        return (len(times) - 1) / (times[-1] - times[0])

    async def texts_rate(self, during: Callable[[], object] | None = None) -> float:
        """8 texts' aggregate tokens/s, from the start to the last token; `during`, a
        coroutine function, runs while they do and is cancelled after."""
        start = time.perf_counter()
        texts = asyncio.gather(*(self.text(TEXT_TOKENS, i + 1) for i in range(TEXTS)))
        side = asyncio.ensure_future(during()) if during else None
        made = await texts
        elapsed = max(t[-1] for t in made) - start
        if side is not None:
            side.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await side
        return sum(len(t) for t in made) / elapsed

    async def encode_while_generating(self) -> float:
        """The p50 of Encodes at T = 128 sent one at a time while 8 texts generate."""
        started = [asyncio.Event() for _ in range(TEXTS)]
        long = TEXT_TOKENS * 4  # they outlast the Encodes
        texts = [asyncio.ensure_future(self.text(long, i + 1, started[i])) for i in range(TEXTS)]
        await asyncio.gather(*(e.wait() for e in started))
        samples = []
        for _ in range(MIXED_ENCODES):
            await asyncio.sleep(PAUSE_S)
            samples.append(await self.encode_s(128))
        for task in texts:
            task.cancel()
        await asyncio.gather(*texts, return_exceptions=True)
        return statistics.median(samples)

    async def encodes_forever(self) -> None:
        while True:
            await self.encode_s(128)

    async def round(self) -> dict:
        row = {f"encode_p50_ms_t{t}": await self.encode_p50(t) * 1e3 for t in LENGTHS}
        row["decode_tokens_per_s_1"] = await self.solo_decode()
        row["tokens_per_s_8"] = await self.texts_rate()
        row["encode_p50_ms_t128_while_8_generate"] = await self.encode_while_generating() * 1e3
        row["tokens_per_s_8_while_encodes"] = await self.texts_rate(self.encodes_forever)
        return row


def measure(servers: dict[str, ServerProcess], vocab: int, rounds: int, log) -> dict:
    async def run() -> dict[str, list[dict]]:
        rows: dict[str, list[dict]] = {name: [] for name in servers}
        async with contextlib.AsyncExitStack() as stack:
            probes = {
                name: Probe(
                    await stack.enter_async_context(
                        AsyncEncoderClient(s.address, ClientOptions(timeout_s=600))
                    ),
                    vocab,
                )
                for name, s in servers.items()
            }
            for r in range(rounds):
                for name, probe in probes.items():
                    log(f"together: round {r + 1}/{rounds}, {name}")
                    rows[name].append(await probe.round())
        return rows

    rows = asyncio.run(run())
    return {
        name: {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]}
        for name, runs in rows.items()
    }


def run_together(
    out: Path, ref: str, rounds: int, quick: bool, log, one_export: bool = False
) -> dict:
    shape = QUICK if quick else SMOLLM2_135M
    with (
        tempfile.TemporaryDirectory(prefix="attnserve-together-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        work = Path(tmp)
        log("together: building SmolLM2-135M's shape and importing it with each build")
        build_checkpoint("llama", work / "hf", perturb=0.0, **shape)
        src = stack.enter_context(sources_of(ref))
        builds = {"before": src, "after": None}
        servers = {}
        for name, source in builds.items():
            model_dir = work / ("before" if one_export else name)
            if not model_dir.exists():
                export(work / "hf", model_dir, source)
            server = spawn_server(
                model_dir, "--provider", "cpu", cwd=source, env=environment(source), timeout=900
            )
            stack.callback(server.process.wait, 120)
            stack.callback(server.process.terminate)
            servers[name] = server
        medians = measure(servers, shape["vocab_size"], rounds, log)
        for name, server in servers.items():
            medians[name]["rss_gib"] = round(tree_rss(server.process.pid) / GiB, 2)
    result = {"ref": ref, "rounds": rounds, "quick": quick, "one_export": one_export}
    result["medians"] = medians
    save(out, "together-one-export" if one_export else "together", result, table(result))
    return result


def table(result: dict) -> str:
    before, after = result["medians"]["before"], result["medians"]["after"]
    lines = [
        f"| SmolLM2-135M's shape, float32, one server | {result['ref']} (two schedulers) "
        "| this checkout (one engine) | ratio |",
        "|---|---|---|---|",
    ]
    for key in before:
        ratio = after[key] / before[key] if before[key] else float("nan")
        lines.append(f"| {key} | {before[key]} | {after[key]} | {ratio:.3f} |")
    encode = after["encode_p50_ms_t128_while_8_generate"] / after["encode_p50_ms_t128"]
    texts = after["tokens_per_s_8_while_encodes"] / after["tokens_per_s_8"]
    old_encode = before["encode_p50_ms_t128_while_8_generate"] / before["encode_p50_ms_t128"]
    old_texts = before["tokens_per_s_8_while_encodes"] / before["tokens_per_s_8"]
    verdict = lambda ok: "met" if ok else "missed"  # noqa: E731
    same = [
        after[k] / before[k] for k in before if k.startswith("encode_p50_ms_t") and "while" not in k
    ]
    slower = max(same)
    rates = [before[k] / after[k] for k in ("decode_tokens_per_s_1", "tokens_per_s_8")]
    lines += [
        "",
        f"An Encode at T = 128 while 8 texts generate: {encode:.2f}x its p50 alone "
        f"({result['ref']}: {old_encode:.2f}x; target <= {ENCODE_TARGET}x: "
        f"{verdict(encode <= ENCODE_TARGET)}). 8 texts while Encodes keep arriving: "
        f"{texts:.2f}x their tokens/s alone ({result['ref']}: {old_texts:.2f}x; target >= "
        f"{GENERATION_TARGET}x: {verdict(texts >= GENERATION_TARGET)}). Alone, this checkout's "
        f"Encode p50s are at most {slower:.3f}x {result['ref']}'s and its generation at most "
        f"{max(rates):.3f}x slower (target within {1 + SAME_TARGET:.2f}x: "
        f"{verdict(slower <= 1 + SAME_TARGET and max(rates) <= 1 + SAME_TARGET)}).",
    ]
    return "\n".join(lines)
