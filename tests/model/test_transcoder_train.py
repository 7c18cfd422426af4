"""The default transcoders (`attnserve sae train-transcoders`): the committed set explains
each layer's MLP as its report says, computed the way circuit-tracer reads the files
(relu(x W_enc^T + b_enc) W_dec + b_dec + x W_skip^T); training again from the command is
deterministic and gives a set that `attnserve sae add` serves with its backward graph."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file

from attnserve.export.cli import DEFAULT_CHECKPOINT, DEFAULT_TRANSCODERS
from attnserve.model.artifacts import backward_files
from attnserve.model.checkpoint import load_checkpoint
from attnserve.model.train import Corpus
from attnserve.model.transcoder_train import mlp_sites
from tests.conftest import run_cli


def test_the_committed_transcoders_explain_what_their_report_says():
    report = json.loads((DEFAULT_TRANSCODERS / "report.json").read_text())
    config = yaml.safe_load((DEFAULT_TRANSCODERS / "config.yaml").read_text())
    assert config["model_kind"] == "transcoder_set"
    model = load_checkpoint(DEFAULT_CHECKPOINT).eval()
    generator = torch.Generator().manual_seed(0)
    # the validation topics' every position (fewer than the report's limit), any order
    valid = mlp_sites(model, Corpus.load(model.config).validation, 128, 10**9, generator)
    assert len(report["layers"]) == model.config.n_layers
    for layer, ((x, y), measured) in enumerate(zip(valid, report["layers"], strict=True)):
        stored = load_file(DEFAULT_TRANSCODERS / f"layer_{layer}.safetensors")
        w = {name: tensor.float() for name, tensor in stored.items()}
        acts = torch.relu(x @ w["W_enc"].T + w["b_enc"])
        rebuilt = acts @ w["W_dec"] + w["b_dec"] + x @ w["W_skip"].T
        explained = 1 - (y - rebuilt).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
        # float16 weights against the float32 ones the report measured
        assert float(explained) == pytest.approx(measured["explained_variance"], abs=5e-3)
        assert float((acts > 0).float().sum(-1).mean()) == pytest.approx(measured["l0"], rel=0.05)
        assert measured["explained_variance"] > 0.8 and measured["l0"] < 100
    size = sum(f.stat().st_size for f in DEFAULT_TRANSCODERS.glob("*.safetensors"))
    assert size < 3 * 2**20  # small enough to commit


def test_training_from_the_command_is_deterministic_and_served(tmp_path, default_export):
    from attnserve.export.sae import list_saes
    from attnserve.export.transcoder_set import add_transcoder_set

    small = ["--steps", "20", "--d-transcoder", "64", "--batch", "512", "--positions", "4096"]
    runs = []
    for name in ("a", "b"):
        result = run_cli("sae", "train-transcoders", "--out", str(tmp_path / name), *small)
        assert result.returncode == 0, result.stderr
        assert "explains" in result.stdout
        runs.append([(tmp_path / name / f"layer_{i}.safetensors").read_bytes() for i in range(4)])
    assert runs[0] == runs[1]
    model_dir = shutil.copytree(default_export[0], tmp_path / "model")
    add_transcoder_set(model_dir, tmp_path / "a", name="trained", log=lambda _: None)
    served = {sae["name"]: sae["config"] for sae in list_saes(model_dir)}
    assert [served[f"{i}-trained"]["d_sae"] for i in range(4)] == [64] * 4
    assert served["1-trained"]["hook_name"] == "blocks.1.hook_resid_mid"
    assert all((model_dir / name).is_file() for name in backward_files("trained"))
    # the default export serves the committed set beside its SAE
    assert {"0-plt", "3-plt", "2-res"} <= set(served)
