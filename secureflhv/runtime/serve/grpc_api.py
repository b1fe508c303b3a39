"""The gRPC front of the guest's scoring API: service ``secureflhv.serving.v1.Serving``.

``Score(ScoreRequest) -> ScoreReply``: ids (repeated string), the guest's features as a row-major repeated
double with ``feature_rows`` (and optionally ``feature_columns`` naming their order), an optional request
id. Same checks, limits and timeout as the HTTP front (:class:`~secureflhv.runtime.serve.gate.Gate`);
errors are gRPC statuses (bad_request / too_large -> INVALID_ARGUMENT, rate_limited ->
RESOURCE_EXHAUSTED with trailing ``retry-after-s``, unavailable -> UNAVAILABLE, timeout ->
DEADLINE_EXCEEDED, internal -> INTERNAL), each with trailing metadata ``x-serve-status`` and
``x-request-id``. The call's own deadline, when shorter, shortens the request timeout.

``Ready(ReadyRequest) -> ReadyReply``: ``ready`` and, when not, ``reason``.

The server (grpc itself) is ``secureflhv.transport.serving_rpc``: loopback plaintext by default, TLS
required for any other address.
"""
from __future__ import annotations

import logging

import numpy as np

from ...proto import serving_pb2 as pb
from ...transport.serving_rpc import RpcRefusal, start_serving_rpc
from .gate import Gate, ServeError, order_columns

log = logging.getLogger("secureflhv.serve")


def _features_of(request: pb.ScoreRequest, columns: list[str]):
    """The request's features as an (rows, d) array in model column order, or None when none were sent."""
    if not request.features and not request.feature_rows:
        if request.feature_columns:
            raise ServeError("bad_request", "feature_columns given without features")
        return None
    sent = list(request.feature_columns) or columns
    rows, flat = int(request.feature_rows), np.asarray(request.features, dtype=np.float64)
    if rows < 1 or flat.size != rows * len(sent):
        raise ServeError("bad_request", f"features: {flat.size} values for feature_rows={rows} x "
                                        f"{len(sent)} columns")
    values = flat.reshape(rows, len(sent))
    return values if sent is columns else order_columns(values, sent, columns)


def reply_of(answer) -> pb.ScoreReply:
    """The ``ScoreReply`` of a :class:`~secureflhv.runtime.serve.gate.Answer`."""
    scores = np.asarray(answer.result.scores, dtype=np.float64)
    return pb.ScoreReply(
        request_id=answer.request_id, scores=scores.ravel().tolist(),
        classes=scores.shape[1] if scores.ndim == 2 else 0,
        missing=[pb.MissingParties(id=i, parties=list(p)) for i, p in answer.result.missing.items()],
        model=answer.result.model, latency_ms=answer.latency_ms)


class GrpcFront:
    """The gRPC scoring front on ``host:port`` (port 0: a free one, then :attr:`port`).

    ``tls``: (certificate path, key path) to serve TLS; without it only a loopback host is accepted
    (ValueError otherwise).
    """

    def __init__(self, gate: Gate, *, host: str = "127.0.0.1", port: int = 0, tls=None, workers: int = 16):
        self.gate = gate
        self._server, self.port = start_serving_rpc(self, host=host, port=port, tls=tls, workers=workers)

    def score(self, request: pb.ScoreRequest, caller: str, time_remaining: float | None) -> pb.ScoreReply:
        """Serve one ``Score`` call (the transport's handler); raises RpcRefusal for an error status."""
        def parse():
            columns = list(self.gate.scorer.feature_columns)
            return list(request.ids), _features_of(request, columns), request.request_id or None
        try:
            return reply_of(self.gate.handle(caller, parse, timeout_s=time_remaining))
        except ServeError as exc:
            raise RpcRefusal(exc.status, exc.message, request_id=exc.request_id,
                             retry_after_s=exc.retry_after_s) from None

    def ready(self) -> pb.ReadyReply:
        """Serve one ``Ready`` call: the scorer's ``ready()``; a failing check reads as not ready."""
        try:
            ok, why = self.gate.scorer.ready()
        except Exception:
            log.exception("the scorer's readiness check failed")
            ok, why = False, "the readiness check failed (see the server log)"
        return pb.ReadyReply(ready=bool(ok), reason="" if ok else str(why))

    def close(self, grace: float | None = 1.0) -> None:
        """Stop the server: calls in flight get ``grace`` seconds."""
        self._server.stop(grace).wait()
