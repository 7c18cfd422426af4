"""A sweep of sequence lengths through the real server on the default model: every answer right.

How latency grows with length is measured by `attnserve bench latency` (docs/BENCHMARKS.md),
not here: shared machines make timings too noisy to assert on.
"""

import numpy as np

from attnserve.client import ClientOptions, EncoderClient
from tests.conftest import ServerThread

SEQ_LENS = [1, 8, 16, 32, 64, 128, 256, 512, 1024]


def test_every_length_up_to_max_seq_len_equals_the_runtime(default_export):
    server = ServerThread(default_export[0])
    runtime = server.running.backend
    rng = np.random.default_rng(0)
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            for t in SEQ_LENS:
                ids = rng.integers(0, 259, size=(1, t), dtype=np.int64)
                out = client.encode([ids[0]], pooling="last")
                want = runtime.embed(ids)[0]
                np.testing.assert_allclose(out[0].embeddings, want, atol=1e-5, rtol=0)
                np.testing.assert_allclose(out[0].pooled, want[-1], atol=1e-5, rtol=0)
    finally:
        server.stop()
