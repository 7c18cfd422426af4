"""`attnserve export` as a user runs it: real subprocesses, real files."""

import json

import numpy as np
import onnx
import torch

from attnserve.export.weights import INLINE_BYTES
from attnserve.model.artifacts import (
    ATTRIBUTION_ONNX_FILENAME,
    CONFIG_METADATA_KEY,
    DECODE_ONNX_FILENAME,
    EMBEDDINGS_FP16_ONNX_FILENAME,
    EMBEDDINGS_ONNX_FILENAME,
    FP16_ONNX_FILENAME,
    FUSED_ONNX_FILENAME,
    LENS_ONNX_FILENAME,
    ONNX_FILENAME,
    QUERIES_ONNX_FILENAME,
    READOUTS_ONNX_FILENAME,
    REPORT_FILENAME,
    VERSIONS_METADATA_KEY,
    WEIGHTS_FILENAMES,
    WEIGHTS_INDEX_FILENAME,
    change_inputs,
)
from attnserve.model.checkpoint import save_checkpoint
from attnserve.model.config import ModelConfig
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import SMALL_CONFIG, run_cli


def test_default_export_writes_a_checked_model_directory(default_export):
    out, result = default_export
    config = ModelConfig()
    graphs = (ONNX_FILENAME, READOUTS_ONNX_FILENAME, EMBEDDINGS_ONNX_FILENAME, FUSED_ONNX_FILENAME)
    for filename in graphs:
        assert f"checking {filename}: PyTorch vs ONNX Runtime CPU" in result.stdout
        proto = onnx.load(str(out / filename))
        onnx.checker.check_model(proto, full_check=True)
        metadata = {p.key: p.value for p in proto.metadata_props}
        assert ModelConfig.from_json(metadata[CONFIG_METADATA_KEY]) == config
        assert set(json.loads(metadata[VERSIONS_METADATA_KEY])) >= {"torch", "onnx", "attnserve"}
        # Batch and sequence axes are symbolic, not baked to the traced example's shape.
        input_ids, *changes = proto.graph.input
        assert [d.dim_param for d in input_ids.type.tensor_type.shape.dim] == ["batch", "seq"]
        outputs = [o.name for o in proto.graph.output]
        if filename == READOUTS_ONNX_FILENAME:  # the readouts' inputs and outputs
            assert [c.name for c in changes] == list(change_inputs(config))
            for change in changes:  # free but for the layers: broadcast against the site
                dims = [d.dim_param or d.dim_value for d in change.type.tensor_type.shape.dim]
                per_head = change.name.split("_")[0] in ("q", "k", "v", "z")
                free = [f"{change.name}_{axis}" for axis in (0, 2, 3, 4)][: 4 if per_head else 3]
                assert dims == [free[0], config.n_layers, *free[1:]], change.name
            assert outputs == [
                "embeddings",
                "attentions",
                "residual_stream",
                "head_outputs",
                "mlp_outputs",
                "attn_outputs",
                "resid_mid",
            ]
        else:  # the served graphs: nothing computed that a plain request does not read
            assert changes == [] and outputs[0] == "embeddings"
            assert set(outputs) <= {"embeddings", "attentions"}
    assert f"seq_len={ModelConfig().max_seq_len}" in result.stdout  # parity reached max length

    fused = onnx.load(str(out / EMBEDDINGS_ONNX_FILENAME))
    assert [o.name for o in fused.graph.output] == ["embeddings"]
    attention = [n for n in fused.graph.node if n.op_type == "Attention"]
    assert len(attention) == ModelConfig().n_layers
    # The Attention ops take the (B, T, D) projections: no per-head reshapes or transposes.
    n_heads = ModelConfig().n_heads
    for node in attention:
        heads = {a.name: a.i for a in node.attribute if a.name.endswith("num_heads")}
        assert heads == {"q_num_heads": n_heads, "kv_num_heads": n_heads}
    assert not {"Reshape", "Transpose"} & {n.op_type for n in fused.graph.node}
    # The fused full graph: each layer's Attention op also returns its probabilities, and
    # nothing computes scores, masks or softmaxes beside it.
    full = onnx.load(str(out / FUSED_ONNX_FILENAME))
    assert [o.name for o in full.graph.output] == ["embeddings", "attentions"]
    ops = [n.op_type for n in full.graph.node]
    assert ops.count("Attention") == ModelConfig().n_layers
    assert not {"Softmax", "Trilu", "Where", "Transpose"} & set(ops)

    report = json.loads((out / REPORT_FILENAME).read_text())
    fp32_graphs = {ONNX_FILENAME, EMBEDDINGS_ONNX_FILENAME, FUSED_ONNX_FILENAME}
    # the readouts, the lens and attribution: the default model's unembedding is its token
    # table, and its norms come before its sublayers
    fp32_graphs |= {READOUTS_ONNX_FILENAME, LENS_ONNX_FILENAME, ATTRIBUTION_ONNX_FILENAME}
    fp32_graphs.add(DECODE_ONNX_FILENAME)  # generation's, where there is an unembedding
    fp32_graphs.add(QUERIES_ONNX_FILENAME)  # long texts' queries and keys
    # Float16 graphs only when asked for (--precision fp16): by default fp32 and its weights.
    assert report["precisions"] == ["fp32"]
    files = {WEIGHTS_FILENAMES["fp32"], WEIGHTS_INDEX_FILENAME}  # the weights and their index
    assert set(report["onnx_bytes"]) == fp32_graphs | files
    assert {case["graph"] for case in report["parity"]} == fp32_graphs
    for case in report["parity"]:
        logits = case["graph"] in {LENS_ONNX_FILENAME, ATTRIBUTION_ONNX_FILENAME} | {
            DECODE_ONNX_FILENAME
        }
        limit = 1e-3 if logits else 1e-4
        assert all(d <= limit for d in case["max_abs_diff"].values())
    # the lens' Gemm reads the token table as stored: no transposed copy beside it
    lens = onnx.load(str(out / LENS_ONNX_FILENAME), load_external_data=False)
    assert {i.name for i in lens.graph.initializer} >= {"tok_emb.weight"}
    assert not any(i.name.startswith("tok_emb.weight.") for i in lens.graph.initializer)
    # ... and so does attribution, with the output projections as the full graph stores
    # them: every weight it reads is one the served graph holds, nothing folded inline
    attribution = onnx.load(str(out / ATTRIBUTION_ONNX_FILENAME), load_external_data=False)
    served = onnx.load(str(out / ONNX_FILENAME), load_external_data=False).graph.initializer
    external = {
        i.name
        for i in attribution.graph.initializer
        if i.data_location == onnx.TensorProto.EXTERNAL
    }
    assert "tok_emb.weight" in external and external <= {i.name for i in served}
    inline = [
        i for i in attribution.graph.initializer if i.data_location != onnx.TensorProto.EXTERNAL
    ]
    assert all(np.prod(i.dims) * 4 <= INLINE_BYTES for i in inline)

    # the decode graph too: its weights are the others', in weights.data once
    def stored(name: str) -> set[str]:
        graph = onnx.load(str(out / name), load_external_data=False).graph
        external = onnx.TensorProto.EXTERNAL
        return {i.name for i in graph.initializer if i.data_location == external}

    own = {DECODE_ONNX_FILENAME, QUERIES_ONNX_FILENAME}
    held = set().union(*(stored(name) for name in fp32_graphs - own))
    for name in own:
        read = stored(name)
        assert "tok_emb.weight" in read and read <= held
    # the queries graph attends through GroupQueryAttention (no T x T buffer on CPU)
    queries = onnx.load(str(out / QUERIES_ONNX_FILENAME), load_external_data=False)
    ops = [n.op_type for n in queries.graph.node]
    assert ops.count("GroupQueryAttention") == ModelConfig().n_layers
    assert "Attention" not in ops and "Softmax" not in ops


