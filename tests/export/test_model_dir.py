"""The export plans what it writes from model/artifacts.py's graph table."""

import onnxruntime as ort

from attnserve.export.model_dir import plan_graphs
from attnserve.model.artifacts import graph_kinds
from attnserve.model.config import ModelConfig
from attnserve.service.ort.sessions import read_config


def test_the_plan_is_what_the_export_wrote(small_model_dir):
    path = small_model_dir / "model.onnx"
    config = read_config(ort.InferenceSession(str(path)), path)
    planned = plan_graphs(config, ("fp32", "fp16"))
    assert {g.filename for g in planned} == {f.name for f in small_model_dir.glob("*.onnx")}
    for index, graph in enumerate(planned):  # each made from a float32 graph written before
        before = {g.filename for g in planned[:index] if g.precision == "fp32"}
        assert graph.source is None or graph.source in before, graph


def test_int8_converts_the_fused_graph_where_attention_fuses():
    small = dict(n_layers=1, n_heads=1, d_model=8, d_ff=8, max_seq_len=16)
    for config in (ModelConfig(**small), ModelConfig(**small, attention_softcap=50.0)):
        full = next(g for g in plan_graphs(config, ("int8",)) if g.filename == "model_int8.onnx")
        fused = "fused" in graph_kinds(config)
        assert fused == config.fuses_attention
        assert full.source == ("model_fused.onnx" if fused else "model.onnx"), config
