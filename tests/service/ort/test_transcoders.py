"""Transcoders served like SAEs (`attnserve sae add`): read at their input site, their
reconstruction error against their output site, as SAELens' transcoders compute them on
transformers' own values: SAELens' four transcoder architectures from their directories,
and circuit-tracer's transcoder set (config.yaml and a safetensors file per layer, its
layout: W_enc (d_transcoder, d_model)) checked against SAELens' transcoder of the same
weights, whose arithmetic is circuit-tracer's (a JumpReLU's thresholds positive)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import yaml
from sae_lens import SAE
from safetensors.torch import save_file

from attnserve.client import EncoderClient
from attnserve.export.sae import add_sae
from attnserve.export.sae_sources import SAEError
from attnserve.export.transcoder_set import add_transcoder_set
from attnserve.model.artifacts import BACKWARD_OUTPUTS, backward_files, backward_inputs
from attnserve.model.tokenizer import ByteTokenizer
from attnserve.service.core.backend import ReadoutSelection
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.features import plan_features
from attnserve.service.core.interventions import plan_changes, plan_clamps
from attnserve.service.core.request import FeaturesOptions, Intervention
from attnserve.service.core.view import InputContext, ModelView
from attnserve.service.ort.replacement import position_groups
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import ServerThread, linked_copy
from tests.export.test_hf_families import padded_batch
from tests.service.ort.test_features import residual_sites

D_SAE = 96
TOLERANCE = 1e-4  # of each position's largest activation; of |mlp_out| for the error
ARCHITECTURES = ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder")


def saelens_transcoder(architecture: str, layer: int, d: int, seed: int) -> SAE:
    """A SAELens transcoder on layer `layer`'s MLP, its weights random at trained scale
    (thresholds positive and leaving some features off)."""
    cfg = {
        "architecture": architecture,
        "d_in": d,
        "d_out": d,
        "d_sae": D_SAE,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": False,
        "normalize_activations": "none",
        "metadata": {
            "hook_name": f"blocks.{layer}.hook_resid_mid",
            "hook_name_out": f"blocks.{layer}.hook_mlp_out",
        },
    }
    sae = SAE.from_dict(cfg)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in sae.parameters():
            parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
        if "jumprelu" in architecture:
            sae.threshold.copy_(0.3 * torch.rand(D_SAE, generator=generator))
    return sae


def served(runtime: OrtRuntime, names: list[str], ids: np.ndarray, lengths) -> list:
    view = ModelView(runtime.config, ByteTokenizer(runtime.config), runtime.graphs, runtime.saes)
    options = FeaturesOptions(saes=tuple(names), top_k=8, dense=True)
    selections = [
        ReadoutSelection(features=plan_features(options, InputContext(view, t, row)))
        for row, t in enumerate(lengths)
    ]
    return runtime.read(ids, list(lengths), selections)[1]


def assert_like(got, i: int, sae: SAE, x: np.ndarray, y: np.ndarray) -> None:
    """Served features and error of the `i`-th SAE asked against SAELens' on x -> y (t, D)."""
    with torch.no_grad():
        want = sae.encode(torch.from_numpy(x)).numpy()  # (t, S)
        error = np.linalg.norm(y - sae(torch.from_numpy(x)).numpy(), axis=-1)  # (t,)
        pre = (torch.from_numpy(x) @ sae.W_enc + sae.b_enc).numpy()
    largest = np.maximum(np.abs(want).max(-1), 1e-6)
    near = np.zeros_like(want, dtype=bool)  # a rounding away from switching: either way
    if hasattr(sae, "threshold"):
        near = np.abs(pre - sae.threshold.detach().numpy()) <= TOLERANCE * largest[:, None]
    assert 0 < (want > 0).mean() < 0.9  # some features on, some off
    diff = np.where(near, 0, np.abs(got.activations[i] - want)).max(-1)
    assert (diff <= TOLERANCE * largest).all()
    scale = np.linalg.norm(y, axis=-1)
    assert (np.abs(got.error_norm[i] - error) <= TOLERANCE * scale).all()
    assert error.min() > 0.01 * scale.min()  # an error worth measuring


