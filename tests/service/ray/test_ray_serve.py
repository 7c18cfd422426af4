"""attnserve on Ray Serve, on a real local Ray cluster of two nodes (127.0.0.1 only): Ray's
own proxies, placement, restarts and autoscaler around the project's data plane.

Replicas land on both nodes; answers over Ray's HTTP and gRPC proxies equal the direct
server's; a replica killed under load is restarted by Ray while a client that retries as
attnserve's does loses no request; autoscaling adds a replica under load and removes it
after; deleting the application lets an admitted request finish.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import grpc
import httpx
import numpy as np
import pytest

from attnserve.client import ClientOptions, EncoderClient
from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from tests.conftest import SMALL_CONFIG

ray = pytest.importorskip("ray", reason="the ray extra: `make install` has it")
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.serve.config import HTTPOptions, gRPCOptions  # noqa: E402
from ray.util.state import list_actors  # noqa: E402

from attnserve.service.ray.app import GRPC_SERVICERS, Encoder, actor_options  # noqa: E402

IDS = [5, 6, 7, 8, 9, 10, 11, 12]
REPLICA = "ServeReplica:attnserve:Encoder"
SETTINGS = {"provider": "cpu", "threads": 1, "instances": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, what: str, timeout: float = 120) -> None:
    """Wait until `condition()` holds: Ray reports placement and scaling by state, not by
    event, so this asks its state API until the state is there (or the time is up)."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.25)


def replicas() -> list:
    return list_actors(filters=[("class_name", "=", REPLICA), ("state", "=", "ALIVE")])


