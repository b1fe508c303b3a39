"""The guest's request front end: :func:`serve_front` opens the HTTP/JSON and gRPC fronts over a
:class:`Scorer`, with per-caller rate limits, a request timeout, request logs and latency statistics.

The interface the scoring service implements (:class:`Scorer`, :class:`ScoreRequest`,
:class:`ScoreResult`, :class:`ServeError`), :class:`LatencyStats` and :class:`RateLimiter` are defined in
:mod:`.gate` (the request path both fronts share) and importable from here. Endpoints and error statuses:
:mod:`.http_api` and :mod:`.grpc_api`.
"""
from __future__ import annotations

import logging

from .gate import (STATUSES, Answer, Gate, LatencyStats, RateLimiter, ScoreRequest, ScoreResult, Scorer,
                   ServeError)
from .grpc_api import GrpcFront
from .http_api import HttpFront

__all__ = ["STATUSES", "Answer", "Front", "Gate", "LatencyStats", "RateLimiter", "ScoreRequest", "ScoreResult",
           "Scorer", "ServeError", "serve_front"]

log = logging.getLogger("secureflhv.serve")


class Front:
    """The running fronts: :attr:`http_port` / :attr:`grpc_port` (None when that front is off),
    :attr:`stats` (:class:`LatencyStats`), :attr:`gate`; :meth:`close` stops both."""

    def __init__(self, gate: Gate, http: HttpFront | None, grpc: GrpcFront | None):
        self.gate, self.stats = gate, gate.stats
        self._http, self._grpc = http, grpc
        self.http_port = http.port if http else None
        self.grpc_port = grpc.port if grpc else None

    def close(self) -> None:
        """Stop listening (requests in flight get about a second) and stop the scoring workers."""
        if self._http is not None:
            self._http.close()
        if self._grpc is not None:
            self._grpc.close()
        self.gate.close()

    def __enter__(self) -> "Front":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_front(scorer: Scorer, *, http_port: int | None = 0, grpc_port: int | None = 0, host: str = "127.0.0.1",
                rate: float | None = 50.0, burst: float = 100.0, timeout_s: float = 2.0,
                max_body_bytes: int = 1 << 20, tls=None, max_in_flight: int = 32, max_callers: int = 10_000,
                stats: LatencyStats | None = None) -> Front:
    """Open the request fronts over ``scorer`` and return the running :class:`Front`.

    Args:
        http_port / grpc_port: 0 picks a free port (read it from the Front); None leaves that front off.
        host: the address both bind; plaintext only on loopback (ValueError otherwise, unless ``tls``).
        rate / burst: each caller's token bucket (requests per second, most at once); rate None: no limit.
        timeout_s: each request's bound from admission to answer (504 / DEADLINE_EXCEEDED past it).
        max_body_bytes: the largest HTTP body (413 beyond).
        tls: (certificate path, key path): both fronts serve TLS (needed off loopback).
        max_in_flight: scorer calls at once, late ones included (503 / UNAVAILABLE beyond).
        max_callers: callers the rate limiter remembers.
        stats: share a :class:`LatencyStats` (e.g. across a restart); default a new one.
    """
    limiter = RateLimiter(rate, burst, max_callers=max_callers)
    gate = Gate(scorer, limiter=limiter, stats=stats or LatencyStats(), timeout_s=timeout_s,
                max_in_flight=max_in_flight)
    http = grpc = None
    try:
        if http_port is not None:
            http = HttpFront(gate, host=host, port=http_port, max_body_bytes=max_body_bytes, tls=tls)
        if grpc_port is not None:
            grpc = GrpcFront(gate, host=host, port=grpc_port, tls=tls)
    except BaseException:
        if http is not None:
            http.close()
        gate.close()
        raise
    return Front(gate, http, grpc)
