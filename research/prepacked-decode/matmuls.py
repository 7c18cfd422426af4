"""Eight pairs of TinyLlama-1.1B's MLP matrices as one ONNX graph: a decode step's matrix
products at batch 1 and 8, with and without ONNX Runtime's prepacking (README.md)."""

import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

D, FF, PAIRS, RUNS = 2048, 5632, 8, 10


def graph(path: Path) -> None:
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(PAIRS):
        for name, shape in ((f"up{i}", (D, FF)), (f"down{i}", (FF, D))):
            array = (rng.standard_normal(shape) * 0.01).astype(np.float32)
            weights.append(numpy_helper.from_array(array, name))
        nodes += [
            helper.make_node("MatMul", [x, f"up{i}"], [f"h{i}"]),
            helper.make_node("MatMul", [f"h{i}", f"down{i}"], [f"y{i}"]),
        ]
        x = f"y{i}"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", D])]
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", D])]
    model = helper.make_model(
        helper.make_graph(nodes, "mlps", inputs, outputs, weights),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=9,
    )
    onnx.save(model, path, save_as_external_data=True, location="weights.data")


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "mlps.onnx"
        graph(path)
        for prepack in (True, False):
            options = ort.SessionOptions()
            if not prepack:
                options.add_session_config_entry("session.disable_prepacking", "1")
            session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            for batch in (1, 8):
                x = np.random.default_rng(1).standard_normal((batch, D)).astype(np.float32)
                session.run(None, {"x": x})
                start = time.perf_counter()
                for _ in range(RUNS):
                    session.run(None, {"x": x})
                seconds = (time.perf_counter() - start) / RUNS
                rate = 2 * PAIRS * D * FF * 4 / seconds / 1e9
                print(f"prepack {prepack} batch {batch}: {seconds * 1e3:.1f} ms ({rate:.1f} GB/s)")


if __name__ == "__main__":
    main()
