"""gRPC plumbing of the guest's online scoring API (``protos/secureflhv/proto/serving.proto``).

Only the transport layer imports ``grpc`` (docs/architecture.md), so the server itself lives here: it
binds, reads the caller from the call, and turns a :class:`RpcRefusal` into a gRPC status. What a request
must satisfy and how it is scored is the runtime's (``secureflhv.runtime.serve.grpc_api``), which hands
this module a handler with ``score(request, caller, timeout_s) -> ScoreReply`` and ``ready() -> ReadyReply``.

Security: plaintext only on a loopback address; any other bind needs a (certificate, key) pair of PEM
files and serves TLS (server authentication; callers are the bank's own applications, not parties).
"""
from __future__ import annotations

import ipaddress
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from ..proto import serving_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

#: a front status -> the gRPC code it is answered with (the exact status also travels as trailing
#: metadata "x-serve-status")
STATUS_CODES = {
    "bad_request": grpc.StatusCode.INVALID_ARGUMENT,
    "too_large": grpc.StatusCode.INVALID_ARGUMENT,
    "rate_limited": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "internal": grpc.StatusCode.INTERNAL,
}
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class RpcRefusal(Exception):
    """Raised by a handler: answer the call with ``status`` (a :data:`STATUS_CODES` key) and ``message``."""

    def __init__(self, status: str, message: str, *, request_id: str = "", retry_after_s: float | None = None):
        super().__init__(message)
        self.status, self.message = status, message
        self.request_id, self.retry_after_s = request_id, retry_after_s


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1); any other name is not."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_tls_pair(tls) -> tuple[bytes, bytes] | None:
    """``(certificate PEM, key PEM)`` bytes from a (cert path, key path) pair, or None for None."""
    if tls is None:
        return None
    cert, key = tls
    return Path(cert).read_bytes(), Path(key).read_bytes()


def check_bind(host: str, tls, what: str) -> None:
    """Refuse (ValueError) a plaintext bind on anything but loopback."""
    if tls is None and not is_loopback(host):
        raise ValueError(f"{what}: refusing to serve plaintext on {host!r}, which is not a loopback address; "
                         "give a TLS (certificate, key) pair or bind 127.0.0.1")


def caller_of(context: grpc.ServicerContext) -> str:
    """The ``x-caller`` metadata value, else the peer's IP address (without the port)."""
    for key, value in context.invocation_metadata() or ():
        if key == "x-caller":
            return value
    peer = context.peer() or "unknown"
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer.replace("%", "")


class _Servicer(pb_grpc.ServingServicer):
    def __init__(self, handler):
        self._handler = handler

    def Score(self, request, context):  # noqa: N802 - gRPC method name
        """The handler's reply, or its RpcRefusal as a status with trailing metadata."""
        remaining = context.time_remaining()
        try:
            return self._handler.score(request, caller_of(context), remaining)
        except RpcRefusal as refusal:
            meta = [("x-serve-status", refusal.status), ("x-request-id", refusal.request_id)]
            if refusal.retry_after_s is not None:
                meta.append(("retry-after-s", f"{refusal.retry_after_s:.3f}"))
            context.set_trailing_metadata(tuple(meta))
            context.abort(STATUS_CODES.get(refusal.status, grpc.StatusCode.INTERNAL), refusal.message)

    def Ready(self, request, context):  # noqa: N802 - gRPC method name
        """The handler's readiness."""
        return self._handler.ready()


def start_serving_rpc(handler, *, host: str, port: int, tls=None, workers: int = 16) -> tuple[grpc.Server, int]:
    """Start the ``Serving`` gRPC service for ``handler`` on ``host:port`` (port 0: a free one).

    Args:
        handler: ``score(ScoreRequest, caller, time_remaining) -> ScoreReply`` (raises :class:`RpcRefusal`)
            and ``ready() -> ReadyReply``.
        tls: ``(certificate path, key path)`` to serve TLS; required unless ``host`` is loopback.
        workers: threads answering calls; beyond 4x that many calls in flight gRPC itself answers
            RESOURCE_EXHAUSTED.

    Returns:
        (the started server, the bound port). Raises ValueError for a refused bind or a port in use.
    """
    check_bind(host, tls, "gRPC serving")
    pair = read_tls_pair(tls)
    server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="secureflhv-serve-rpc"),
                         maximum_concurrent_rpcs=4 * workers,
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.so_reuseport", 0)])
    pb_grpc.add_ServingServicer_to_server(_Servicer(handler), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = (server.add_secure_port(address, grpc.ssl_server_credentials([(pair[1], pair[0])]))
                 if pair else server.add_insecure_port(address))
    except RuntimeError as exc:
        bound, why = 0, str(exc)
    else:
        why = "address in use or not local"
    if not bound:
        server.stop(None)
        raise ValueError(f"gRPC serving: cannot listen on {address}: {why}")
    server.start()
    log.info("gRPC scoring API on %s:%d (%s)", host, bound, "TLS" if pair else "plaintext, loopback only")
    return server, bound

