"""The HTTP/JSON front of the guest's scoring API (stdlib ``ThreadingHTTPServer``, HTTP/1.1 keep-alive).

Endpoints (every answer is JSON; an error is ``{"error": status, "message": ..., "request_id": ...}``):

* ``POST /v1/score`` ``{"ids": [str, ...], "features": [[num, ...], ...] | [{column: num}, ...] (optional),
  "request_id": str (optional; also the ``X-Request-Id`` header)}`` ->
  200 ``{"request_id", "scores", "missing", "model", "latency_ms"}``; ``scores`` is a list (one per id) or a
  list of lists (K per id); ``missing`` maps an id to the parties that did not know it.
  Errors: 400 bad_request (malformed JSON, wrong types, wrong feature count, no ids, a non-string id, a
  non-finite feature), 413 too_large (more than the model's max batch ids, or a body over
  ``max_body_bytes``), 429 rate_limited (with ``Retry-After``), 503 unavailable (not ready, a host down,
  overloaded), 504 timeout, 500 internal (traceback in the server log under the request id).
  The caller is the ``X-Caller`` header, else the peer address (rate limits are per caller; the header is
  trusted as sent, so a client that renames itself gets a fresh bucket: the front serves the bank's own
  applications, on loopback by default).
* ``GET /healthz`` -> 200 ``{"alive": true, ...scorer.health()}`` while the process runs.
* ``GET /readyz`` -> 200 ``{"ready": true}`` or 503 ``{"ready": false, "reason": ...}``.
* ``GET /v1/stats`` -> 200 :meth:`LatencyStats.snapshot`.
* ``POST /v1/swap`` ``{"model_dir": str}`` -> 200 ``{"model": fingerprint}``; only from a loopback
  address (403 otherwise); errors as for scoring.

Unknown paths: 404; other methods: 501. The server answers garbage with 400 and keeps serving. Plaintext
only on loopback; another address needs ``tls=(certificate path, key path)``.
"""
from __future__ import annotations

import json
import logging
import math
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from ...transport.serving_rpc import check_bind, is_loopback
from .gate import Gate, ServeError, new_request_id

log = logging.getLogger("secureflhv.serve")

HTTP_STATUS = {"bad_request": 400, "too_large": 413, "rate_limited": 429, "unavailable": 503,
               "timeout": 504, "internal": 500}
