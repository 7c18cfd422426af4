"""Plain Encode and V2 ModelInfer against bd2c4da's server, in one run: does the core's own
request types and the table-driven V2 translation (issue 67) cost a request anything?

Each commit's server serves the default model as its own code exported it; short calls
alternate between the two servers in blocks (attnserve.bench.timing.repeated), three runs.

    PYTHONPATH=. .venv/bin/python research/core-types-cost/measure.py OLD_MODEL_DIR NEW_MODEL_DIR
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

import numpy as np

from attnserve.bench.timing import p50_ms, repeated
from attnserve.client import ClientOptions, EncoderClient, OipClient
from attnserve.service.process import spawn_server
from perf.sources import environment, sources_of

REF = "bd2c4da"  # issue 67's base
LENGTHS = (8, 128)


def main(old_model: Path, new_model: Path) -> None:
    with contextlib.ExitStack() as stack:
        src = stack.enter_context(sources_of(REF))
        servers = {
            REF: spawn_server(old_model, "--provider", "cpu", cwd=src, env=environment(src)),
            "this checkout": spawn_server(new_model, "--provider", "cpu"),
        }
        for server in servers.values():
            stack.callback(server.process.wait, 60)
            stack.callback(server.process.terminate)
        options = ClientOptions(timeout_s=300)
        encode = {
            k: stack.enter_context(EncoderClient(s.address, options)) for k, s in servers.items()
        }
        infer = {
            k: stack.enter_context(OipClient(s.address, options, shared_memory=False))
            for k, s in servers.items()
        }
        rng = np.random.default_rng(0)
        for t in LENGTHS:
            ids = rng.integers(1, 256, size=t).tolist()
            for api, clients in (("Encode", encode), ("V2 ModelInfer", infer)):
                for run in range(3):
                    calls = {
                        name: functools.partial(c.encode, [ids])
                        if api == "Encode"
                        else functools.partial(c.infer, [ids])
                        for name, c in clients.items()
                    }
                    times = repeated(calls, 40)
                    old, new = p50_ms(times[REF]), p50_ms(times["this checkout"])
                    print(
                        f"{api}, {t} tokens, run {run}: {REF} {old:.3f} ms, this checkout "
                        f"{new:.3f} ms, ratio {new / old:.3f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
