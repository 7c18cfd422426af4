"""A short latency sweep through the real server: every call right, latency rising with length."""

import time

import numpy as np

from client import ClientOptions, EncoderClient
from tests.conftest import ServerThread

SEQ_LENS = [8, 16, 32, 64, 128, 256, 512]


def test_latency_rises_with_sequence_length(default_export):
    server = ServerThread(default_export[0])
    runtime = server.running.runtime
    rng = np.random.default_rng(0)
    p50 = []
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            # Untimed: the channel's connection and the server's first-call costs would
            # otherwise land on the shortest length alone.
            for _ in range(3):
                client.encode([[1] * SEQ_LENS[0]])
            for t in SEQ_LENS:
                ids = rng.integers(0, 259, size=(1, t), dtype=np.int64)
                want = runtime.embed(ids)[0]
                times = []
                for _ in range(5):
                    start = time.perf_counter()
                    out = client.encode([ids[0]])
                    times.append(time.perf_counter() - start)
                    np.testing.assert_allclose(out[0].embeddings, want, atol=1e-5)
                p50.append(float(np.median(times)))
    finally:
        server.stop()
    # Shape, not absolute times: the rank order follows the length closely, and the
    # longest sequence costs several times the shortest (it is ~60x the FLOPs).
    ranks = np.argsort(np.argsort(p50))
    spearman = np.corrcoef(ranks, np.arange(len(SEQ_LENS)))[0, 1]
    assert spearman >= 0.9, dict(zip(SEQ_LENS, p50, strict=True))
    assert p50[-1] > 4 * p50[0]