SCORE_FIELDS = {"ids", "features", "request_id"}


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def decode_json(body: bytes) -> dict:
    """The JSON object in ``body``; ServeError bad_request for anything else (NaN / Infinity included)."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise ServeError("bad_request", "the body is not valid UTF-8 JSON") from None
    if not isinstance(value, dict):
        raise ServeError("bad_request", "the body must be a JSON object")
    return value


def json_scores(scores) -> list:
    """Scores as JSON-able lists (a non-finite score, which JSON cannot carry, becomes null)."""
    arr = np.asarray(scores, dtype=np.float64)
    if np.isfinite(arr).all():
        return arr.tolist()
    out = arr.astype(object)
    out[~np.isfinite(arr)] = None
    return out.tolist()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "secureflhv-serve"
    sys_version = ""
    default_request_version = "HTTP/1.1"  # a broken request line still gets a status line and headers
    timeout = 10.0  # seconds a connection may sit idle or trickle its request

    def setup(self):
        """TCP_NODELAY, then the connection's TLS handshake (when serving TLS), under the connection timeout.

        Without TCP_NODELAY a kept-alive connection waits ~40 ms per answer: the status line and headers go
        out in one write, the body in a second, small one, which Nagle's algorithm holds back until the
        client acknowledges the first, and the client delays that acknowledgement (delayed ACK)."""
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # not a TCP socket
            pass
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # here, in the connection's thread, not in the accept loop

    # --------------------------------------------------------------------------- plumbing
    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        """The stdlib's access / error lines, at DEBUG (the request log line is the gate's)."""
        log.debug("http %s: " + format, self.client_address[0], *args)

    def send_error(self, code, message=None, explain=None):
        """Errors of the stdlib parser (bad request line, unsupported method) as JSON too."""
        self.close_connection = True
        status = {404: "not_found", 501: "not_implemented"}.get(code, "bad_request")
        self._send(code, {"error": status, "message": message or "malformed HTTP request"})

    def _send(self, code: int, obj: dict, headers: dict | None = None) -> None:
        body = json.dumps(obj, allow_nan=False).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_serve_error(self, exc: ServeError) -> None:
        headers = {"X-Request-Id": exc.request_id} if exc.request_id else {}
        if exc.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
        body = {"error": exc.status, "message": exc.message, "request_id": exc.request_id}
        if exc.retry_after_s is not None:
            body["retry_after_s"] = round(exc.retry_after_s, 3)
        self._send(HTTP_STATUS[exc.status], body, headers)

    def _read_body(self) -> bytes:
        """The request body, at most the server's max_body_bytes (ServeError otherwise)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True
            raise ServeError("bad_request", "chunked bodies are not accepted: send Content-Length")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            raise ServeError("bad_request", "Content-Length is missing or not a number") from None
        limit = self.server.max_body_bytes
        if length < 0 or length > limit:
            self.close_connection = True  # the body is never read: the connection cannot be reused
            raise ServeError("too_large" if length > limit else "bad_request",
                             f"body of {length} bytes; at most {limit}")
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            raise ServeError("bad_request", "the body ended before Content-Length bytes")
        return body

    def _guard(self, route) -> None:
        try:
            route()
        except ServeError as exc:
            self._send_serve_error(exc)
        except (ConnectionError, TimeoutError, ssl.SSLError):
            self.close_connection = True
        except Exception:
            log.exception("http %s %s failed", self.command, self.path)
            self.close_connection = True
            self._send(500, {"error": "internal", "message": "internal error; see the server log"})

    # --------------------------------------------------------------------------- routes
    def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler's naming
        """/healthz, /readyz, /v1/stats."""
        routes = {"/healthz": self._healthz, "/readyz": self._readyz, "/v1/stats": self._stats}
        self._guard(routes.get(self.path.split("?", 1)[0], self._not_found))

    def do_POST(self):  # noqa: N802 - BaseHTTPRequestHandler's naming
        """/v1/score, /v1/swap."""
        routes = {"/v1/score": self._score, "/v1/swap": self._swap}
        self._guard(routes.get(self.path.split("?", 1)[0], self._not_found))

    def _not_found(self):
        if self.command == "POST":
            self.close_connection = True  # its body is not read
        self._send(404, {"error": "not_found", "message": f"no endpoint {self.command} {self.path[:100]}"})

    def _healthz(self):
        try:
            details = dict(self.server.gate.scorer.health())
        except Exception:
            log.exception("the scorer's health check failed")
            details = {"health_error": "the scorer's health check failed (see the server log)"}
        self._send(200, {**details, "alive": True})

    def _readyz(self):
        try:
            ok, why = self.server.gate.scorer.ready()
        except Exception:
            log.exception("the scorer's readiness check failed")
            ok, why = False, "the readiness check failed (see the server log)"
        self._send(200 if ok else 503, {"ready": True} if ok else {"ready": False, "reason": str(why)})

    def _stats(self):
        self._send(200, self.server.gate.stats.snapshot())

    def _score(self):
        caller = self.headers.get("X-Caller") or self.client_address[0]
        header_id = self.headers.get("X-Request-Id")
        read = []

        def parse():
            body = self._read_body()
            read.append(True)
            req = decode_json(body)
            unknown = set(req) - SCORE_FIELDS
            if unknown:
                raise ServeError("bad_request", f"unknown field(s) {sorted(unknown)[:5]}; the fields are "
                                                f"{sorted(SCORE_FIELDS)}")
            return req.get("ids"), req.get("features"), req.get("request_id", header_id)
        try:
            answer = self.server.gate.handle(caller, parse)
        except ServeError:
            if not read:  # refused before the body was read: the connection cannot be reused
                self.close_connection = True
            raise
        result = answer.result
        self._send(200, {"request_id": answer.request_id, "scores": json_scores(result.scores),
                         "missing": {k: list(v) for k, v in result.missing.items()}, "model": result.model,
                         "latency_ms": answer.latency_ms}, {"X-Request-Id": answer.request_id})

    def _swap(self):
        caller = self.client_address[0]
        if not is_loopback(caller):
            self.close_connection = True
            self._send(403, {"error": "forbidden", "message": "model swaps are accepted from loopback only"})
            return
        try:
            req = decode_json(self._read_body())
            if set(req) != {"model_dir"} or not isinstance(req["model_dir"], str) or not req["model_dir"]:
                raise ServeError("bad_request", 'the body must be {"model_dir": "<bundle folder>"}')
            fingerprint = self.server.gate.swap(req["model_dir"], caller)
        except ServeError as exc:
            exc.request_id = exc.request_id or new_request_id()
            raise
        self._send(200, {"model": fingerprint})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # the listen backlog: socketserver's default of 5 overflowed when a few callers connected at once while the
    # process was busy scoring, and each connection over it waited for the client's SYN retransmission (1 s)
    request_queue_size = socket.SOMAXCONN

    def handle_error(self, request, client_address):
        """A connection that broke (reset, TLS failure) is logged at DEBUG, not printed."""
        log.debug("http connection from %s dropped", client_address[0], exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class HttpFront:
    """The HTTP/JSON scoring front on ``host:port`` (port 0: a free one, then :attr:`port`), serving in a
    background thread until :meth:`close`.

    ``max_body_bytes`` caps a request body (413 beyond). ``tls``: (certificate path, key path) to serve
    HTTPS; without it only a loopback host is accepted (ValueError otherwise).
    """

    def __init__(self, gate: Gate, *, host: str = "127.0.0.1", port: int = 0, max_body_bytes: int = 1 << 20,
                 tls=None):
        check_bind(host, tls, "HTTP serving")
        self._httpd = (_Server6 if ":" in host else _Server)((host.strip("[]"), port), _Handler)
        self._httpd.gate, self._httpd.max_body_bytes = gate, int(max_body_bytes)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(certfile=str(tls[0]), keyfile=str(tls[1]))
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True,
                                                     do_handshake_on_connect=False)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="secureflhv-serve-http", daemon=True)
        self._thread.start()
        log.info("HTTP scoring API on %s:%d (%s)", host, self.port, "TLS" if tls else "plaintext, loopback only")

    def close(self) -> None:
        """Stop serving and close the listening socket (connections in flight finish in their threads)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
