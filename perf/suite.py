"""`python -m perf report`'s running half: every benchmark, one after the other, into
one folder of results (render.py turns them into docs/BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

from attnserve.bench.attention import run_attention
from attnserve.bench.default_model import model_dir_or_default
from attnserve.bench.endpoints import run_endpoints
from attnserve.bench.latency import run_latency
from attnserve.bench.results import progress
from attnserve.model.config import ModelConfig
from perf.batching import run_batching
from perf.containers import run_containers
from perf.families import run_families, run_second_round
from perf.features import run_features, run_llama_scope
from perf.generate import run_generate
from perf.interventions import run_interventions
from perf.long import run_long
from perf.oip import run_oip
from perf.peer_env import PEERS_VENV
from perf.peers import run_peers
from perf.perf_analyzer import TOOLS, run_perf_analyzer
from perf.ray_serve import run_ray
from perf.readouts import run_readouts
from perf.repository import run_repository
from perf.sizes import run_sizes
from perf.together import BEFORE_ENGINE, run_together


def run_suite(out: Path, quick: bool = False) -> None:
    """Run every benchmark into `out`. quick: short lengths and runs, no containers (smoke)."""
    run_latency(out, ModelConfig(), 128 if quick else None, [1, 8], quick)
    with model_dir_or_default(None, progress) as model_dir:
        run_endpoints(out, model_dir, 5 if quick else 40, progress)
        run_batching(out, model_dir, 2.0 if quick else 10.0, progress)
        peers = {"duration": 1.0, "blocks": 1, "rounds": 1, "big_map": False} if quick else {}
        run_peers(out, model_dir, log=progress, **peers)
        run_oip(out, model_dir, PEERS_VENV, blocks=1 if quick else 5, log=progress)
        run_perf_analyzer(out, model_dir, TOOLS, progress, quick)
        run_attention(out, model_dir, quick)
        run_repository(out, model_dir, 1 if quick else 3, 3.0 if quick else 15.0, progress)
        run_ray(out, model_dir, 1 if quick else 3, 3.0 if quick else 15.0, progress)
    run_families(out, quick, progress)
    if not quick:  # four 0.6-2.6B models imported and run at 1024 tokens: an hour here
        run_second_round(out, log=progress)
    run_sizes(out, progress, quick=quick)
    if not quick:  # 0.1-8B models imported with SAEs beside them: an hour and more
        run_readouts(out, log=progress)
        run_features(out, log=progress)
        run_llama_scope(out, log=progress)
        run_interventions(out, log=progress)
        run_generate(out, log=progress)
        run_together(out, BEFORE_ENGINE, 3, False, progress)
        run_long(out, log=progress)
    if not quick:  # builds images: too heavy for a smoke run
        run_containers(out, 10.0, progress)
