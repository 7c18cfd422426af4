"""Before and after, in one run: this checkout's server against an earlier commit's.

The earlier commit's sources come out of git (`git archive`) into a scratch
folder, and its own code exports its own default model and serves it. This
checkout does the same with its own code. Short Encode calls then alternate
between the two servers and a bare echo of the same bytes (echo.py), and
each server's own timing of every call splits it in two: inside the server
(from receiving the request to having its answer ready, the model's run
included) and outside it (transport, gRPC call handling, client decoding).
Finer splits are not comparable across versions: how the server times its
model run has changed (it used to include the hand-offs to its worker thread).
One client talks to both: the API has only grown fields since.

The default REF is the last commit before issue 12's work on the transport:
issue 11's data path, the HTTP API and the trained default model, nothing of
issue 12's.

    python research/transport-overhead/run.py before-after --out DIR [--ref REF]
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from echo import EchoServer, request_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks
from attnserve.bench.results import progress, save
from attnserve.bench.timing import p50_ms, repeated
from attnserve.client import ClientOptions, EncoderClient
from attnserve.client.codec import build_request
from attnserve.service.process import spawn_server
from perf.sources import environment, sources_of

ISSUE_12_BASE = "0e43d7121399723bc22eb529e11c59f4d4a1c319"
SEQ_LENS = (8, 16, 32, 64, 128)
VERSIONS = ("before", "after")
PLOT = "before_after.png"


def export_default_model(src: Path | None, out: Path, log: Callable[[str], None]) -> Path:
    """The default model, exported into `out` by `src`'s code (None: this checkout's)."""
    log(f"  {out.name}: exporting the default model with its own code")
    command = [sys.executable, "-m", "attnserve", "export", "--out", str(out)]
    done = subprocess.run(command, cwd=src, env=environment(src), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    return out


def measure(ref: str, max_seq_len: int, quick: bool, log: Callable[[str], None]) -> dict:
    rows = []
    with contextlib.ExitStack() as stack:
        src = stack.enter_context(sources_of(ref))
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="attnserve-")))
        sources = {"before": src, "after": None}
        servers = {}
        for name, code in sources.items():
            model_dir = export_default_model(code, scratch / name, log)
            servers[name] = spawn_server(
                model_dir, "--provider", "cpu", cwd=code, env=environment(code)
            )
            stack.callback(servers[name].process.wait, 30)
            stack.callback(servers[name].process.terminate)
        echo = EchoServer()
        stack.callback(echo.close)
        options = ClientOptions(timeout_s=120)
        clients = {name: EncoderClient(s.address, options) for name, s in servers.items()}
        for client in clients.values():
            stack.callback(client.close)
            client.wait_until_serving(120)
        vocab_size = clients["after"].model_info()["vocab_size"]
        rng = np.random.default_rng(0)
        for t in [t for t in SEQ_LENS if t <= max_seq_len]:
            ids = rng.integers(0, vocab_size, size=t, dtype=np.int64)
            # The echo moves the bytes of this checkout's Encode call, both ways.
            same_bytes = request_for(
                build_request([ids]).SerializeToString(),
                clients["after"].encode([ids]).response.ByteSize(),
            )
            served: dict[str, list] = {name: [] for name in VERSIONS}
            calls = {name: functools.partial(c.encode, [ids]) for name, c in clients.items()}
            times = repeated(
                {**calls, "bare": functools.partial(echo.call, "Echo", same_bytes)},
                repeats=5 if quick else 50,
                answers=served,
            )
            row = {"seq_len": t, "bare_grpc_p50_ms": round(p50_ms(times["bare"]), 4)}
            for name in VERSIONS:
                encode = round(p50_ms(times[name]), 4)
                inside = round(p50_ms([a.total_ns / 1e9 for a in served[name]]), 4)
                row[name] = {
                    "encode_p50_ms": encode,
                    "inside_p50_ms": inside,
                    "outside_p50_ms": round(encode - inside, 4),
                    "outside_to_bare": round((encode - inside) / row["bare_grpc_p50_ms"], 2),
                }
            rows.append(row)
            b, a = row["before"], row["after"]
            log(
                f"  seq_len {t:>4}: Encode {b['encode_p50_ms']:.2f} -> {a['encode_p50_ms']:.2f} ms;"
                f" inside the server {b['inside_p50_ms']:.2f} -> {a['inside_p50_ms']:.2f} ms,"
                f" outside it {b['outside_to_bare']:.2f}x -> {a['outside_to_bare']:.2f}x"
                f" the bare round trip ({row['bare_grpc_p50_ms']:.2f} ms)"
            )
    return {"ref": ref, "rows": rows}


COLUMNS = {  # the markdown's column pairs: before | after
    "Encode p50": ("encode_p50_ms", "{:.2f} ms"),
    "inside the server": ("inside_p50_ms", "{:.2f} ms"),
    "outside it": ("outside_p50_ms", "{:.2f} ms"),
    "outside / bare": ("outside_to_bare", "{:.2f}x"),
}
PARTS = {  # the plot's stacked parts
    "inside the server: request received to answer ready (the model's run included)": (
        "inside_p50_ms"
    ),
    "outside it: transport, gRPC call handling, client decoding": "outside_p50_ms",
}


def markdown(result: dict) -> str:
    header = "".join(f" {title}: before | after |" for title in COLUMNS)
    lines = [f"| seq len |{header} bare gRPC, same bytes |", "|---" * (2 + 2 * len(COLUMNS)) + "|"]
    for r in result["rows"]:
        cells = "".join(
            f" {form.format(r['before'][key])} | {form.format(r['after'][key])} |"
            for key, form in COLUMNS.values()
        )
        lines.append(f"| {r['seq_len']} |{cells} {r['bare_grpc_p50_ms']:.2f} ms |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    """Per length, before and after side by side, each split into PARTS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    x = np.arange(len(rows))
    width = 0.38
    fig, ax = plt.subplots(figsize=(11, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for offset, name, hatch in ((-width / 2, "before", "//"), (width / 2, "after", "")):
        bottom = np.zeros(len(rows))
        for colour, (part, key) in zip(colours, PARTS.items(), strict=False):
            values = np.array([max(0.0, r[name][key]) for r in rows])
            label = part if name == "after" else None
            ax.bar(x + offset, values, width, bottom=bottom, color=colour, hatch=hatch, label=label)
            bottom += values
    ax.plot(
        x, [r["bare_grpc_p50_ms"] for r in rows], "k_", markersize=40, label="bare gRPC round trip"
    )
    ax.set_xticks(x, [f"{r['seq_len']}\nbefore | after" for r in rows])
    ax.set_xlabel("tokens (batch 1, embeddings only)")
    ax.set_ylabel("ms (medians, stacked)")
    ax.set_title(f"Where one Encode's time goes: {result['ref'][:7]} (hatched) and this checkout")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_before_after(out: Path, ref: str, max_seq_len: int, quick: bool) -> dict:
    progress(f"before ({ref[:12]}) and after (this checkout), alternating")
    result = measure(ref, max_seq_len, quick, progress)
    save(out, "before_after", result, markdown(result))
    plot(result, out / PLOT)
    return result
