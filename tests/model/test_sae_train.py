"""The default SAE (`attnserve sae train`): the committed one is what its report says, read
by SAELens itself, and training it again from the command is deterministic and gives an SAE
that `attnserve sae add` serves."""

from __future__ import annotations

import json

import pytest
import torch

from attnserve.export.cli import DEFAULT_CHECKPOINT, DEFAULT_SAE
from attnserve.model.checkpoint import load_checkpoint
from attnserve.model.sae_train import activations
from attnserve.model.train import Corpus
from tests.conftest import run_cli


def test_the_committed_sae_explains_what_its_report_says_in_saelens():
    from sae_lens import SAE

    report = json.loads((DEFAULT_SAE / "report.json").read_text())
    sae = SAE.load_from_disk(str(DEFAULT_SAE), device="cpu")
    model = load_checkpoint(DEFAULT_CHECKPOINT).eval()
    config = report["train_config"]
    valid = activations(model, Corpus.load(model.config).validation, config["hook"], 128)
    with torch.no_grad():
        acts = sae.encode(valid)
        rebuilt = sae.decode(acts)
    explained = 1 - (valid - rebuilt).pow(2).sum() / (valid - valid.mean(0)).pow(2).sum()
    # float16 weights against the float32 ones the report measured
    assert float(explained) == pytest.approx(report["validation_explained_variance"], abs=2e-3)
    assert (acts > 0).sum(-1).max() <= config["k"]  # TopK: at most k active
    assert report["dead_features"] == 0 and (DEFAULT_SAE / "sae_weights.safetensors").stat(
    ).st_size < 3 * 2**20  # fmt: skip


def test_training_from_the_command_is_deterministic_and_served(tmp_path, default_export):
    import shutil

    from attnserve.export.sae import add_sae, list_saes

    small = ["--steps", "20", "--d-sae", "256", "--k", "8", "--batch", "512"]
    runs = []
    for name in ("a", "b"):
        result = run_cli("sae", "train", "--out", str(tmp_path / name), *small)
        assert result.returncode == 0, result.stderr
        assert "explains" in result.stdout
        runs.append((tmp_path / name / "sae_weights.safetensors").read_bytes())
    assert runs[0] == runs[1]
    bad = run_cli("sae", "train", "--out", str(tmp_path / "c"), "--hook", "blocks.9.hook_z")
    assert bad.returncode == 2 and "hook: 'blocks.9.hook_z' is not a site" in bad.stderr
    model_dir = shutil.copytree(default_export[0], tmp_path / "model")
    add_sae(model_dir, tmp_path / "a", name="trained", log=lambda _: None)
    served = {sae["name"]: sae["config"] for sae in list_saes(model_dir)}
    assert served["2-res"]["d_sae"] == 2048  # the default export's own
    assert served["trained"] | {"d_sae": 0} == served["2-res"] | {"d_sae": 0, "k": 8}
