"""attnserve.v1's Encode over a real data plane: its answer is made while the request still
holds its room in the memory budget, and the room comes back after."""

import asyncio

from attnserve.client import build_request
from attnserve.service.core.budget import ByteBudget
from attnserve.service.core.metrics import Metrics
from attnserve.service.models import build_model
from attnserve.service.settings import Settings
from attnserve.service.v1.encode import encode
from attnserve.v1 import encoder_service_pb2 as pb


def test_the_answer_is_made_inside_the_requests_reservation(small_model_dir, small_runtime):
    async def scenario():
        budget = ByteBudget(1 << 30)
        plane = build_model(
            Settings(model=small_model_dir), Metrics(), budget, None, "1", small_model_dir,
            [small_runtime],
        )  # fmt: skip
        await plane.start()
        request = build_request([[1, 2, 3, 4]], attention=True, attention_layout="causal-packed")

        def finish(answer):
            return budget.used, answer.serialize()

        try:
            held, sent = await encode(plane, request, None, finish)
        finally:
            await plane.stop()
        return held, sent, budget.used

    held, sent, after = asyncio.run(scenario())
    assert held > 0 and after == 0
    assert pb.EncodeResponse.FromString(sent).results[0].token_ids == [1, 2, 3, 4]
