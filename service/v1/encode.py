"""attnserve.v1's calls over one model's data plane: Encode, EncodeLayers and GetModelInfo,
whatever carries them (gRPC in service/grpc/encoder.py, JSON in service/http/encode.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.readouts import DECODE
from attnserve.service.v1.options import inputs_of, options_of
from attnserve.service.v1.response import EncodeAnswer, build_response, split_attention_layers
from attnserve.v1 import encoder_service_pb2 as pb

Sent = TypeVar("Sent")


async def encode(
    plane: DataPlane,
    request: pb.EncodeRequest,
    timeout: float | None,
    finish: Callable[[EncodeAnswer], Sent],
) -> Sent:
    """The whole request: refuse or admit, plan, batch, build. `timeout`: the seconds the
    caller will still wait (its deadline); queued work past it is dropped unrun. `finish`
    makes what goes out of the answer (its bytes, a stream's envelope, the JSON of its
    message) while the request still holds its room in the memory budget: the answer's
    arrays are let go once it returns, and only what it made is left to send."""
    start = time.perf_counter_ns()
    inputs, options = inputs_of(request), options_of(request.options)
    async with plane.results(inputs, options, timeout) as (plan, results):
        answer = build_response(
            plan, results, plane.tokenizer, plane.view.version, request.request_id
        )
        answer.message.timings.total_ns = time.perf_counter_ns() - start
        return finish(answer)


async def encode_layers(
    plane: DataPlane, request: pb.EncodeRequest, timeout: float | None = None
) -> AsyncIterator[bytes]:
    """EncodeLayers' answer as serialized EncodeLayersResponses: the response without the
    attention weights, then the weights one layer of one input at a time. The request
    holds its room in the memory budget until the last part has been taken."""
    start = time.perf_counter_ns()
    inputs, options = inputs_of(request), options_of(request.options)
    async with plane.results(inputs, options, timeout, by_layer=True) as (plan, results):
        rest, layers = split_attention_layers(plan, results)
        answer = build_response(plan, rest, plane.tokenizer, plane.view.version, request.request_id)
        answer.message.timings.total_ns = time.perf_counter_ns() - start
        yield answer.serialize_in(pb.EncodeLayersResponse(), "response")
        for layer in layers:
            yield layer.serialize()


def model_info(plane: DataPlane) -> pb.GetModelInfoResponse:
    c, weights = plane.view.config, plane.weights
    return pb.GetModelInfoResponse(
        name=plane.name,
        version=plane.view.version,
        n_layers=c.n_layers,
        n_heads=c.n_heads,
        n_kv_heads=c.kv_heads,
        kv_heads=c.kv_head_of,
        d_model=c.d_model,
        max_seq_len=c.max_seq_len,
        vocab_size=c.vocab_size,
        tokenizer=plane.tokenizer.kind,
        provider=plane.view.provider,
        precision=plane.view.precision,
        config_json=c.to_json(),
        max_message_bytes=plane.max_message_bytes,
        max_batch_tokens=plane.engine.options.max_batch_tokens,
        bos_id=c.bos_id,
        pad_id=c.pad_id,
        weight_bytes=weights.disk_bytes,
        resident_weight_bytes=weights.resident_bytes,
        attention_max_abs_diff=weights.attention_max_abs_diff,
        embedding_cosine_min=weights.embedding_cosine_min,
        output_fidelity=weights.output_fidelity,
        fidelity_scope=weights.fidelity_scope,
        saes=[
            pb.SAEInfo(
                name=name,
                hook_name=sae.hook_name,
                architecture=sae.architecture,
                d_in=sae.d_in,
                d_sae=sae.d_sae,
                hook_name_out=sae.hook_name_out if sae.transcoder else "",
            )
            for name, sae in sorted(plane.view.saes.items())
        ],
        generates=DECODE in plane.view.graphs,
        chat_template=plane.chat is not None,
        eos_id=c.eos_id,
        transcoder_sets=plane.transcoder_sets,
        gradient_lengths=plane.view.gradient_lengths,
    )
