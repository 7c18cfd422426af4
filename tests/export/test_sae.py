"""`attnserve sae add`: SAELens' SAEs as ONNX graphs beside a model, equal to SAELens'
own `SAE.encode` (the reference, built and saved here with random weights)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from sae_lens import SAE

from attnserve.export.sae import INT8_TOLERANCE, SAEError, add_sae, list_saes
from attnserve.model.artifacts import (
    ATTN_OUTPUTS_NAME,
    READOUTS_ONNX_FILENAME,
    SAE_JSON,
    SAE_ONNX,
    SAE_OUTPUTS,
    SAE_SITE_ONNX,
    WEIGHTS_INDEX_FILENAME,
)
from attnserve.service.core.errors import ModelLoadError
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import SMALL_CONFIG, run_cli

D = SMALL_CONFIG.d_model
D_SAE = 96
LAST = f"blocks.{SMALL_CONFIG.n_layers - 1}.hook_resid_post"  # before the final norm


def saelens_sae(
    tmp_path: Path,
    architecture: str,
    normalize: str = "none",
    d_in: int = D,
    hook: str = LAST,
    threshold: float | None = None,
) -> tuple[SAE, Path]:
    """An SAE built by SAELens, its weights random at the scale trained ones reach, saved
    in SAELens' own format; a jumprelu's thresholds uniform in [0, `threshold`) (default:
    what leaves some of its features off on rows like residual_rows')."""
    cfg = {
        "architecture": architecture,
        "d_in": d_in,
        "d_sae": D_SAE,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": True,
        "normalize_activations": normalize,
        "metadata": {"hook_name": hook},
    }
    if architecture == "topk":
        cfg["k"] = 12
    sae = SAE.from_dict(cfg)
    generator = torch.Generator().manual_seed(len(architecture) + len(normalize))
    with torch.no_grad():
        for parameter in sae.parameters():
            parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
        if architecture == "jumprelu":  # positive thresholds that leave some features off
            if threshold is None:  # normalized rows are about 1 wide
                threshold = 20 if normalize == "none" else 0.5
            sae.threshold.copy_(threshold * torch.rand(D_SAE, generator=generator))
    source = tmp_path / f"{architecture}-{normalize}"
    sae.save_model(source)
    return sae, source


def residual_rows(seed: int = 0) -> torch.Tensor:
    """(2, 9, D) rows as a trained model's residual stream runs: tens, with outlier
    dimensions in the thousands."""
    generator = torch.Generator().manual_seed(seed)
    x = 20 * torch.randn(2, 9, D, generator=generator)
    x[..., [3, 17]] *= 150
    return x


@pytest.mark.parametrize(
    "architecture, normalize",
    [
        ("standard", "none"),
        ("jumprelu", "none"),
        ("topk", "none"),
        ("standard", "constant_norm_rescale"),
        ("jumprelu", "layer_norm"),
    ],
)
def test_the_graph_equals_saelens_encode(model_dir, tmp_path, architecture, normalize):
    sae, source = saelens_sae(tmp_path, architecture, normalize)
    out = add_sae(model_dir, source, log=lambda _: None)
    x = residual_rows()
    with torch.no_grad():
        want = sae.encode(x)  # (B, T, S)
        error = (x - sae.decode(want)).norm(dim=-1)
    k = 20
    session = ort.InferenceSession(str(out / SAE_ONNX), providers=["CPUExecutionProvider"])
    outputs = session.run(
        None, {"x": x.numpy(), "top_k": np.array([k]), "with_error_norm": np.array(True)}
    )
    got = dict(zip(SAE_OUTPUTS, outputs, strict=True))
    want, error = want.numpy(), error.numpy()
    largest = np.abs(want).max(-1, keepdims=True)  # each position's largest activation
    assert (largest > 0).all()
    assert (np.abs(got["activations"] - want) <= 1e-4 * largest).all()
    np.testing.assert_array_equal(got["l0"], (want > 0).sum(-1))
    np.testing.assert_allclose(got["error_norm"], error, rtol=1e-4)
    # the top k: descending, SAELens' strongest features (no ties among random floats),
    # -1 and 0 past the active ones
    order = np.argsort(-want, axis=-1, kind="stable")[..., :k]
    active = np.take_along_axis(want, order, -1) > 0
    np.testing.assert_array_equal(got["top_ids"], np.where(active, order, -1))
    strongest = np.take_along_axis(want, order, -1)
    assert (np.abs(got["top_activations"] - np.where(active, strongest, 0)) <= 1e-4 * largest).all()
    if architecture == "topk":  # fewer than k active: the rest say so
        assert (got["top_ids"][..., 12:] == -1).all() and (got["l0"] == 12).all()
    # with_error_norm false: the same features and no error norm, the decoder unread
    feeds = {"x": x.numpy(), "top_k": np.array([k]), "with_error_norm": np.array(False)}
    encoded = dict(zip(SAE_OUTPUTS, session.run(None, feeds), strict=True))
    assert (encoded.pop("error_norm") == 0).all()
    for name, value in encoded.items():
        np.testing.assert_array_equal(value, got[name])
    graph = onnx.load(str(out / SAE_ONNX), load_external_data=False).graph
    (branch,) = [node for node in graph.node if node.op_type == "If"]
    then = next(a.g for a in branch.attribute if a.name == "then_branch")
    assert "W_dec" in {name for node in then.node for name in node.input}
    assert "W_dec" not in {name for node in graph.node for name in node.input}


def test_an_sae_that_does_not_fit_the_model_is_refused_by_field(model_dir, tmp_path):
    _, wide = saelens_sae(tmp_path, "standard", d_in=D + 1)
    with pytest.raises(SAEError, match=rf"d_in is {D + 1}, but {LAST} is {D} wide"):
        add_sae(model_dir, wide, log=lambda _: None)
    _, elsewhere = saelens_sae(tmp_path, "jumprelu", hook="blocks.7.hook_resid_post")
    with pytest.raises(SAEError, match=r"hook_name 'blocks.7.hook_resid_post' is not a site"):
        add_sae(model_dir, elsewhere, log=lambda _: None)
    _, pattern = saelens_sae(tmp_path, "topk", hook="blocks.0.attn.hook_pattern")
    with pytest.raises(SAEError, match="cannot read attention patterns"):
        add_sae(model_dir, pattern, log=lambda _: None)
    _, queries = saelens_sae(tmp_path, "topk", hook="blocks.0.attn.hook_q")
    served = "attn.hook_z, hook_attn_out, hook_mlp_out, hook_resid_mid, hook_resid_post, "
    with pytest.raises(SAEError, match=f"does not return this site; SAEs are served on {served}"):
        add_sae(model_dir, queries, log=lambda _: None)
    assert list_saes(model_dir) == []  # nothing written
    # hook_z reads the heads flattened: n_heads x head_dim wide
    _, heads = saelens_sae(tmp_path, "standard", hook="blocks.0.attn.hook_z")
    assert add_sae(model_dir, heads, name="z0", log=lambda _: None).is_dir()


def test_an_sae_on_a_site_a_norm_computes_gets_that_norms_graph(model_dir, tmp_path):
    """ln2.hook_normalized and mlp.hook_in are not readouts: `sae add` writes the norm that
    computes them (export/sae_site.py) beside the SAE, from the float32 weights only."""
    _, source = saelens_sae(tmp_path, "standard", hook="blocks.0.ln2.hook_normalized")
    out = add_sae(model_dir, source, name="normed", log=lambda _: None)
    assert (out / SAE_SITE_ONNX).is_file()
    assert 0 <= json.loads((out / SAE_JSON).read_text())["fidelity"]["site"] <= 1e-5
    _, read = saelens_sae(tmp_path, "standard", hook="blocks.0.hook_resid_mid")
    assert not (add_sae(model_dir, read, name="plain", log=lambda _: None) / SAE_SITE_ONNX).exists()
    (model_dir / WEIGHTS_INDEX_FILENAME).unlink()  # as an int8-only export
    _, source = saelens_sae(tmp_path, "standard", hook="blocks.1.mlp.hook_in")
    with pytest.raises(
        SAEError,
        match=r"'blocks\.1\.mlp\.hook_in' is computed by the model's "
        r"blocks\.1\.ln2, whose weights are read from the float32 export",
    ):
        add_sae(model_dir, source, name="again", log=lambda _: None)  # fmt: skip


def test_sae_add_and_list_on_the_command_line(model_dir, tmp_path):
    _, source = saelens_sae(tmp_path, "jumprelu")
    added = run_cli("sae", "add", str(model_dir), str(source), "--name", "resid")
    assert added.returncode == 0, added.stderr
    assert (model_dir / "saes" / "resid" / SAE_JSON).is_file()
    # its own progress only: what it traces, checks and wrote (not the exporter's logging)
    lines = (added.stdout + added.stderr).strip().splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["tracing", "checking:", "wrote"], lines
    listed = run_cli("sae", "list", str(model_dir))
    assert listed.stdout.strip() == f"resid: jumprelu, {D_SAE} features on {LAST} (d_in {D})"
    again = run_cli("sae", "add", str(model_dir), str(source), "--name", "resid")
    assert again.returncode == 1 and "exists: choose another --name" in again.stderr
    missing = run_cli("sae", "add", str(model_dir), str(tmp_path))
    assert missing.returncode == 1 and "no cfg.json" in missing.stderr
    outside = run_cli("sae", "add", str(model_dir), str(source), "--name", "../escape")
    assert outside.returncode == 1 and "name '../escape': letters" in outside.stderr
    assert not (model_dir / "escape").exists()


@pytest.mark.parametrize("architecture", ["jumprelu", "standard"])
def test_an_sae_in_eight_bits_states_its_fidelity(model_dir, tmp_path, architecture):
    """`--precision int8`: the matrices in 8 bits (MatMulNBits), a quarter of the bytes,
    within INT8_TOLERANCE of SAELens' activations; what the check measured is recorded."""
    sae, source = saelens_sae(tmp_path, architecture)
    out = add_sae(model_dir, source, name="eight", precision="int8", log=lambda _: None)
    float32 = add_sae(model_dir, source, name="float32", log=lambda _: None)
    info = json.loads((out / SAE_JSON).read_text())
    assert info["precision"] == "int8"
    assert 1e-4 < info["fidelity"]["activations"] <= INT8_TOLERANCE  # 8 bits, not float32
    size = {
        path.name: sum(f.stat().st_size for f in path.glob("*.data")) for path in (out, float32)
    }
    assert size["eight"] < 0.5 * size["float32"]  # 8 bits and a scale per 32; biases stay
    session = ort.InferenceSession(str(out / SAE_ONNX), providers=["CPUExecutionProvider"])
    ops = {
        node.op_type for node in onnx.load(str(out / SAE_ONNX), load_external_data=False).graph.node
    }
    assert "MatMulNBits" in ops
    x = residual_rows(4)
    got = dict(
        zip(
            SAE_OUTPUTS,
            session.run(
                None, {"x": x.numpy(), "top_k": np.array([5]), "with_error_norm": np.array(True)}
            ),
            strict=True,
        )
    )
    with torch.no_grad():
        want = sae.encode(x).numpy()
        pre = sae.run_with_cache(x)[1]["hook_sae_acts_pre"].numpy()
    largest = np.abs(want).max(-1, keepdims=True)
    # features 8 bits' worth from their threshold may switch: left out (ReLU's are continuous)
    near = np.zeros_like(pre, dtype=bool)
    if architecture == "jumprelu":
        near = np.abs(pre - sae.threshold.detach().numpy()) <= INT8_TOLERANCE * largest
    assert near.mean() < 0.1
    diff = np.where(near, 0, np.abs(got["activations"] - want))
    assert (diff <= INT8_TOLERANCE * largest).all()


def test_a_directory_whose_readouts_lack_a_site_refuses_its_saes(model_dir, tmp_path):
    """A directory written before the readouts graph returned hook_attn_out: `sae add`
    refuses an SAE on it, and a server refuses to load one placed there by hand."""
    _, source = saelens_sae(tmp_path, "standard", hook="blocks.0.hook_attn_out")
    add_sae(model_dir, source, name="attn", log=lambda _: None)  # before: taken
    readouts = model_dir / READOUTS_ONNX_FILENAME
    graph = onnx.load(str(readouts), load_external_data=False)  # weights stay where they are
    kept = [output for output in graph.graph.output if output.name != ATTN_OUTPUTS_NAME]
    del graph.graph.output[:]
    graph.graph.output.extend(kept)
    readouts.unlink()  # a link to the session's directory
    onnx.save(graph, str(readouts))
    with pytest.raises(SAEError, match=r"'blocks\.0\.hook_attn_out': this model directory's"):
        add_sae(model_dir, source, name="again", log=lambda _: None)
    with pytest.raises(ModelLoadError, match=r"reads blocks\.0\.hook_attn_out, which this"):
        OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