@pytest.fixture(scope="module")
def ray_cluster():
    """Two Ray nodes on this host, one CPU each; Serve's proxies on the head node."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    ports = {"http": free_port(), "grpc": free_port()}
    serve.start(
        proxy_location="HeadOnly",
        http_options=HTTPOptions(host="127.0.0.1", port=ports["http"]),
        grpc_options=gRPCOptions(port=ports["grpc"], grpc_servicer_functions=GRPC_SERVICERS),
    )
    yield cluster, ports
    serve.shutdown()
    ray.shutdown()
    cluster.shutdown()


def deploy(small_model_dir, **options) -> None:
    app = Encoder.options(**options).bind(model=str(small_model_dir), **SETTINGS)
    serve.run(app, name="attnserve", route_prefix="/")


@pytest.fixture(scope="module")
def two_replicas(ray_cluster, small_model_dir):
    deploy(small_model_dir, num_replicas=2, ray_actor_options=actor_options())
    wait_for(lambda: len(replicas()) == 2, "two replicas")
    return ray_cluster[1]


def test_replicas_are_placed_on_both_nodes(two_replicas):
    assert len({actor.node_id for actor in replicas()}) == 2


def test_answers_through_rays_proxies_equal_the_direct_servers(two_replicas, client):
    direct = client.encode(IDS, attention=True)[0]
    with EncoderClient(f"127.0.0.1:{two_replicas['grpc']}") as ray_client:
        assert ray_client.model_info()["name"] == SMALL_CONFIG.name
        through_grpc = ray_client.encode(IDS, attention=True)[0]
        by_layer = ray_client.encode_layers(IDS, attention=True)[0]  # a stream through Ray
        with pytest.raises(grpc.RpcError) as error:  # the project's status codes survive
            ray_client.encode(IDS, model="nope")
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
    np.testing.assert_allclose(through_grpc.embeddings, direct.embeddings, atol=1e-5, rtol=0)
    np.testing.assert_allclose(through_grpc.attention, direct.attention, atol=1e-5, rtol=0)
    np.testing.assert_allclose(
        np.stack(by_layer.attention_by_layer), direct.attention, atol=1e-5, rtol=0
    )

    channel = grpc.insecure_channel(f"127.0.0.1:{two_replicas['grpc']}")
    request = oip.ModelInferRequest(model_name=SMALL_CONFIG.name)
    request.inputs.add(name="input_ids", datatype="INT64", shape=[1, len(IDS)])
    request.raw_input_contents.append(np.array([IDS], "<i8").tobytes())
    request.outputs.add(name="embeddings")
    answer = oip_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    channel.close()
    v2 = np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(1, len(IDS), -1)
    np.testing.assert_allclose(v2[0], direct.embeddings, atol=1e-5, rtol=0)

    url = f"http://127.0.0.1:{two_replicas['http']}"
    body = {"inputs": [{"tokenIds": {"ids": IDS}}], "tensor_format": "list"}
    result = httpx.post(f"{url}/v1/encode", json=body, timeout=60).json()["results"][0]
    embeddings = np.array(result["embeddings"]["values"])
    np.testing.assert_allclose(embeddings, direct.embeddings, atol=1e-5, rtol=0)
    extensions = httpx.get(f"{url}/v2", timeout=60).json()["extensions"]
    assert "system_shared_memory" not in extensions and "model_repository" not in extensions
    assert httpx.get(f"{url}/v2/systemsharedmemory/status", timeout=60).status_code == 501


def test_a_replica_killed_under_load_loses_no_request(two_replicas, client):
    """SIGKILL to one replica's process while 4 clients keep sending: Ray routes around
    it and starts another. attnserve's client retries; Ray's proxy answers the requests
    that were on the dead replica INTERNAL, so it retries that too (ClientOptions'
    retry_codes, as docs/deployment.md says for a Ray deployment)."""
    expected = client.encode(IDS)[0].embeddings
    failures: list[BaseException] = []
    wrong: list[float] = []
    answered = threading.Semaphore(0)
    stop = threading.Event()

    def loop() -> None:
        codes = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
        options = ClientOptions(timeout_s=60, retries=8, backoff_s=0.1, retry_codes=codes)
        with EncoderClient(f"127.0.0.1:{two_replicas['grpc']}", options) as c:
            while not stop.is_set():
                try:
                    out = c.encode(IDS)[0].embeddings
                except grpc.RpcError as exc:
                    failures.append(exc)
                    continue
                if not np.allclose(out, expected, atol=1e-5, rtol=0):
                    wrong.append(float(np.abs(out - expected).max()))
                answered.release()

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(20):
            assert answered.acquire(timeout=60)
        victim = replicas()[0]
        os.kill(victim.pid, signal.SIGKILL)
        wait_for(
            lambda: (
                len(replicas()) == 2 and victim.actor_id not in [a.actor_id for a in replicas()]
            ),
            "Ray to replace the killed replica",
        )
        for _ in range(20):  # and the new replica answers too
            assert answered.acquire(timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert failures == [] and wrong == []


def test_autoscaling_adds_a_replica_under_load_and_removes_it_after(ray_cluster, small_model_dir):
    grpc_port = ray_cluster[1]["grpc"]
    deploy(
        small_model_dir,
        num_replicas="auto",
        ray_actor_options=actor_options(),
        autoscaling_config={
            "min_replicas": 1,
            "max_replicas": 2,
            "target_ongoing_requests": 1,
            "upscale_delay_s": 0.5,
            "downscale_delay_s": 2,
            "metrics_interval_s": 0.5,
            "look_back_period_s": 1,
        },
    )
    wait_for(lambda: len(replicas()) == 1, "one replica at rest")
    stop = threading.Event()

    def loop() -> None:
        with EncoderClient(f"127.0.0.1:{grpc_port}", ClientOptions(timeout_s=60)) as c:
            while not stop.is_set():
                c.encode([IDS] * 8, attention=True)

    threads = [threading.Thread(target=loop) for _ in range(6)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(replicas()) == 2, "a second replica under load")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    wait_for(lambda: len(replicas()) == 1, "back to one replica after the load")


def test_deleting_the_application_lets_an_admitted_request_finish(ray_cluster, small_model_dir):
    deploy(small_model_dir, num_replicas=1, ray_actor_options=actor_options())
    wait_for(lambda: len(replicas()) == 1, "one replica")
    grpc_port = ray_cluster[1]["grpc"]
    result: list = []

    def long_request() -> None:
        with EncoderClient(f"127.0.0.1:{grpc_port}", ClientOptions(retries=0)) as c:
            try:
                result.append(c.encode([list(range(3, 259))] * 16, attention=True))
            except grpc.RpcError as exc:
                result.append(exc)

    thread = threading.Thread(target=long_request)
    thread.start()
    wait_for(lambda: _ongoing() > 0, "the request to be admitted")
    # Deleting the application drains its replicas behind the proxy that is still up.
    # (serve.shutdown(), `serve shutdown`, closes the proxies at once: an admitted request
    # would see UNAVAILABLE "Socket closed"; docs/deployment.md says to delete first.)
    serve.delete("attnserve")
    thread.join(120)
    assert len(result) == 1 and not isinstance(result[0], grpc.RpcError), result


def _ongoing() -> int:
    """Requests the replicas are working on, as each replica actor counts them."""
    handles = [ray.get_actor(actor.name, namespace="serve") for actor in replicas()]
    return sum(ray.get([h.get_num_ongoing_requests.remote() for h in handles]))
