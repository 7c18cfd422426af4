"""The replacement model's backward graph (export/backward.py) in ONNX Runtime against the
model code it is traced from (model/replacement.py, itself held to circuit-tracer's way of
computing the rows by tests/model/test_replacement.py): three families' layouts, at other
row counts and prompt lengths than the trace's, with a transcoder's skip connection."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from attnserve.export.backward import BACKWARD_OUTPUTS, export_backward
from attnserve.export.weights import WeightsFile
from attnserve.model.artifacts import backward_inputs
from attnserve.model.encoder import build_encoder
from attnserve.model.replacement import BackwardGraph
from tests.model.test_replacement import FAMILIES, trained_scale, transcoder_set

# LayerNorm and learned positions, a parallel GQA block, Gemma's sandwich norms and soft-caps
# (the other layouts' eager backward: tests/model/test_replacement.py; the trace is ~20 s)
TRACED = ("gpt2", "everything", "sandwich")


@pytest.mark.parametrize("family", TRACED)
def test_the_graph_is_the_model_codes_backward(family, tmp_path):
    model = trained_scale(build_encoder(FAMILIES[family], seed=3))
    config = model.config
    transcoders = transcoder_set(config, skip=True)
    with WeightsFile(tmp_path / "weights.data") as weights:
        path = export_backward(model, transcoders, tmp_path / "backward.onnx", weights)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = backward_inputs(config.n_layers)
    assert [i.name for i in session.get_inputs()] == list(names)
    assert [o.name for o in session.get_outputs()] == list(BACKWARD_OUTPUTS)
    generator = torch.Generator().manual_seed(11)
    # rows at every layer (one each: the sizes the trace took for constants were 2 and 3),
    # then a layer without rows and several at others
    for counts, length in (
        ([1] * (config.n_layers + 1), 2),
        ([3, 0, *[2] * config.n_layers][: config.n_layers + 1], 13),
    ):
        grads = [torch.randn(n, config.d_model, generator=generator) for n in counts]
        positions = [torch.randint(0, length, (n,), generator=generator) for n in counts]
        ids = torch.randint(3, 200, (1, length), generator=generator)
        feeds = [t.numpy() for t in (ids, *grads, *positions)]
        got = session.run(None, dict(zip(names, feeds, strict=True)))
        with torch.no_grad():
            want = BackwardGraph(model, transcoders)(ids, grads, positions)
        for name, g, w in zip(BACKWARD_OUTPUTS, got, want, strict=True):
            w = w.numpy()
            assert g.shape == w.shape, name
            scale = max(float(np.abs(w).max()), 1e-30)
            np.testing.assert_allclose(g / scale, w / scale, atol=1e-5, rtol=0, err_msg=name)
    graph = onnx.load(str(path), load_external_data=False).graph
    names = {i.name for i in graph.initializer}
    assert "blocks.0.attn.proj.weight.T" in names or "blocks.0.attn.proj.weight" in names
    assert not any(n.startswith("model.") for n in names)  # the encoder's own names
