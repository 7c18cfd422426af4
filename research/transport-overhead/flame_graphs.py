"""Where a short Encode's time goes: CPU per thread of the server and the client, and
py-spy's flame graphs of both.

    python research/transport-overhead/run.py profile --out DIR [--model DIR] [--tokens 8]

Starts the server as its own process (as `run.py grpc` does) and sends Encode
calls of `--tokens` tokens one after another, twice:

1. unobserved: the kernel's count of each thread's time on a CPU
   (/proc/PID/task/TID/schedstat, nanoseconds, system time included), before and
   after, divided by the calls. Python threads are named as py-spy names them;
   the others (ONNX Runtime's pool, gRPC's core) by their OS name.
2. recorded by py-spy (non-blocking, Python frames): profile_server.svg and
   profile_client.svg. gRPC's core and ONNX Runtime are compiled, so their own
   work sits under the Python frame that called them.

Linux only (schedstat); py-spy needs the right to ptrace the server.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from attnserve.bench.default_model import model_dir_or_default
from attnserve.bench.results import progress, save
from attnserve.client import ClientOptions, EncoderClient
from attnserve.service.process import spawn_server

RATE_HZ = 250  # py-spy samples per second and thread
FLAMES = {"server": "profile_server.svg", "client": "profile_client.svg"}
_DUMPED_THREAD = re.compile(r'^Thread (\d+) .*: "(.*)"$', re.MULTILINE)


def py_spy() -> str:
    """The py-spy executable: beside this Python's, or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise RuntimeError("py-spy is not installed: pip install py-spy (the bench extra has it)")
    return found


def cpu_ns(pid: int) -> dict[int, int]:
    """Each thread's time on a CPU so far (ns), by thread id."""
    times = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # the thread ended meanwhile
            times[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return times


def thread_names(pid: int) -> dict[int, str]:
    """Thread id -> name: the Python name where py-spy knows one, else the OS name."""
    names = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # the thread ended meanwhile
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            names[int(tid)] = f"{comm} (not a Python thread)"
    dump = subprocess.run([py_spy(), "dump", "--pid", str(pid)], capture_output=True, text=True)
    if dump.returncode:
        raise RuntimeError(f"py-spy dump failed: {dump.stderr.strip()}")
    names.update({int(tid): name for tid, name in _DUMPED_THREAD.findall(dump.stdout)})
    return names


def cpu_per_call(
    pids: dict[str, int], calls: int, call
) -> tuple[dict[str, dict[str, float]], float]:
    """({process: {thread: CPU ms per call}}, wall ms per call) over `calls` calls."""
    before = {name: cpu_ns(pid) for name, pid in pids.items()}
    start = time.perf_counter()
    for _ in range(calls):
        call()
    wall_ms = (time.perf_counter() - start) / calls * 1e3
    threads = {}
    for name, pid in pids.items():
        after, names = cpu_ns(pid), thread_names(pid)
        by_name: dict[str, float] = defaultdict(float)  # threads of one name are summed
        for tid, ns in after.items():
            by_name[names.get(tid, str(tid))] += (ns - before[name].get(tid, 0)) / calls / 1e6
        threads[name] = {
            thread: round(ms, 4)
            for thread, ms in sorted(by_name.items(), key=lambda kv: -kv[1])
            if ms >= 0.001
        }
    return threads, wall_ms


def record_flames(pids: dict[str, int], seconds: int, out: Path, call) -> int:
    """py-spy's flame graph of each process while `call` runs back to back; the calls made."""
    recorders = {
        name: subprocess.Popen(
            [py_spy(), "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--duration",
             str(seconds), "--threads", "--nonblocking", "--output", str(out / FLAMES[name])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for name, pid in pids.items()
    }  # fmt: skip
    calls, give_up = 0, time.monotonic() + seconds + 60
    while any(r.poll() is None for r in recorders.values()):
        if time.monotonic() > give_up:
            for recorder in recorders.values():
                recorder.kill()
            raise RuntimeError(f"py-spy did not finish a {seconds} s recording")
        call()
        calls += 1
    for name, recorder in recorders.items():
        if recorder.returncode:
            raise RuntimeError(f"py-spy on the {name} failed: {recorder.stderr.read().decode()}")
    return calls


def measure(model_dir: Path, tokens: int, seconds: int, out: Path, log=print) -> dict:
    server = spawn_server(model_dir, "--provider", "cpu")
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=120)) as client:
            client.wait_until_serving(120)
            ids = np.random.default_rng(0).integers(0, 256, tokens)
            call = lambda: client.encode([ids])  # noqa: E731
            start = time.perf_counter()
            for _ in range(200):  # warm, and long enough to know how many calls fill `seconds`
                call()
            calls = max(1, int(seconds * 200 / (time.perf_counter() - start)))
            pids = {"server": server.process.pid, "client": os.getpid()}
            log(f"  CPU per thread over {calls} calls of {tokens} tokens")
            threads, wall_ms = cpu_per_call(pids, calls, call)
            log(f"  py-spy for {seconds} s: {', '.join(FLAMES.values())}")
            recorded = record_flames(pids, seconds, out, call)
    finally:
        server.process.terminate()
        server.process.wait(30)
    return {
        "tokens": tokens,
        "calls": calls,
        "call_ms": round(wall_ms, 4),
        "cpu_ms_per_call": threads,
        "recorded_calls": recorded,
    }


def markdown(result: dict) -> str:
    lines = [
        f"{result['calls']} Encode calls of {result['tokens']} tokens, one after another: "
        f"{result['call_ms']:.2f} ms each. Each thread's time on a CPU per call (the kernel's "
        "count, system time included):",
        "",
        "| process | thread | CPU per call | share of the call's wall time |",
        "|---|---|---|---|",
    ]
    for process, threads in result["cpu_ms_per_call"].items():
        for thread, ms in threads.items():
            lines.append(f"| {process} | {thread} | {ms:.3f} ms | {ms / result['call_ms']:.0%} |")
        total = sum(threads.values())
        lines.append(f"| {process} | all | {total:.3f} ms | {total / result['call_ms']:.0%} |")
    return "\n".join(lines)


def run_profile(out: Path, model_dir: Path | None, tokens: int, seconds: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    with model_dir_or_default(model_dir, progress) as model_dir:
        result = measure(model_dir, tokens, seconds, out, progress)
    save(out, "profile", result, markdown(result))
    return result
