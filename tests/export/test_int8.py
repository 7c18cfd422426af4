"""8-bit weights (--precision int8): MatMulNBits graphs, their parity gate and fidelity record,
served through the same runtime."""

import json

import numpy as np
import onnx
import pytest
import torch

from attnserve.export import INT8_MIN_COSINE, INT8_TOLERANCE
from attnserve.export.int8 import BITS, BLOCK_SIZE
from attnserve.export.model_dir import write_model_dir
from attnserve.export.parity import ParityError, scaled_diff
from attnserve.model.artifacts import (
    EMBEDDINGS_INT8_ONNX_FILENAME,
    INT8_ONNX_FILENAME,
    ON_DEMAND,
    PARTS_NAMES,
    REPORT_FILENAME,
    RESIDUAL_STREAM_NAME,
    WEIGHTS_FILENAMES,
    ModelDirectory,
    graph_file,
)
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import build_encoder
from attnserve.model.hook_points import captured, head_ablation, hooked, stacked
from attnserve.model.readout_sites import readout_sites
from attnserve.service.core.backend import AttentionSelection
from attnserve.service.core.errors import ProviderUnavailableError
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import head_changes

# Wide enough that each matrix is several quantization blocks along its input.
CONFIG = ModelConfig(
    n_layers=2, n_heads=4, n_kv_heads=2, d_model=256, d_ff=512, max_seq_len=64,
    norm="rmsnorm", mlp="gated", positions="rotary", bias=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def int8_dir(tmp_path_factory):
    model = build_encoder(CONFIG, seed=4)
    out = tmp_path_factory.mktemp("int8")
    write_model_dir(model, out, log=lambda _: None, precisions=("int8",))
    return model, out


def test_an_int8_directory_holds_8_bit_matrices_and_nothing_in_float32_beside(int8_dir):
    model, out = int8_dir
    assert ModelDirectory(out).precisions == ("int8",)
    assert not (out / WEIGHTS_FILENAMES["fp32"]).exists()
    for name in (INT8_ONNX_FILENAME, EMBEDDINGS_INT8_ONNX_FILENAME):
        proto = onnx.load(str(out / name), load_external_data=False)
        ops = [n for n in proto.graph.node if n.op_type in ("MatMul", "MatMulNBits")]
        # Every projection: 3 per layer (qkv, attention out, gate/up, down: 4), 8-bit.
        assert len(ops) == 4 * CONFIG.n_layers
        for node in ops:
            attributes = {a.name: a.i for a in node.attribute}
            assert node.op_type == "MatMulNBits" and node.domain == "com.microsoft"
            assert attributes["bits"] == BITS and attributes["block_size"] == BLOCK_SIZE
            assert attributes["accuracy_level"] == 4  # int8 x int8 arithmetic
    # 8 bits and a float32 scale per 32 weights: 1.125 bytes a weight; the token table's 2
    # for its rows and 1.125 for the lens, the norms' 4.
    fp32_bytes = 4 * sum(p.numel() for p in model.parameters())
    assert (out / WEIGHTS_FILENAMES["int8"]).stat().st_size < 0.4 * fp32_bytes


def test_a_tied_table_gives_its_rows_in_float16_and_its_logits_in_8_bits(int8_dir):
    """The token table's rows come from the table in float16 (8-bit rows cost attention
    more than the gate allows on Llama-3.1-8B's shape); the lens' unembedding by the same
    table is a MatMulNBits. Neither keeps the float32 table."""
    _, out = int8_dir
    assert CONFIG.unembedding == "tied"
    for name, op, dtype in (
        (INT8_ONNX_FILENAME, "Gather", onnx.TensorProto.FLOAT16),
        (graph_file("lens", "int8"), "MatMulNBits", onnx.TensorProto.UINT8),
    ):
        proto = onnx.load(str(out / name), load_external_data=False)
        (node,) = [n for n in proto.graph.node if n.op_type == op and "tok_emb" in str(n.input)]
        table = node.input[0 if op == "Gather" else 1]
        (tensor,) = [t for t in proto.graph.initializer if t.name == table]
        assert tensor.data_type == dtype, name
        assert "tok_emb.weight" not in {t.name for t in proto.graph.initializer}


def test_int8_parity_is_gated_and_its_fidelity_recorded(int8_dir):
    _, out = int8_dir
    report = json.loads((out / REPORT_FILENAME).read_text())
    assert report["precisions"] == ["int8"]
    cases = [c for c in report["parity"] if c["graph"] == INT8_ONNX_FILENAME]
    assert cases and all(c["max_abs_diff"]["attentions"] <= INT8_TOLERANCE for c in cases)
    assert all(c["embedding_cosine"] >= INT8_MIN_COSINE for c in cases)
    fidelity = report["fidelity"][INT8_ONNX_FILENAME]
    assert fidelity["attention_max_abs_diff"] == max(c["max_abs_diff"]["attentions"] for c in cases)
    assert fidelity["embedding_cosine_min"] == min(c["embedding_cosine"] for c in cases)
    # Really 8 bits: not float32's agreement.
    assert fidelity["attention_max_abs_diff"] > 1e-4 and fidelity["embedding_cosine_min"] < 1


def test_int8_serves_against_pytorch_within_its_recorded_fidelity(int8_dir):
    model, out = int8_dir
    runtime = OrtRuntime(out, RuntimeOptions(precision="int8"))  # auto: the CPU provider
    assert runtime.provider == "cpu" and runtime.precision == "int8"
    info = runtime.weights_info
    assert info.disk_bytes == (out / WEIGHTS_FILENAMES["int8"]).stat().st_size
    ids = np.random.default_rng(5).integers(0, CONFIG.vocab_size, size=(2, 40))

    with torch.inference_mode():
        want_embeddings, want_attentions = (t.numpy() for t in model(torch.from_numpy(ids)))
    embeddings, attentions = runtime.run(ids)
    assert np.abs(attentions - want_attentions).max() <= INT8_TOLERANCE
    cosine = (embeddings * want_embeddings).sum(-1) / (
        np.linalg.norm(embeddings, axis=-1) * np.linalg.norm(want_embeddings, axis=-1)
    )
    assert cosine.min() >= INT8_MIN_COSINE
    np.testing.assert_allclose(runtime.embed(ids), embeddings, atol=1e-4)
    with pytest.raises(ProviderUnavailableError, match="int8 runs on the CPU provider only"):
        OrtRuntime(out, RuntimeOptions(provider="cuda", precision="int8"))


def test_every_readout_serves_from_int8_within_its_gate(int8_dir):
    """The residual stream and its parts under a head mask, the lens and the attribution
    graph, each in 8 bits, against PyTorch float32; each output's fidelity is recorded and
    stated by the model info."""

    model, out = int8_dir
    runtime = OrtRuntime(out, RuntimeOptions(precision="int8"))
    assert runtime.graphs == {"readouts", "changes", "lens", "attribution", "decode", "queries"}
    for kind in ON_DEMAND:  # the lens too: it unembeds with the 8-bit token table
        proto = onnx.load(str(out / graph_file(kind, "int8")), load_external_data=False)
        assert any(n.op_type == "MatMulNBits" for n in proto.graph.node), kind
    ids = np.random.default_rng(7).integers(0, CONFIG.vocab_size, size=(2, 24))
    mask = np.ones((2, CONFIG.n_layers, CONFIG.n_heads), dtype=np.float32)
    mask[1, 0, 1] = 0.0
    sites = readout_sites(CONFIG)
    run = runtime.readouts.stream(ids, head_changes(mask), sites=sites)
    reads = [site for names in sites.values() for site in names]
    changes = head_ablation(torch.from_numpy(mask))
    with torch.inference_mode(), hooked(model, changes), captured(model, reads) as values:
        model(torch.from_numpy(ids))
        want = {name: value.numpy() for name, value in stacked(values, sites).items()}
    for name in sites:  # the stream, its parts, what attention writes, resid_mid
        value = run.output(name)
        assert 1e-5 < scaled_diff(value, want[name], bounded=False) <= INT8_TOLERANCE, name
    rows = run.residual[0].reshape(-1, CONFIG.d_model)
    last = np.broadcast_to(run.residual[0, -1], run.residual[0].shape).reshape(rows.shape)
    lens = runtime.readouts.lens(rows, last.copy(), logits=True).logits
    with torch.inference_mode():
        want_lens = model.lens(torch.from_numpy(rows), torch.from_numpy(last.copy())).numpy()
    assert scaled_diff(lens, want_lens, bounded=False) <= INT8_TOLERANCE
    batch = runtime.decode_batch()  # generation's first step, from the 8-bit decode graph
    next_logits = batch.prefill(ids[0], {}).advance(ids.shape[1])
    with torch.inference_mode():
        want_next = model.logits(torch.from_numpy(ids[:1]))[0, -1].numpy()
    assert 1e-5 < scaled_diff(next_logits, want_next, bounded=False) <= INT8_TOLERANCE
    # long texts' statistics, by query blocks of the 8-bit queries graph
    every = dict(layers=tuple(range(CONFIG.n_layers)), heads=tuple(range(CONFIG.n_heads)))
    selection = AttentionSelection(**every, top_k=3, received=True, blocked=True)
    _, (out,) = runtime.attend(ids[:1], [ids.shape[1]], [selection])
    with torch.inference_mode():
        want_attention = model(torch.from_numpy(ids[:1]))[1][0].numpy()  # (L, H, T, T)
    want_top = -np.sort(-want_attention, axis=-1)[..., :3]
    assert 1e-6 < np.abs(out.weights - want_top).max() <= INT8_TOLERANCE
    assert np.abs(out.received - want_attention.sum(2)).max() <= INT8_TOLERANCE * ids.shape[1]
    fidelity = runtime.weights_info.output_fidelity  # the export's, over its parity cases
    assert {RESIDUAL_STREAM_NAME, *PARTS_NAMES, "logits", "head_attribution"} <= set(fidelity)
    assert 1e-5 < fidelity[RESIDUAL_STREAM_NAME] <= INT8_TOLERANCE  # 8 bits', not float32's
    assert runtime.weights_info.fidelity_scope == "the whole model"


def test_int8_is_served_by_one_session_whatever_memory_is_free(int8_dir, monkeypatch):
    """int8 is for fitting: one copy of its weights, however much memory there is, unless
    instances are asked for; that one session runs the readouts graph, so reading the
    residual stream opens no second copy. The lens packs its own 8 bits: unpacked,
    MatMulNBits would widen the unembedding to float32 at every run."""
    from attnserve.service.models import session_layout
    from attnserve.service.ort import runtime as runtime_module
    from attnserve.service.ort import sessions as sessions_module
    from attnserve.service.settings import Settings
    from tests.service.ort.test_readouts import prepacking

    model, out = int8_dir
    plenty = Settings(model=out, provider="cpu", precision="int8", memory_limit=1 << 40)
    options, instances = session_layout(ModelDirectory(out), plenty)
    assert options.single_session and instances == 1
    opened, open_graph = [], sessions_module.open_session
    for module in (runtime_module, sessions_module):  # every graph opened, by either
        monkeypatch.setattr(
            module,
            "open_session",
            lambda path, *rest: opened.append(path.name) or open_graph(path, *rest),
        )
    runtime = OrtRuntime(out, options)
    assert runtime.embeddings_session is runtime.session
    assert runtime.weights_info.resident_bytes == runtime.weights_info.disk_bytes
    ids = np.random.default_rng(9).integers(0, CONFIG.vocab_size, size=(2, 20))
    embeddings, attentions = runtime.run(ids)
    run = runtime.readouts.stream(ids, [{}, {}])
    runtime.release_memory()
    np.testing.assert_array_equal(runtime.embed(ids), embeddings)
    assert opened == [graph_file("readouts", "int8")]
    last = run.residual[0, -1]  # (T, D): the last layer's rows
    runtime.readouts.lens(last, last)
    assert opened[1:] == [graph_file("lens", "int8")]
    assert prepacking(runtime) == [True, True]  # the served session's, and the lens'
    np.testing.assert_array_equal(run.embeddings, embeddings)
    np.testing.assert_array_equal(run.attentions, attentions)
    with torch.inference_mode():  # and what it answers is the model's, within int8's gate
        want = model(torch.from_numpy(ids))[1].numpy()
    assert np.abs(attentions - want).max() <= INT8_TOLERANCE
    asked = Settings(model=out, provider="cpu", precision="int8", instances=2)
    assert session_layout(ModelDirectory(out), asked)[1] == 2


def test_int8_with_float32_arithmetic_is_closer_to_float32(int8_dir, tmp_path):
    """`--int8-arithmetic float32`: the same 8-bit weights times float32 activations
    (MatMulNBits accuracy_level 1), attention closer to PyTorch float32's than int8
    arithmetic brings it."""
    model, out = int8_dir
    exact = tmp_path / "float32-arithmetic"
    write_model_dir(
        model, exact, log=lambda _: None, precisions=("int8",), int8_arithmetic="float32"
    )
    graph = onnx.load(str(exact / INT8_ONNX_FILENAME), load_external_data=False)
    levels = {
        onnx.helper.get_attribute_value(a)
        for node in graph.graph.node
        if node.op_type == "MatMulNBits"
        for a in node.attribute
        if a.name == "accuracy_level"
    }
    assert levels == {1}

    def attention(directory):
        fidelity = json.loads((directory / REPORT_FILENAME).read_text())["fidelity"]
        return fidelity[INT8_ONNX_FILENAME]["attention_max_abs_diff"]

    assert attention(exact) < attention(out)


def test_int8_that_misses_its_gate_is_not_written(tmp_path, monkeypatch):
    from attnserve.export import gates

    monkeypatch.setattr(gates, "INT8_MIN_COSINE", 0.9999999)  # beyond 8 bits' reach
    out = tmp_path / "refused"
    with pytest.raises(
        ParityError, match=r"embedding cosine \S+ < 0\.9999999.*--int8-arithmetic float32"
    ):
        write_model_dir(build_encoder(CONFIG), out, log=lambda _: None, precisions=("int8",))
    assert not out.exists()


def test_an_int8_import_too_large_for_float32_streams_and_checks_a_prefix(
    tmp_path, monkeypatch, capsys
):
    import gc
    import weakref

    from attnserve.cli import main
    from attnserve.export.hf_import import CheckpointReader, config_from_hf
    from attnserve.export.weights import WeightsFile
    from attnserve.model.footprint import import_bytes, streamed_import_bytes, weight_bytes
    from perf.hf_checkpoints import build_checkpoint, reference_outputs
    from tests.conftest import run_cli

    fields = dict(
        hidden_size=128, intermediate_size=512, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    hf = build_checkpoint("llama", tmp_path / "hf", dtype=torch.bfloat16, **fields)
    config = config_from_hf(json.loads((tmp_path / "hf" / "config.json").read_text()), "hf")
    # Room for a float32 prefix and one tensor's copies, not for the float32 model.
    limit = (streamed_import_bytes(config) + import_bytes(config)) // 2
    assert streamed_import_bytes(config) < limit < import_bytes(config)
    out = tmp_path / "int8"
    common = ("export", "--from-hf", str(tmp_path / "hf"), "--out", str(out))
    refused = run_cli(*common, "--memory-limit", str(limit))  # float32: does not fit
    assert refused.returncode == 2
    assert "--precision int8 alone imports it in about" in refused.stderr
    # What the import holds of the checkpoint at once, counted as it reads (not the clock):
    # one fused matrix's three tensors at most, where holding the checkpoint is 8 layers'.
    original, live, most = CheckpointReader.read, [0], [0]

    def counted(self: CheckpointReader, name: str, widen: bool = True) -> torch.Tensor:
        tensor = original(self, name, widen)
        live[0] += 1
        most[0] = max(most[0], live[0])
        weakref.finalize(tensor, lambda: live.__setitem__(0, live[0] - 1))
        return tensor

    monkeypatch.setattr(CheckpointReader, "read", counted)
    # ... and what its float32 scratch file takes on disk: the matrices left out are holes.
    closing, on_disk = WeightsFile.close, {}

    def measured(self: WeightsFile) -> None:
        closing(self)
        left_out = sum(tensor.nbytes for tensor in self.unwritten.values())
        on_disk[self.path] = (self.path.stat().st_blocks * 512, left_out)

    monkeypatch.setattr(WeightsFile, "close", measured)
    assert main([*common, "--memory-limit", str(limit), "--precision", "int8"]) == 0
    gc.collect()
    assert 0 < most[0] <= 3 and live[0] == 0, (most, live)
    allocated, left_out = max(on_disk.values(), key=lambda sizes: sizes[1])
    assert left_out >= 0.9 * weight_bytes(config) and allocated < left_out / 20, on_disk
    assert "checking on the first 2 of 8 layers" in capsys.readouterr().out
    report = json.loads((out / REPORT_FILENAME).read_text())
    assert report["parity_scope"] == "the first 2 of 8 layers"
    assert report["precisions"] == ["int8"] and INT8_ONNX_FILENAME in report["fidelity"]
    assert ModelDirectory(out).precisions == ("int8",)
    assert sorted(p.name for p in out.glob("*.data")) == [WEIGHTS_FILENAMES["int8"]]
    # The whole model, served, within int8's gate of transformers (in float32).
    runtime = OrtRuntime(out, RuntimeOptions(precision="int8"))
    ids = np.random.default_rng(6).integers(3, config.vocab_size, size=(2, 30))
    want_hidden, want_attentions = reference_outputs(hf.float(), ids)
    embeddings, attentions = runtime.run(ids)
    assert np.abs(attentions - want_attentions).max() <= INT8_TOLERANCE
    cosine = (embeddings * want_hidden).sum(-1) / (
        np.linalg.norm(embeddings, axis=-1) * np.linalg.norm(want_hidden, axis=-1)
    )
    assert cosine.min() >= INT8_MIN_COSINE
