"""The guest's request front end (secureflhv.runtime.serve.front / gate / http_api / grpc_api) against a fake
scorer: every endpoint and status over HTTP and gRPC, rate limits, the request timeout, garbage on the
socket, the request log, and the statistics against numpy."""
from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
import time

import grpc
import numpy as np
import pytest

from secureflhv.proto import serving_pb2 as pb
from secureflhv.proto import serving_pb2_grpc as pb_grpc
from secureflhv.runtime.serve import http_api
from secureflhv.runtime.serve.front import (LatencyStats, RateLimiter, ScoreResult, Scorer, ServeError,
                                            serve_front)
from secureflhv.transport.certs import generate_certificates

COLUMNS = ["age", "income", "debt"]
SECRET = 987654.125  # a feature value that must never reach a log line


class FakeScorer:
    """Deterministic: score = row sum (or 0 without features); `missing` for ids starting with "new";
    `sleep_s` delays; `raise_status` raises that ServeError; `crash` raises a plain exception."""

    feature_columns = COLUMNS
    max_batch = 4

    def __init__(self):
        self.sleep_s, self.raise_status, self.crash, self.classes = 0.0, None, False, 0
        self.is_ready, self.seen = (True, ""), []

    def score(self, request, timeout_s):
        self.seen.append(request)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.crash:
            raise KeyError("boom in the scorer")
        if self.raise_status:
            raise ServeError(self.raise_status, f"host-1 at 10.0.0.2:9000 is down ({self.raise_status})")
        m = len(request.ids)
        s = request.features.sum(axis=1) if request.features is not None else np.zeros(m)
        scores = np.stack([s, -s], axis=1) if self.classes else s
        return ScoreResult(scores, {i: ["host-1"] for i in request.ids if i.startswith("new")}, "fp-1")

    def health(self):
        return {"model": "fp-1"}

    def ready(self):
        return self.is_ready

    def swap(self, model_dir):
        if model_dir == "bad":
            raise ServeError("bad_request", "no bundle in 'bad'")
        return "fp-2"


@pytest.fixture
def scorer():
    return FakeScorer()


@pytest.fixture
def front(scorer):
    f = serve_front(scorer, rate=1000, burst=1000, timeout_s=0.3, max_body_bytes=4096)
    yield f
    f.close()


