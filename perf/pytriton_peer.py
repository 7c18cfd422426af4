"""PyTriton serving attnserve's graphs: Triton's own server in front, the ORT sessions in a
Python inference callable.

Runs only inside PyTriton's own virtual environment (peer_env.py makes it, with the
project's onnxruntime), so it imports nothing of attnserve; the session settings come
from the parent as JSON (kserve_peer.session_options reads them, as the KServe peer does).

    python pytriton_peer.py serve --model-dir DIR --port PORT --http-port PORT --session JSON

PyTriton's defaults but for the ports, the loopback address, no metrics and no batching
(`batching=False`: each request as it came, as in the other peers). tritonclient
(kserve_peer.py's `client`) measures it over the Open Inference Protocol.
"""

from __future__ import annotations

import json

import numpy as np
from kserve_peer import LOOPBACK, MODEL_NAME, serve_command, session_options


def serve(model_dir: str, port: int, http_port: int, session: dict) -> None:
    import onnxruntime as ort
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    options = session_options(session)

    def open_graph(name: str) -> ort.InferenceSession:
        path = f"{model_dir}/{name}"
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    embeddings_graph, full_graph = (
        open_graph("model_embeddings.onnx"),
        open_graph(session["attention_graph"]),
    )

    def infer(requests):
        """Embeddings from the embeddings graph; with attention asked for, the full graph."""
        answers = []
        for request in requests:
            ids = {"input_ids": request["input_ids"]}
            if "attentions" in (request.requested_output_names or ()):
                embeddings, attentions = full_graph.run(None, ids)
                answers.append({"embeddings": embeddings, "attentions": attentions})
            else:
                answers.append({"embeddings": embeddings_graph.run(None, ids)[0]})
        return answers

    config = TritonConfig(
        grpc_address=LOOPBACK,
        grpc_port=port,
        http_address=LOOPBACK,
        http_port=http_port,
        allow_metrics=False,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=MODEL_NAME,
            infer_func=infer,
            inputs=[Tensor(name="input_ids", dtype=np.int64, shape=(-1, -1))],
            outputs=[
                Tensor(name="embeddings", dtype=np.float32, shape=(-1, -1, -1)),
                Tensor(name="attentions", dtype=np.float32, shape=(-1, -1, -1, -1, -1)),
            ],
            config=ModelConfig(batching=False),
        )
        triton.serve()


def main() -> None:
    args = serve_command(__doc__.splitlines()[0])[0].parse_args()
    serve(args.model_dir, args.port, args.http_port, json.loads(args.session))


if __name__ == "__main__":
    main()
