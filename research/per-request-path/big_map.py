"""Where SmolLM2-135M's full 1024-token map (float16 causal-packed, 286 MB) spends its time:
the server's own account (timings.total_ns, inference_ns) and its page faults beside the
client's wall time, and py-spy's samples of the server over the calls (printed as
profile_server.py prints them).

    PATH=.venv/bin:$PATH PYTHONPATH=. python research/per-request-path/big_map.py WORK_DIR
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from profile_server import PY_SPY, summary  # beside this script: on sys.path when it runs

from attnserve.client import AsyncEncoderClient, ClientOptions
from attnserve.service.process import spawn_server
from attnserve.service.settings import Settings
from perf.hf_checkpoints import SMOLLM2_135M, build_checkpoint

OPTIONS = {"attention": True, "attention_dtype": "float16", "attention_layout": "causal-packed"}
LIMITS = ("--max-message-bytes", str(2**31 - 1), "--max-inflight-bytes", str(8 * 2**30))


def page_faults(pid: int) -> int:
    """The minor page faults a process has taken so far (/proc/PID/stat's minflt)."""
    return int(Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[7])


async def calls(address: str, pid: int, raw: Path) -> None:
    """Calls after a pause shorter and one longer than the server's idle wait before it gives
    memory back: the server's page faults per call say whether the answer's buffers were
    reused or faulted in afresh."""
    options = ClientOptions(timeout_s=600, max_message_bytes=2**31 - 1)
    client = AsyncEncoderClient(address, options)
    ids = list(range(3, 1027))
    await client.encode([ids], **OPTIONS)  # warm
    spy = [PY_SPY, "record", "--pid", str(pid), "--rate", "100", "--duration", "45"]
    spy += ["--threads", "--nonblocking", "--format", "raw", "-o", str(raw)]
    recorder = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for pause in (0.0, 4.0, Settings.release_after_idle_s + 3.0):
        await asyncio.sleep(pause)
        faults, start = page_faults(pid), time.perf_counter()
        out = await client.encode([ids], **OPTIONS)
        print(
            f"after {pause:g} s idle: call {time.perf_counter() - start:.2f} s; the server's "
            f"total {out.total_ns / 1e9:.2f} s, of which the batch {out.inference_ns / 1e9:.2f}"
            f" s; {page_faults(pid) - faults:,} page faults in the server"
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
    summary(work / "server.raw", top=25)


if __name__ == "__main__":
    main()