def call(port, method, path, body=None, headers=None, raw=False):
    """(status, headers, parsed JSON body) of one HTTP request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    data = body if raw or body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    out = resp.status, dict(resp.getheaders()), json.loads(resp.read() or b"null")
    conn.close()
    return out


def score(port, body, headers=None, raw=False):
    return call(port, "POST", "/v1/score", body, headers, raw)


# ------------------------------------------------------------------------------------------ HTTP
def test_score_http_rows_objects_and_no_features(front, scorer):
    status, headers, out = score(front.http_port, {"ids": ["a", "new-b"],
                                                   "features": [[1, 2.5, 3], {"debt": 1, "age": 2, "income": 4}]})
    assert status == 200 and out["scores"] == [6.5, 7.0] and out["model"] == "fp-1"
    assert out["missing"] == {"new-b": ["host-1"]} and out["latency_ms"] > 0
    assert headers["X-Request-Id"] == out["request_id"] and len(out["request_id"]) == 32
    assert scorer.seen[-1].caller == "127.0.0.1"
    np.testing.assert_array_equal(scorer.seen[-1].features, [[1, 2.5, 3], [2, 4, 1]])

    scorer.classes = 2
    status, _, out = score(front.http_port, {"ids": ["a"], "request_id": "req-7"}, {"X-Caller": "loan-app"})
    assert status == 200 and out["scores"] == [[0.0, -0.0]] and out["request_id"] == "req-7"
    assert scorer.seen[-1].features is None and scorer.seen[-1].caller == "loan-app"
    _, _, out = score(front.http_port, {"ids": ["a"]}, {"X-Request-Id": "hdr-1"})
    assert out["request_id"] == "hdr-1"


BAD_BODIES = [
    b"{not json", b"[1, 2]", b'"ids"', b"\xff\xfe", b"[" * 2000 + b"]" * 2000,
    json.dumps({"ids": []}).encode(), json.dumps({"ids": "a"}).encode(), json.dumps({"ids": [1, 2]}).encode(),
    json.dumps({"ids": [""]}).encode(), json.dumps({"ids": ["a"], "features": [[1, 2]]}).encode(),
    json.dumps({"ids": ["a", "b"], "features": [[1, 2, 3]]}).encode(),
    json.dumps({"ids": ["a"], "features": [{"age": 1, "income": 2}]}).encode(),
    json.dumps({"ids": ["a"], "features": [{"age": 1, "income": 2, "debt": 3, "x": 4}]}).encode(),
    json.dumps({"ids": ["a"], "features": [[1, str(SECRET), 3]]}).encode(),
    json.dumps({"ids": ["a"], "features": [[1, True, 3]]}).encode(),
    json.dumps({"ids": ["a"], "features": "x"}).encode(),
    b'{"ids": ["a"], "features": [[1, NaN, 3]]}', json.dumps({"ids": ["a"], "features": [[1, 1e400, 3]]}).encode(),
    json.dumps({"ids": ["a"], "extra": 1}).encode(), json.dumps({"ids": ["a"], "request_id": "a b\n"}).encode(),
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_bad_requests_are_400_and_never_echo_values(front, body):
    status, headers, out = score(front.http_port, body, raw=True)
    assert status == 400 and out["error"] == "bad_request", out
    assert str(SECRET) not in out["message"] and out["request_id"] == headers["X-Request-Id"]


def test_too_large_batch_and_body(front):
    status, _, out = score(front.http_port, {"ids": ["a"] * 5})
    assert status == 413 and out["error"] == "too_large" and "at most 4" in out["message"]
    status, headers, out = score(front.http_port, b" " * 5000, raw=True)
    assert status == 413 and out["error"] == "too_large" and headers["Connection"] == "close"


@pytest.mark.parametrize("status,code", [("bad_request", 400), ("too_large", 413), ("unavailable", 503),
                                         ("timeout", 504), ("internal", 500), ("rate_limited", 429)])
def test_scorer_errors_map_to_http(front, scorer, status, code):
    scorer.raise_status = status
    got, _, out = score(front.http_port, {"ids": ["a"]})
    assert got == code and out["error"] == status and "host-1 at 10.0.0.2:9000" in out["message"]


def test_crash_is_500_generic_and_logged(front, scorer, caplog):
    scorer.crash = True
    with caplog.at_level(logging.INFO, logger="secureflhv.serve"):
        status, _, out = score(front.http_port, {"ids": ["a"]})
    assert status == 500 and out["error"] == "internal" and "boom" not in out["message"]
    assert out["request_id"] in out["message"]
    failed = [r for r in caplog.records if r.exc_info]
    assert failed and "boom in the scorer" in str(failed[0].exc_info[1])


def test_rate_limit_429_then_recovery(scorer):
    with serve_front(scorer, rate=2, burst=2, grpc_port=None) as f:
        codes = [score(f.http_port, {"ids": ["a"]}, {"X-Caller": "app-1"})[0] for _ in range(2)]
        status, headers, out = score(f.http_port, {"ids": ["a"]}, {"X-Caller": "app-1"})
        assert codes == [200, 200] and status == 429 and out["error"] == "rate_limited"
        assert headers["Retry-After"] == "1" and 0 < out["retry_after_s"] <= 0.5
        assert score(f.http_port, {"ids": ["a"]}, {"X-Caller": "app-2"})[0] == 200  # per caller
        time.sleep(out["retry_after_s"] + 0.02)
        assert score(f.http_port, {"ids": ["a"]}, {"X-Caller": "app-1"})[0] == 200
        assert f.stats.snapshot()["by_status"] == {"ok": 4, "rate_limited": 1}


def test_timeout_504_within_the_bound(front, scorer):
    scorer.sleep_s = 2.0  # the answer must not wait for it: timeout 0.3 s + slack (generous for a loaded CI box)
    t0 = time.monotonic()
    status, _, out = score(front.http_port, {"ids": ["a"]})
    elapsed = time.monotonic() - t0
    assert status == 504 and out["error"] == "timeout" and 0.3 <= elapsed < 0.3 + 0.6
    assert front.stats.snapshot()["by_status"] == {"timeout": 1}


def test_overload_503_when_every_worker_is_busy(scorer):
    started, release = threading.Event(), threading.Event()
    scorer.score = lambda request, timeout_s: (started.set(), release.wait(2), ScoreResult(np.zeros(1), {}, "fp"))[2]
    with serve_front(scorer, grpc_port=None, max_in_flight=1, timeout_s=2) as f:
        first = threading.Thread(target=score, args=(f.http_port, {"ids": ["a"]}))
        first.start()
        assert started.wait(2)
        status, _, out = score(f.http_port, {"ids": ["b"]})
        release.set()
        first.join()
        assert status == 503 and "overloaded" in out["message"]


def test_health_ready_stats(front, scorer):
    assert call(front.http_port, "GET", "/healthz")[:3:2] == (200, {"model": "fp-1", "alive": True})
    assert call(front.http_port, "GET", "/readyz")[:3:2] == (200, {"ready": True})
    scorer.is_ready = (False, "host-2 unreachable at 10.0.0.3:9000")
    assert call(front.http_port, "GET", "/readyz")[:3:2] == (503, {"ready": False,
                                                                   "reason": "host-2 unreachable at 10.0.0.3:9000"})
    scorer.health = scorer.ready = lambda: 1 / 0
    status, _, out = call(front.http_port, "GET", "/healthz")
    assert status == 200 and out["alive"] is True and "health_error" in out
    assert call(front.http_port, "GET", "/readyz")[0] == 503
    score(front.http_port, {"ids": ["a", "b"]})
    status, _, snap = call(front.http_port, "GET", "/v1/stats")
    assert status == 200 and snap["requests"] == 1 and snap["ids_per_s"] >= 2 and snap["p99_ms"] > 0


def test_swap_loopback_only(front, monkeypatch):
    assert call(front.http_port, "POST", "/v1/swap", {"model_dir": "/bundles/v2"})[:3:2] == (200, {"model": "fp-2"})
    status, _, out = call(front.http_port, "POST", "/v1/swap", {"model_dir": "bad"})
    assert status == 400 and out["message"] == "no bundle in 'bad'"
    assert call(front.http_port, "POST", "/v1/swap", {"dir": "x"})[0] == 400
    monkeypatch.setattr(http_api, "is_loopback", lambda host: False)
    status, _, out = call(front.http_port, "POST", "/v1/swap", {"model_dir": "/bundles/v2"})
    assert status == 403 and out["error"] == "forbidden"


def _raw(port, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


GARBAGE = [b"\x00\x01\x02garbage\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 70000 + b"\r\n\r\n",
           b"POST /v1/score HTTP/1.1\r\nContent-Length: x\r\n\r\n",
           b"POST /v1/score HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
           b"POST /v1/score HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
           b"POST /v1/score HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"ids\"",
           b"PUT /v1/score HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"GET /nope HTTP/1.1\r\n\r\n",
           b"POST /v1/nope HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", b"GET /healthz HTTP/9.9\r\n\r\n", b""]


def test_garbage_on_the_socket_never_stops_the_server(front):
    rng = np.random.default_rng(7)
    fuzz = [rng.bytes(int(rng.integers(1, 400))) for _ in range(15)]
    fuzz += [b"POST /v1/score HTTP/1.1\r\nContent-Length: 50\r\n\r\n" + rng.bytes(50) for _ in range(5)]
    for data in GARBAGE + fuzz:
        reply = _raw(front.http_port, data)
        assert not reply or reply.startswith(b"HTTP/1.") and b"Traceback" not in reply
    assert b"501" in _raw(front.http_port, GARBAGE[7]).split(b"\r\n")[0]
    assert b"404" in _raw(front.http_port, GARBAGE[8]).split(b"\r\n")[0]
    assert score(front.http_port, {"ids": ["a"]})[0] == 200


def test_keep_alive_connection_serves_many_requests(front):
    conn = http.client.HTTPConnection("127.0.0.1", front.http_port, timeout=5)
    for i in range(3):
        conn.request("POST", "/v1/score", body=json.dumps({"ids": [f"id{i}"]}))
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["scores"] == [0.0]
    conn.close()


def test_request_log_has_no_values(front, scorer, caplog):
    with caplog.at_level(logging.DEBUG, logger="secureflhv.serve"):
        score(front.http_port, {"ids": ["person-42"], "features": [[SECRET, 1, 2]], "request_id": "r-1"},
              {"X-Caller": "loan-app"})
    lines = [r.getMessage() for r in caplog.records]
    line = next(x for x in lines if x.startswith("request r-1"))
    assert "caller=loan-app ids=1 status=ok" in line and "model=fp-1" in line
    text = "\n".join(lines)
    assert str(SECRET) not in text and str(SECRET + 3) not in text and "person-42" not in text


# ------------------------------------------------------------------------------------------ gRPC
@pytest.fixture
def stub(front):
    channel = grpc.insecure_channel(f"127.0.0.1:{front.grpc_port}")
    yield pb_grpc.ServingStub(channel)
    channel.close()


def _grpc_error(stub, request, **kw):
    with pytest.raises(grpc.RpcError) as info:
        stub.Score(request, timeout=5, **kw)
    return info.value.code(), dict(info.value.trailing_metadata() or ()), info.value.details()


def test_grpc_score_and_ready(front, scorer, stub):
    reply = stub.Score(pb.ScoreRequest(ids=["a", "new-b"], features=[1, 2, 3, 4, 5, 6], feature_rows=2), timeout=5)
    assert list(reply.scores) == [6, 15] and reply.classes == 0 and reply.model == "fp-1"
    assert [(m.id, list(m.parties)) for m in reply.missing] == [("new-b", ["host-1"])] and reply.request_id
    scorer.classes = 2
    reply = stub.Score(pb.ScoreRequest(ids=["a"], features=[3, 1, 2], feature_rows=1, request_id="g-1",
                                       feature_columns=["debt", "age", "income"]), timeout=5,
                       metadata=[("x-caller", "grpc-app")])
    assert list(reply.scores) == [6, -6] and reply.classes == 2 and reply.request_id == "g-1"
    np.testing.assert_array_equal(scorer.seen[-1].features, [[1, 2, 3]])
    assert scorer.seen[-1].caller == "grpc-app"
    assert stub.Ready(pb.ReadyRequest(), timeout=5) == pb.ReadyReply(ready=True)
    scorer.is_ready = (False, "host-1 down")
    assert stub.Ready(pb.ReadyRequest(), timeout=5) == pb.ReadyReply(ready=False, reason="host-1 down")


@pytest.mark.parametrize("request_,status", [
    (pb.ScoreRequest(), "bad_request"), (pb.ScoreRequest(ids=["a", ""]), "bad_request"),
    (pb.ScoreRequest(ids=["a"], features=[1, 2], feature_rows=1), "bad_request"),
    (pb.ScoreRequest(ids=["a"], features=[1, 2, 3], feature_rows=1, feature_columns=["age", "x", "debt"]),
     "bad_request"),
    (pb.ScoreRequest(ids=["a"], features=[1, float("nan"), 3], feature_rows=1), "bad_request"),
    (pb.ScoreRequest(ids=list("abcde")), "too_large")])
def test_grpc_bad_requests(stub, request_, status):
    code, meta, _ = _grpc_error(stub, request_)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and meta["x-serve-status"] == status and meta["x-request-id"]


@pytest.mark.parametrize("status,code", [("unavailable", grpc.StatusCode.UNAVAILABLE),
                                         ("timeout", grpc.StatusCode.DEADLINE_EXCEEDED),
                                         ("internal", grpc.StatusCode.INTERNAL)])
def test_grpc_scorer_errors(scorer, stub, status, code):
    scorer.raise_status = status
    got, meta, details = _grpc_error(stub, pb.ScoreRequest(ids=["a"]))
    assert got == code and meta["x-serve-status"] == status and "host-1 at 10.0.0.2:9000" in details


def test_grpc_timeout_and_rate_limit(scorer):
    with serve_front(scorer, http_port=None, rate=1, burst=1, timeout_s=0.2) as f, \
            grpc.insecure_channel(f"127.0.0.1:{f.grpc_port}") as channel:
        stub = pb_grpc.ServingStub(channel)
        scorer.sleep_s = 2.0
        t0 = time.monotonic()
        code, meta, _ = _grpc_error(stub, pb.ScoreRequest(ids=["a"]))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and meta["x-serve-status"] == "timeout"
        assert time.monotonic() - t0 < 0.2 + 0.6
        code, meta, _ = _grpc_error(stub, pb.ScoreRequest(ids=["a"]))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and 0 < float(meta["retry-after-s"]) <= 1.0
        assert f.http_port is None


def test_plaintext_refused_off_loopback_and_tls_served(scorer, tmp_path):
    for kw in ({"http_port": None}, {"grpc_port": None}):
        with pytest.raises(ValueError, match="not a loopback address"):
            serve_front(scorer, host="0.0.0.0", **kw)
    paths = generate_certificates(tmp_path, ["guest"])
    tls = (paths["parties"]["guest"]["cert"], paths["parties"]["guest"]["key"])
    ca = paths["ca_cert"].read_bytes()
    with serve_front(scorer, tls=tls) as f:
        ctx = ssl.create_default_context(cadata=ca.decode())
        conn = http.client.HTTPSConnection("localhost", f.http_port, context=ctx, timeout=5)
        conn.request("POST", "/v1/score", body=json.dumps({"ids": ["a"]}))
        assert conn.getresponse().status == 200
        conn.close()
        with grpc.secure_channel(f"localhost:{f.grpc_port}", grpc.ssl_channel_credentials(ca)) as channel:
            assert pb_grpc.ServingStub(channel).Ready(pb.ReadyRequest(), timeout=5).ready


# ------------------------------------------------------------------------------------------ units
def test_latency_percentiles_equal_numpy_over_the_window():
    clock = [1000.0]
    stats = LatencyStats(window=500, clock=lambda: clock[0])
    rng = np.random.default_rng(3)
    latencies = rng.lognormal(-5, 1, size=1200)
    for i, v in enumerate(latencies):
        clock[0] += 0.05
        stats.record(v, "ok" if i % 10 else "timeout", n_ids=2)
    snap = stats.snapshot()
    ok = latencies[[i for i in range(1200) if i % 10]][-500:]
    for q in (50, 95, 99):
        assert snap[f"p{q}_ms"] == pytest.approx(np.percentile(ok, q) * 1e3, rel=1e-12)
    assert snap["max_ms"] == pytest.approx(ok.max() * 1e3) and snap["latency_n"] == 500
    assert snap["by_status"] == {"ok": 1080, "timeout": 120} and snap["requests"] == 1200
    # 60 s of history at 20 requests/s (the rate window is whole seconds)
    assert snap["requests_per_s"] == pytest.approx(20, rel=0.03) and snap["ids_per_s"] == pytest.approx(40, rel=0.03)
    clock[0] += 120
    assert stats.snapshot()["requests_per_s"] == 0 and stats.snapshot()["latency_n"] == 500


def test_latency_stats_thread_safe_and_empty():
    stats = LatencyStats()
    assert stats.snapshot()["p50_ms"] is None and stats.snapshot()["requests"] == 0
    threads = [threading.Thread(target=lambda: [stats.record(0.001) for _ in range(2000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.snapshot()["by_status"] == {"ok": 8000} and stats.snapshot()["latency_n"] == 8000


def test_rate_limiter_bucket_and_bounded_memory():
    clock = [0.0]
    limiter = RateLimiter(10, 3, max_callers=50, clock=lambda: clock[0])
    assert [limiter.acquire("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.acquire("a") == pytest.approx(0.1)
    clock[0] += 0.1
    assert limiter.acquire("a") == 0.0 and limiter.acquire("a") > 0
    for i in range(200):
        limiter.acquire(f"caller-{i}")
    assert len(limiter) <= 50
    clock[0] += 1.0  # every bucket refilled: all forgotten on the next call
    limiter.acquire("b")
    assert len(limiter) == 1
    assert RateLimiter(None, 1).acquire("x") == 0.0
    with pytest.raises(ValueError):
        RateLimiter(0, 1)


def test_fake_scorer_satisfies_the_protocol_and_statuses_are_checked():
    assert isinstance(FakeScorer(), Scorer)
    with pytest.raises(ValueError, match="unknown ServeError status"):
        ServeError("nope", "x")
