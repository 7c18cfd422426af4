"""The full graph through ONNX's fused Attention op: the embeddings-only graph, whose
Attention nodes are asked for their softmax probabilities too.

The traced full graph (model.onnx) computes attention the textbook way, op by op:
per layer it materialises the scores, the masked scores and the softmax. The
embeddings-only graph already does all of that inside one `Attention` node per
layer (opset 23); that op can also return its probabilities
(`qk_matmul_output_mode` 3), so stacking them gives the same outputs as the
full graph with less memory traffic. ONNX Runtime's CPU kernel implements that
output; its CUDA kernel does not yet, so the service runs this graph on CPU
only and the traced one everywhere else. The export checks its parity with
PyTorch like any other graph.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from attnserve.export.onnx_files import save_checked
from attnserve.model.artifacts import CONFIG_METADATA_KEY
from attnserve.model.config import ModelConfig

SOFTMAX_PROBABILITIES = 3  # Attention's qk_matmul_output_mode: the output after the softmax


def with_attention_weights(src: str | Path, dst: str | Path) -> Path:
    """Write the embeddings-only graph `src` with the attentions output added to `dst`."""
    model = onnx.load(str(src), load_external_data=False)  # the weights stay where they are
    metadata = {p.key: p.value for p in model.metadata_props}
    config = ModelConfig.from_json(metadata[CONFIG_METADATA_KEY])
    _output_attention_weights(model.graph, config)
    model.doc_string = model.doc_string.replace(
        f"['{config.embeddings_name}']",
        f"['{config.embeddings_name}', '{config.attentions_name}'] (fused attention)",
    )
    return save_checked(model, dst)


def _output_attention_weights(graph: onnx.GraphProto, config: ModelConfig) -> None:
    """Make every Attention node also output its probabilities, (B, H, T, T), and stack
    them, first layer first, into the graph output (B, L, H, T, T)."""
    layers = [node for node in graph.node if node.op_type == "Attention"]  # in layer order
    # The names added here start with "fused_": the exporter's own ("stack_1" for a
    # torch.stack) must not collide with them.
    if len(layers) != config.n_layers:
        raise ValueError(f"expected {config.n_layers} Attention nodes, found {len(layers)}")
    make, tensor, int64 = onnx.helper.make_node, onnx.helper.make_tensor, onnx.TensorProto.INT64
    # Each layer's (B, H, T, T) is reshaped to (B, 1, H, T, T) with a shape taken from the
    # input, not unsqueezed: ONNX's shape inference gives the probabilities' key axis a
    # fixed size 0, which a static shape would carry to the output and ORT would then
    # warn about on every run.
    graph.initializer.extend(
        [
            tensor("fused_stack_0", int64, [1], [0]),
            tensor("fused_stack_1", int64, [1], [1]),
            tensor("fused_stack_2", int64, [1], [2]),
            tensor("fused_stack_1_h", int64, [2], [1, config.n_heads]),
        ]
    )
    graph.node.extend(
        [
            make("Shape", [config.input_name], ["fused_stack_ids_shape"]),  # (B, T)
            make(
                "Slice",
                ["fused_stack_ids_shape", "fused_stack_0", "fused_stack_1"],
                ["fused_stack_b"],
            ),
            make(
                "Slice",
                ["fused_stack_ids_shape", "fused_stack_1", "fused_stack_2"],
                ["fused_stack_t"],
            ),
            make(
                "Concat",
                ["fused_stack_b", "fused_stack_1_h", "fused_stack_t", "fused_stack_t"],
                ["fused_stack_shape"],
                axis=0,
            ),
        ]
    )
    stacked = []
    for i, node in enumerate(layers):
        for attribute in [a for a in node.attribute if a.name == "qk_matmul_output_mode"]:
            node.attribute.remove(attribute)
        node.attribute.append(
            onnx.helper.make_attribute("qk_matmul_output_mode", SOFTMAX_PROBABILITIES)
        )
        node.output.extend([""] * (4 - len(node.output)))  # no present key / value
        node.output[3] = f"fused_attention_weights_{i}"  # (B, H, T, T)
        stacked.append(f"fused_attention_weights_{i}_stacked")  # (B, 1, H, T, T)
        graph.node.append(make("Reshape", [node.output[3], "fused_stack_shape"], [stacked[-1]]))
    graph.node.append(make("Concat", stacked, [config.attentions_name], axis=1))
    batch, seq = (d.dim_param for d in graph.input[0].type.tensor_type.shape.dim)
    shape = [batch, config.n_layers, config.n_heads, seq, seq]
    graph.output.append(
        onnx.helper.make_tensor_value_info(config.attentions_name, onnx.TensorProto.FLOAT, shape)
    )
