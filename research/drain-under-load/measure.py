"""Two servers behind one round-robin client under Encode load (the README's scale-out
recipe): kill one, restart it, then SIGTERM the other; count every status the clients saw
(research/drain-under-load).

    .venv/bin/python research/drain-under-load/measure.py MODEL_DIR [RUNS]
"""

import collections
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

from attnserve.client import ClientOptions, EncoderClient

MODEL = Path(sys.argv[1])
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port):
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)  # noqa: SIM115 (the child writes it)
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attnserve",
            "serve",
            "--model",
            str(MODEL),
            "--provider",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--http-port",
            "-1",
            "--metrics-port",
            "-1",
            "--grace-seconds",
            "10",
        ],
        stdout=log,
        stderr=log,
        cwd=Path(__file__).resolve().parents[2],
    )
    c = EncoderClient(f"127.0.0.1:{port}", ClientOptions(timeout_s=60))
    c.wait_until_serving(120)
    c.channel.close()
    return p


def run():
    ports = [free_port(), free_port()]
    procs = [start(p) for p in ports]
    target = "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in ports)
    client = EncoderClient(target, ClientOptions(round_robin=True, timeout_s=30))
    client.wait_until_serving(30)
    codes = collections.Counter()
    stop = threading.Event()
    details = collections.Counter()

    def loop():
        while not stop.is_set():
            try:
                client.encode("The cat sat on the mat.", pooling="mean")
                codes["OK"] += 1
            except grpc.RpcError as e:
                codes[e.code().name] += 1
                details[(e.code().name, e.details()[:80], round(time.monotonic() - T0, 2))] += 1

    global T0
    T0 = time.monotonic()
    threads = [threading.Thread(target=loop) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(3)
    print("kill", round(time.monotonic() - T0, 2))
    procs[0].kill()
    procs[0].wait()
    time.sleep(1)
    procs[0] = start(ports[0])
    time.sleep(3)
    print("term", round(time.monotonic() - T0, 2))
    procs[1].send_signal(signal.SIGTERM)
    procs[1].wait(60)
    print("exited", round(time.monotonic() - T0, 2))
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join()
    procs[0].terminate()
    procs[0].wait(60)
    print(dict(codes), dict(details))


for _ in range(RUNS):
    run()
