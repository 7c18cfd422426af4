"""round_robin spreads calls over every address of the target, as scaled replicas need."""

from attnserve.client import ClientOptions, EncoderClient
from tests.conftest import ServerThread

OK_ENCODES = ("attnserve_requests_total", {"method": "Encode", "code": "OK"})


def test_round_robin_over_an_address_list_reaches_every_server(server, small_model_dir):
    other = ServerThread(small_model_dir, server.running.backend)
    try:
        servers = [server, other]
        before = [s.metric(*OK_ENCODES) for s in servers]
        target = "ipv4:" + ",".join(s.address for s in servers)  # gRPC's own resolver scheme
        with EncoderClient(target, ClientOptions(round_robin=True)) as client:
            client.wait_until_serving(30)
            for _ in range(20):
                client.encode([[1, 2, 3]])
        served = [s.metric(*OK_ENCODES) - b for s, b in zip(servers, before, strict=True)]
    finally:
        other.stop()
    assert sum(served) == 20
    assert min(served) >= 8, served  # round_robin alternates over ready subchannels