def _io(model: onnx.ModelProto) -> list[tuple[str, int]]:
    return [
        (v.name, v.type.tensor_type.elem_type) for v in [*model.graph.input, *model.graph.output]
    ]


def test_fp16_graphs_are_float16_inside_and_float32_outside(tmp_path):
    config_file = tmp_path / "config.json"
    config_file.write_text(SMALL_CONFIG.to_json())
    out = tmp_path / "fp16"
    result = run_cli(
        "export",
        *("--out", str(out), "--config", str(config_file)),
        *("--precision", "fp32", "--precision", "fp16"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((out / REPORT_FILENAME).read_text())
    assert report["precisions"] == ["fp32", "fp16"]
    for fp32_name, fp16_name in [
        (ONNX_FILENAME, FP16_ONNX_FILENAME),
        (EMBEDDINGS_ONNX_FILENAME, EMBEDDINGS_FP16_ONNX_FILENAME),
    ]:
        assert f"checking {fp16_name}: PyTorch vs ONNX Runtime CPU, tolerance 0.01" in result.stdout
        fp32, fp16 = onnx.load(str(out / fp32_name)), onnx.load(str(out / fp16_name))
        assert _io(fp16) == _io(fp32)  # int64 ids in, float32 out: clients see no difference
        weights = [t for t in fp16.graph.initializer if len(t.dims) == 2]  # the matrices
        assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)
        assert {p.key: p.value for p in fp16.metadata_props} == {
            p.key: p.value for p in fp32.metadata_props
        }
    # Half the bytes, in a weights file of their own, shared by the float16 graphs.
    fp16_bytes = (out / WEIGHTS_FILENAMES["fp16"]).stat().st_size
    assert 0 < fp16_bytes < 0.6 * (out / WEIGHTS_FILENAMES["fp32"]).stat().st_size


def test_parity_failure_writes_nothing_and_exits_non_zero(tmp_path):
    config_file = tmp_path / "config.json"
    config_file.write_text(SMALL_CONFIG.to_json())
    out = tmp_path / "refused"
    # A zero tolerance cannot be met by two different fp32 kernels: a genuine parity failure.
    result = run_cli("export", "--out", str(out), "--config", str(config_file), "--tolerance", "0")
    assert result.returncode == 1
    assert "ONNX Runtime (model.onnx) disagrees with PyTorch at batch=1, seq_len=1" in result.stderr
    assert "nothing was written" in result.stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [config_file]  # no scratch directory left behind


def test_bad_config_file_is_a_usage_error(tmp_path):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"d_model": 250}))
    result = run_cli("export", "--out", str(tmp_path / "m"), "--config", str(config_file))
    assert result.returncode == 2
    assert "d_model (250) must be divisible by n_heads (8)" in result.stderr