def test_saelens_transcoders_are_served_against_the_mlp_output(families, tmp_path):
    _, reference = families.checkpoint("llama")
    model_dir = linked_copy(families.exported("llama"), tmp_path / "model")
    d, last = reference.config.hidden_size, reference.config.num_hidden_layers - 1
    saes = {}
    for i, architecture in enumerate(ARCHITECTURES):
        sae = saelens_transcoder(architecture, layer=i % (last + 1), d=d, seed=i)
        sae.save_model(tmp_path / architecture)
        cfg = json.loads((tmp_path / architecture / "cfg.json").read_text())
        assert cfg["metadata"]["hook_name_out"] == sae.cfg.metadata.hook_name_out
        add_sae(model_dir, tmp_path / architecture, log=lambda _: None)
        saes[architecture] = sae
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    assert all(runtime.saes[name].transcoder for name in ARCHITECTURES)
    assert runtime.saes["skip_transcoder"].skip and not runtime.saes["transcoder"].skip

    ids, lengths = padded_batch(reference.config.vocab_size, seed=5)
    sites = residual_sites(reference, "llama", ids)
    outputs = served(runtime, list(ARCHITECTURES), ids, lengths)
    for row, (t, out) in enumerate(zip(lengths, outputs, strict=True)):
        for i, sae in enumerate(saes.values()):
            meta = sae.cfg.metadata
            x, y = sites[meta.hook_name][row, :t], sites[meta.hook_name_out][row, :t]
            assert_like(out.features, i, sae, x, y)


