"""Where the two cores go under the saturated mix: the CPU time of each of the server's
threads (from /proc) and of the client's process, over the peers benchmark's closed loop
(64 in flight, lengths uniform in 8..512), per second of the run and per request.

    PYTHONPATH=. .venv/bin/python research/per-request-path/saturated_cpu.py [server flags]

The server's threads carry no names the kernel sees: the event loop is the process's main
thread; the batcher's lanes are the busiest of the rest.
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import time
from pathlib import Path

from saturated_profile import MIX, closed_loop, saturated_server  # beside this script

SECONDS = 10.0
TICKS = os.sysconf("SC_CLK_TCK")


def thread_seconds(pid: int) -> dict[str, float]:
    """Each thread's user + system CPU seconds so far, by thread id ("main": the process's)."""
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the name, which may hold spaces
        seconds["main" if tid == str(pid) else tid] = (int(fields[11]) + int(fields[12])) / TICKS
    return seconds


def own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    with saturated_server(*sys.argv[1:]) as server:
        before, client_before = thread_seconds(server.process.pid), own_seconds()
        start = time.perf_counter()
        records, _ = closed_loop(server.address, SECONDS)
        wall = time.perf_counter() - start
        after, client = thread_seconds(server.process.pid), own_seconds() - client_before
    used = collections.Counter({tid: s - before.get(tid, 0.0) for tid, s in after.items()})
    requests = sum(r.status == "OK" for r in records)
    tokens = sum(MIX[r.kind].seq_len for r in records if r.status == "OK")
    print(f"{tokens / wall:.0f} tokens/s, {requests / wall:.1f} requests/s")
    print(f"{'':22s} {'cores':>6s} {'ms a request':>13s}")
    rows = [(f"server thread {tid}", s) for tid, s in used.most_common() if s >= 0.05]
    rows += [("client's process", client)]
    for name, seconds in rows:
        print(f"{name:22s} {seconds / wall:6.2f} {seconds / requests * 1e3:13.2f}")
    print(f"{'wall':22s} {wall:6.1f} s, {len(os.sched_getaffinity(0))} cores")


if __name__ == "__main__":
    main()
