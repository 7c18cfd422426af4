"""How often a fresh process computes a rotary cos table differently (research/rope-tables).

    .venv/bin/python research/rope-tables/measure.py [--runs 30]

Runs a probe in `runs` fresh processes, unpinned (two threads) and pinned to one CPU, for
torch's float32 and float64 cos and numpy's float64 cos of the same float32 angles (256
positions x 12 dims, Llama's half-split layout, theta 10,000), and counts the distinct tables
each made and their largest error against float64.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys

PROBE = """
import hashlib, json, sys
import numpy as np, torch
inv_freq = 10000 ** -(torch.arange(0, 12, 2).float() / 12)
ang = torch.arange(256, dtype=torch.float)[:, None] * inv_freq[None]
ang = torch.cat((ang, ang), -1)
truth = np.cos(ang.numpy().astype(np.float64))
tables = {
    "torch float32": ang.cos().numpy(),
    "torch float64": ang.double().cos().float().numpy(),
    "numpy float64": truth.astype(np.float32),
}
print(json.dumps({k: [hashlib.sha256(t.tobytes()).hexdigest()[:8], float(np.abs(t - truth).max())]
                  for k, t in tables.items()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    for pinned in (False, True):
        seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for _ in range(runs):
            command = [sys.executable, "-c", PROBE]
            if pinned:
                command = ["taskset", "-c", "0", *command]
            out = json.loads(subprocess.run(command, capture_output=True, text=True).stdout)
            for kind, (digest, error) in out.items():
                seen[kind][f"{digest} (max error {error:.2e})"] += 1
        print("pinned to one CPU" if pinned else "unpinned (two threads)")
        for kind, tables in seen.items():
            print(f"  {kind}: {dict(tables)}")


if __name__ == "__main__":
    main()