def test_bad_checkpoint_is_a_usage_error(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"\x00" * 64)
    result = run_cli(
        "export", "--out", str(tmp_path / "m"), "--checkpoint", str(tmp_path / "x.safetensors")
    )
    assert result.returncode == 2
    assert "not a readable safetensors file" in result.stderr


def test_checkpoint_export_round_trip(small_model, tmp_path):
    """checkpoint -> export CLI -> model directory -> runtime equals the PyTorch model."""
    checkpoint = save_checkpoint(small_model, tmp_path / "small.safetensors")
    out = tmp_path / "exported"
    result = run_cli("export", "--out", str(out), "--checkpoint", str(checkpoint))
    assert result.returncode == 0, result.stderr
    runtime = OrtRuntime(out, RuntimeOptions(provider="cpu"))
    assert runtime.config == SMALL_CONFIG
    ids = np.random.default_rng(3).integers(0, 259, size=(2, 23), dtype=np.int64)
    embeddings, attentions = runtime.run(ids)
    with torch.inference_mode():
        want_emb, want_att = small_model(torch.from_numpy(ids))
    np.testing.assert_allclose(embeddings, want_emb.numpy(), atol=1e-4)
    np.testing.assert_allclose(attentions, want_att.numpy(), atol=1e-4)
    np.testing.assert_allclose(runtime.embed(ids), want_emb.numpy(), atol=1e-4)


def test_if_missing_leaves_an_existing_model_untouched(small_model_dir):
    before = {p.name: p.stat().st_mtime_ns for p in small_model_dir.iterdir()}
    result = run_cli("export", "--out", str(small_model_dir), "--if-missing")
    assert result.returncode == 0, result.stderr
    assert "nothing to export" in result.stdout
    assert {p.name: p.stat().st_mtime_ns for p in small_model_dir.iterdir()} == before


def test_an_import_that_would_not_fit_is_refused_before_a_tensor_is_read(tmp_path):
    # A checkpoint whose weights file is not even a safetensors file: the memory check has
    # to speak before the reader opens it.
    checkpoint = tmp_path / "llama"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 2048,
                "intermediate_size": 5632,
                "num_hidden_layers": 22,
                "num_attention_heads": 32,
                "num_key_value_heads": 4,
                "max_position_embeddings": 2048,
                "vocab_size": 32000,
            }
        )
    )
    (checkpoint / "tokenizer.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"not read")
    out = tmp_path / "refused"
    result = run_cli(
        "export", "--from-hf", str(checkpoint), "--out", str(out), "--memory-limit", str(2**32)
    )
    assert result.returncode == 2, result.stderr
    # TinyLlama's shape with its own lm_head (Llama does not tie): 1.10B parameters
    assert "needs about 6.2 GiB (1.10B parameters: 4.1 GiB of float32" in result.stderr
    assert "4.0 GiB is available" in result.stderr
    assert not out.exists()
