"""MLServer serving attnserve's graphs: a custom runtime over one ORT session per graph.

Runs only inside MLServer's own virtual environment (peer_env.py makes it, with the
project's onnxruntime), so it imports nothing of attnserve; the session settings come
from the parent as JSON (kserve_peer.session_options reads them, as the KServe peer does).

    python mlserver_peer.py serve --model-dir DIR --port PORT --http-port PORT --session JSON

MLServer's settings are its defaults but for the ports, the loopback address, the message
limit and `parallel_workers = 0`: the model runs in the server's own process, as in the
other peers (MLServer's default hands every request to a worker process). tritonclient
(kserve_peer.py's `client`) measures it over the Open Inference Protocol.
"""

from __future__ import annotations

import asyncio
import json

from kserve_peer import LOOPBACK, MESSAGE_LIMIT, MODEL_NAME, serve_command, session_options
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Encoder(MLModel):
    """Embeddings from the embeddings graph; with attention asked for, the full graph."""

    async def load(self) -> bool:
        import onnxruntime as ort

        extra = self.settings.parameters.extra
        options = session_options(extra["session"])

        def open_graph(name: str) -> ort.InferenceSession:
            path = f"{extra['model_dir']}/{name}"
            return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

        self.embeddings = open_graph("model_embeddings.onnx")
        self.full = open_graph(extra["session"]["attention_graph"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        ids = NumpyCodec.decode_input(payload.inputs[0])
        wanted = {o.name for o in payload.outputs or []}
        if "attentions" in wanted:
            embeddings, attentions = self.full.run(None, {"input_ids": ids})
            results = {"embeddings": embeddings, "attentions": attentions}
        else:
            results = {"embeddings": self.embeddings.run(None, {"input_ids": ids})[0]}
        outputs = [NumpyCodec.encode_output(name, array) for name, array in results.items()]
        return InferenceResponse(model_name=self.name, outputs=outputs)


async def serve(model_dir: str, port: int, http_port: int, session: dict) -> None:
    from mlserver import MLServer
    from mlserver.settings import ModelParameters, ModelSettings, Settings

    settings = Settings(
        host=LOOPBACK,
        grpc_port=port,
        http_port=http_port,
        metrics_port=0,
        metrics_endpoint=None,
        grpc_max_message_length=MESSAGE_LIMIT,
        parallel_workers=0,
    )
    model = ModelSettings(
        name=MODEL_NAME,
        implementation=Encoder,
        parameters=ModelParameters(extra={"model_dir": model_dir, "session": session}),
    )
    await MLServer(settings).start([model])


def main() -> None:
    args = serve_command(__doc__.splitlines()[0])[0].parse_args()
    asyncio.run(serve(args.model_dir, args.port, args.http_port, json.loads(args.session)))


if __name__ == "__main__":
    main()
