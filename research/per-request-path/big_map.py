"""Where SmolLM2-135M's full 1024-token map (float16 causal-packed, 286 MB) spends its time:
the server's own account (timings.total_ns, inference_ns) beside the client's wall time,
and py-spy's samples of the server over two calls (printed as profile_server.py prints them).

    PYTHONPATH=. .venv/bin/python research/per-request-path/big_map.py WORK_DIR
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from attnserve.client import AsyncEncoderClient, ClientOptions
from attnserve.service.process import spawn_server
from benchmarks.hf_checkpoints import SMOLLM2_135M, build_checkpoint

OPTIONS = {"attention": True, "attention_dtype": "float16", "attention_layout": "causal-packed"}
LIMITS = ("--max-message-bytes", str(2**31 - 1), "--max-inflight-bytes", str(8 * 2**30))


async def calls(address: str, pid: int, raw: Path) -> None:
    options = ClientOptions(timeout_s=600, max_message_bytes=2**31 - 1)
    client = AsyncEncoderClient(address, options)
    ids = list(range(3, 1027))
    await client.encode([ids], **OPTIONS)  # warm
    spy = ["py-spy", "record", "--pid", str(pid), "--rate", "100", "--duration", "25"]
    spy += ["--threads", "--nonblocking", "--format", "raw", "-o", str(raw)]
    recorder = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(2):
        start = time.perf_counter()
        out = await client.encode([ids], **OPTIONS)
        print(
            f"call {time.perf_counter() - start:.2f} s; the server's total "
            f"{out.total_ns / 1e9:.2f} s, of which the batch {out.inference_ns / 1e9:.2f} s"
        )
    recorder.wait()


def main() -> None:
    work = Path(sys.argv[1])
    model_dir = work / "model"
    if not model_dir.exists():
        build_checkpoint("llama", work / "hf", perturb=0.0, **SMOLLM2_135M)
        export = [sys.executable, "-m", "attnserve", "export", "--from-hf", str(work / "hf")]
        export += ["--out", str(model_dir), "--max-seq-len", "1024"]
        subprocess.run(export, check=True, capture_output=True)
    server = spawn_server(model_dir, "--provider", "cpu", *LIMITS)
    try:
        asyncio.run(calls(server.address, server.process.pid, work / "server.raw"))
    finally:
        server.process.terminate()
        server.process.wait(30)
    sys.path.insert(0, str(Path(__file__).parent))
    from profile_server import summary  # this folder's

    summary(work / "server.raw", top=25)


if __name__ == "__main__":
    main()