def write_circuit_tracer_set(folder: Path, saes: list[SAE]) -> None:
    """saes' weights as circuit-tracer saves a transcoder set (to_safetensors' keys)."""
    folder.mkdir()
    config = {
        "model_kind": "transcoder_set",
        "feature_input_hook": "hook_resid_mid",
        "feature_output_hook": "hook_mlp_out",
        "scan": "attnserve-test",
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    for layer, sae in enumerate(saes):
        tensors = {
            "W_enc": sae.W_enc.detach().T.contiguous(),  # (d_transcoder, d_model)
            "W_dec": sae.W_dec.detach().clone(),
            "b_enc": sae.b_enc.detach().clone(),
            "b_dec": sae.b_dec.detach().clone(),
            "activation_function.threshold": sae.threshold.detach().clone(),
            "W_skip": sae.W_skip.detach().clone(),
        }
        save_file(tensors, folder / f"layer_{layer}.safetensors")


def test_a_circuit_tracer_transcoder_set_is_served_one_per_layer(families, tmp_path):
    _, reference = families.checkpoint("llama")
    model_dir = linked_copy(families.exported("llama"), tmp_path / "model")
    d, layers = reference.config.hidden_size, reference.config.num_hidden_layers
    saes = [
        saelens_transcoder("jumprelu_skip_transcoder", layer, d, seed=10 + layer)
        for layer in range(layers)
    ]
    write_circuit_tracer_set(tmp_path / "plt", saes)
    written = add_transcoder_set(model_dir, tmp_path / "plt", log=lambda _: None)
    names = [f"{layer}-plt" for layer in range(layers)]
    assert [path.name for path in written] == names + list(backward_files("plt"))
    # the set's backward points into the model's weights file: its own holds at most the
    # skips and the rotary tables (which the model's graphs hold inside them; a tensor of
    # under 8192 values, as these skips, the optimizer may fold into the graph itself)
    graph, own, info = (model_dir / name for name in backward_files("plt"))
    assert json.loads(info.read_text())["input_site"] == "blocks.{layer}.hook_resid_mid"
    assert max(json.loads(info.read_text())["fidelity"].values()) < 1e-5
    where: dict[str, set[str]] = {}
    for tensor in onnx.load(str(graph), load_external_data=False).graph.initializer:
        for entry in (e for e in tensor.external_data if e.key == "location"):
            where.setdefault(entry.value, set()).add(tensor.name)
    stored = {name.removesuffix(".T") for name in where[own.name]}  # (as MatMul reads them)
    assert stored <= {"skip_0", "skip_1", "rotary.cos", "rotary.sin"}
    assert "blocks.1.attn.qkv.weight.T" in where["weights.data"]
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    assert_rows_on_prefixes(runtime.replacement("plt"), graph, d, layers)
    ids, lengths = padded_batch(reference.config.vocab_size, seed=6)
    sites = residual_sites(reference, "llama", ids)
    outputs = served(runtime, names, ids, lengths)
    for row, (t, out) in enumerate(zip(lengths, outputs, strict=True)):
        for layer, sae in enumerate(saes):
            x = sites[f"blocks.{layer}.hook_resid_mid"][row, :t]
            y = sites[f"blocks.{layer}.hook_mlp_out"][row, :t]
            assert_like(out.features, layer, sae, x, y)

    # every feature's activation alone (what the dashboards read): no output site needed
    x = sites["blocks.1.hook_resid_mid"][0, : lengths[0]]
    alone = runtime.sae_graphs.activations("1-plt", x)
    np.testing.assert_allclose(alone, outputs[0].features.activations[1], rtol=0, atol=1e-5)

    # GetModelInfo says which SAEs are transcoders, and where they write
    server = ServerThread(model_dir)
    try:
        with EncoderClient(server.address) as client:
            listed = {sae["name"]: sae for sae in client.model_info()["saes"]}
    finally:
        server.stop()
    assert listed["1-plt"]["hook_name"] == "blocks.1.hook_resid_mid"
    assert listed["1-plt"]["hook_name_out"] == "blocks.1.hook_mlp_out"

    # a feature steers where its decoder writes (the MLP's output), and is not clamped
    view = ModelView(runtime.config, ByteTokenizer(runtime.config), runtime.graphs, runtime.saes,
                     runtime.feature_direction)  # fmt: skip
    steer = Intervention("", "add", None, 2.0, feature=("1-plt", 3))
    changes = plan_changes((steer,), (), view, 4, 0)
    np.testing.assert_allclose(
        changes["mlp_out"].add[1, 0], 2.0 * sae_row(saes[1], 3), rtol=1e-6, atol=0
    )
    with pytest.raises(
        InvalidInputError, match=r"interventions\[0\]\.feature: '1-plt' is a transcoder"
    ):
        plan_clamps((Intervention("", "clamp", None, 1.0, feature=("1-plt", 3)),), view, 4, 0)


def assert_rows_on_prefixes(replacement, graph: Path, d: int, layers: int) -> None:
    """The served rows, each group of positions run on the prompt's prefix up to its last
    (service/ort/replacement.py position_groups), equal to one pass of the whole graph over
    the whole prompt: rows at every position and layer, the logits' layer among them."""
    rng = np.random.default_rng(4)
    T, N = 12, 40
    input_ids = rng.integers(3, 200, T).astype(np.int64)
    grads = rng.standard_normal((N, d)).astype(np.float32)
    row_layers = rng.integers(0, layers + 1, N).astype(np.int64)
    positions = np.concatenate([rng.integers(0, 4, N // 2), rng.integers(0, T, N // 2)])
    assert len(position_groups(positions)) > 1  # the case under test
    mlp, embed = replacement.rows(input_ids, grads, row_layers, positions)
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    order = np.argsort(row_layers, kind="stable")  # the graph's rows come in layer order
    by_layer = [order[row_layers[order] == layer] for layer in range(layers + 1)]
    feeds = (input_ids[None], *(grads[r] for r in by_layer), *(positions[r] for r in by_layer))
    want_mlp, want_embed = session.run(
        list(BACKWARD_OUTPUTS[:2]), dict(zip(backward_inputs(layers), feeds, strict=True))
    )
    want_mlp, want_embed = want_mlp[np.argsort(order)], want_embed[np.argsort(order)]
    for got, want in ((mlp, want_mlp), (embed, want_embed)):
        scale = np.abs(want).max(axis=tuple(range(1, want.ndim)), keepdims=True)
        scale = np.maximum(scale, 1e-30)  # a row that reaches no MLP reads zeros there
        np.testing.assert_allclose(got / scale, want / scale, rtol=0, atol=1e-6)


def test_position_groups_are_the_cheapest_cover_of_the_rows():
    """Against every way of cutting the sorted distinct positions into runs."""
    rng = np.random.default_rng(0)
    for overhead in (0.0, 3.0, 50.0):
        for _ in range(20):
            positions = rng.integers(0, 9, rng.integers(1, 12))
            groups = position_groups(positions, overhead)
            assert sorted(np.concatenate(groups).tolist()) == list(range(len(positions)))
            spans = [positions[g] for g in groups]
            assert all(a.max() < b.min() for a, b in itertools.pairwise(spans))

            def cost(parts, overhead=overhead) -> float:
                return sum((len(p) + overhead) * (p.max() + 1) for p in parts)

            distinct = np.unique(positions)
            best = min(
                cost(np.split(np.sort(positions), np.searchsorted(np.sort(positions), cuts)))
                for k in range(len(distinct))
                for cuts in itertools.combinations(distinct[1:].tolist(), k)
            )
            assert cost(spans) == pytest.approx(best)


def sae_row(sae: SAE, feature: int) -> np.ndarray:
    return sae.W_dec[feature].detach().numpy()


def test_a_transcoder_set_on_a_site_the_model_does_not_serve_writes_nothing(families, tmp_path):
    _, reference = families.checkpoint("llama")
    model_dir = linked_copy(families.exported("llama"), tmp_path / "model")
    d, layers = reference.config.hidden_size, reference.config.num_hidden_layers
    saes = [
        saelens_transcoder("jumprelu_skip_transcoder", layer, d, seed=layer)
        for layer in range(layers)
    ]
    write_circuit_tracer_set(tmp_path / "plt", saes)
    config = yaml.safe_load((tmp_path / "plt" / "config.yaml").read_text())
    config["feature_input_hook"] = "hook_attn_scores"  # not a site an SAE can read
    (tmp_path / "plt" / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(SAEError, match=r"hook_name 'blocks\.0\.hook_attn_scores'"):
        add_transcoder_set(model_dir, tmp_path / "plt", log=lambda _: None)
    assert not (model_dir / "saes").exists() or not any((model_dir / "saes").iterdir())
