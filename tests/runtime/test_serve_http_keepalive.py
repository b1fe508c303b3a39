"""The guest's HTTP front answers kept-alive requests without Nagle's ~40 ms wait: its status line and headers
go out in one write and the body in a second, small one, which Nagle's algorithm held back until the client's
delayed acknowledgement of the first (every answer after the first few took >= 40 ms; found by
benchmarks/serving.py). The front sets TCP_NODELAY on each connection."""
from __future__ import annotations

import http.client
import json
import socket
import statistics
import time


from secureflhv.runtime.serve import http_api
from secureflhv.runtime.serve.front import ScoreResult, serve_front


class InstantScorer:
    feature_columns = ["a", "b"]
    max_batch = 4

    def score(self, request, timeout_s):
        return ScoreResult(request.features.sum(axis=1), {}, "fp")

    def health(self):
        return {"model": "fp"}

    def ready(self):
        return True, ""

    def swap(self, model_dir):
        return "fp"


def test_kept_alive_answers_do_not_wait_for_the_clients_delayed_ack():
    front = serve_front(InstantScorer(), rate=1e6, burst=1_000_000, timeout_s=5.0)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", front.http_port, timeout=5)
        took = []
        for k in range(30):   # the same connection: delayed ACK sets in after the first few segments
            body = json.dumps({"ids": [f"c-{k}"], "features": [[1.0, 2.0]]}).encode()
            t0 = time.perf_counter()
            conn.request("POST", "/v1/score", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            answer = json.loads(resp.read())
            took.append(time.perf_counter() - t0)
            assert resp.status == 200 and answer["scores"] == [3.0]
        conn.close()
    finally:
        front.close()
    assert statistics.median(took) < 0.030, [round(t * 1e3, 1) for t in took]  # 40+ ms each without TCP_NODELAY


def test_each_connection_gets_tcp_nodelay(monkeypatch):
    seen = []
    setup = http_api._Handler.setup

    def spy(self):
        setup(self)
        seen.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    monkeypatch.setattr(http_api._Handler, "setup", spy)
    front = serve_front(InstantScorer(), rate=1e6, burst=1_000_000, timeout_s=5.0)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", front.http_port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        front.close()
    assert seen and all(v != 0 for v in seen), seen


def test_callers_connecting_at_once_are_not_left_to_the_syn_retransmission():
    """The listen backlog was socketserver's 5: with the process busy scoring, a burst of new connections
    overflowed it, and each connection over it waited for its SYN to be resent (1 s)."""
    import threading

    assert http_api._Server.request_queue_size >= 128

    class Busy(InstantScorer):
        def score(self, request, timeout_s):
            t = time.perf_counter()
            while time.perf_counter() - t < 0.02:  # holds the GIL, as scoring does
                pass
            return super().score(request, timeout_s)

    front = serve_front(Busy(), rate=1e6, burst=1_000_000, timeout_s=10.0)
    first: list[float] = []

    def caller(k):
        conn = http.client.HTTPConnection("127.0.0.1", front.http_port, timeout=10)
        t0 = time.perf_counter()
        conn.request("POST", "/v1/score", json.dumps({"ids": [f"c-{k}"], "features": [[1.0, 2.0]]}).encode(),
                     {"Content-Type": "application/json"})
        conn.getresponse().read()
        first.append(time.perf_counter() - t0)
        conn.close()
    try:
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(32)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
    finally:
        front.close()
    assert len(first) == 32 and max(first) < 0.9, sorted(round(t, 2) for t in first)[-5:]
