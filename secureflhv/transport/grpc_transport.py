"""Party-to-party transport over gRPC with mutual TLS (``PartyService.Deliver``, transport.proto).

Each party runs one gRPC server (its mailbox) and one lazily opened channel per peer. A message
travels as a client stream of :class:`Chunk` s: the first chunk carries the :class:`Envelope`
header (job, round, sender, receiver, tag, payload size, payload SHA-256) and every chunk carries
at most ``chunk_size`` payload bytes, so payloads of hundreds of MB stream through while every gRPC
message stays around 1 MiB (gRPC's per-message limits are set to the chunk size plus slack).

Receiving side, in order (a failure answers ``Ack(accepted=False, error=...)``, is logged and
recorded in :attr:`Transport.rejected`, and never crashes the party):

0. at most ``max_streams_per_sender`` streams of one sender are in flight here at once:
   with TLS the sender is the certificate's CN, known when the call opens, so an excess stream is
   refused before any chunk is read (plaintext: at the header); it ends with ``RESOURCE_EXHAUSTED``
   naming the sender, is logged naming the sender, and costs no buffering;
1. the first chunk must carry a header; later chunks must not;
2. the header's ``sender`` must equal the CN of the client's TLS certificate (mutual TLS proves the
   certificate; this binds the claimed sender to it);
3. the wire rules of :class:`~secureflhv.transport.base.Mailbox` (job, receiver, known sender,
   stale/replayed round, declared payload size <= ``max_payload_bytes``, the sender's queued bytes
   *plus the declared sizes of its other streams in flight* under ``2 * max_payload_bytes``, at most
   ``max_pending`` messages queued) are checked on the header, before the payload is read, so a
   refused message costs one chunk; the declared size is then reserved against the sender's byte cap
   (:meth:`Mailbox.reserve`) until the message is queued or the stream fails;
4. the reassembled payload must have exactly the declared size and SHA-256;
5. :meth:`Mailbox.deliver` releases the reservation, checks the wire rules again atomically and
   queues the message.

Every incoming stream runs under a server-side deadline, whatever deadline the client set (or did
not set): ``first_chunk_timeout`` seconds for the first chunk (the header), extended
once the header is read to ``stream_timeout + payload_size / MIN_STREAM_RATE``
from the stream's start. A stream that is not complete by then (a client that opens a stream and
sends nothing, or stalls mid-payload) is cancelled by a timer (a stalled request iterator never
returns, so checking the clock between chunks would not do): the receiver logs and records who
stalled (:attr:`Transport.rejected`), frees the server thread, the buffered chunks and the
reservations, and the sender's call fails with ``CANCELLED`` (a :class:`TransportError` naming the
receiver).

Threads: the server has ``workers = peers * max_streams_per_sender + 2`` threads, so the streams the
peers are allowed hold at most all but two of them: a peer holding all its allowed streams cannot
take the threads the other peers' streams need, and its excess calls get a thread only to be
refused at once. gRPC admits ``2 * workers`` calls at a time (``maximum_concurrent_rpcs``); a call
beyond that is refused by gRPC with ``RESOURCE_EXHAUSTED`` before it takes a thread, and its sender
retries it. The whole bound, per peer: ``max_streams_per_sender`` threads and ``2 * max_payload_bytes``
bytes, queued and in flight.

Sending side: stream the chunks with a per-call deadline; while the peer is unreachable
(``UNAVAILABLE``: not started yet, restarting) or busy (``RESOURCE_EXHAUSTED``: this party already
has its allowed streams in flight there, or the receiver is at its call limit) retry with
exponential backoff and jitter until ``retry_window`` (or the call's deadline) runs out, then raise
:class:`PeerUnavailable` naming the peer and its address. A TLS handshake failure (certificate from
another CA, or a server certificate that is not the receiver's) does not heal by waiting and raises
:class:`PeerUnavailable` at once with gRPC's reason. A refusal Ack raises
:class:`MessageRejected` carrying the receiver's reason.

Over a WAN (docs/wan.md), HTTP/2 keep-alive pings on both ends (idle connections included;
``KEEPALIVE_*`` below) turn a link that went dead under an open stream into ``UNAVAILABLE`` within
~10 s, so the message is sent again on a new connection once the link is back (a 20 s outage costs
the step about the outage, not the deadline); a link down for longer than the deadline ends in
:class:`PeerUnavailable` / :class:`PeerTimeout` naming the peer.

Security: mutual TLS by default (see :mod:`secureflhv.transport.certs`). The client verifies that
the server's certificate is the *receiver's* (``ssl_target_name_override`` = receiver id; each
certificate has SAN ``DNS:<party id>``), so addresses may be IPs. Plaintext needs
``insecure=True`` and logs a warning: traffic is then readable and sender ids are unverified.
With TLS, a network observer learns only message sizes and timing; the receiver learns the
envelope (job, round, sender, tag) and the payload, nothing else about the sender.

Processes: create the transport inside the party process (gRPC does not survive ``fork``).
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

import grpc

from ..proto import transport_pb2 as pb
from ..proto import transport_pb2_grpc as pb_grpc
from .base import (DEFAULT_DEADLINE_S, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_PENDING, MiB, Mailbox, Message,
                   MessageRejected, PeerUnavailable, Transport, TransportError, _as_bytes)
from .certs import TlsConfig
from .identity import PartyIdentity
from .tls import channel_credentials, peer_identity, server_credentials, target_name_options
from .wire import WireCounter, WireTrace, split_lengths

log = logging.getLogger("secureflhv.transport.grpc")

DEFAULT_CHUNK_SIZE = 1 * MiB
MIN_CHUNK_SIZE = 1024
MAX_CHUNK_SIZE = 4 * MiB  # receivers accept chunks up to this, whatever their own chunk_size
_SLACK = 64 * 1024  # room for the Envelope header and protobuf framing on top of a chunk
DEFAULT_STREAM_TIMEOUT_S = 60.0  # server side: seconds an incoming stream may take, plus size / MIN_STREAM_RATE
# server side: seconds until a stream's first chunk (header + up to 4 MiB) must have arrived: cuts a stalled
# opener long before stream_timeout (a 4 MiB chunk at MIN_STREAM_RATE takes 4 s, plus a few round trips)
DEFAULT_FIRST_CHUNK_TIMEOUT_S = 10.0
DEFAULT_MAX_STREAMS_PER_SENDER = 4  # incoming streams one sender may have in flight at once
_SPARE_WORKERS = 2  # server threads beyond peers * max_streams_per_sender: refusals never wait for a thread
MIN_STREAM_RATE = 1 * MiB  # bytes per second an incoming stream must at least average
_BACKOFF_BASE_S = 0.05
_BACKOFF_CAP_S = 1.0
# WAN (docs/wan.md): HTTP/2 keep-alive pings on both ends turn a dead link (cable cut, NAT or firewall
# dropping the flow) into UNAVAILABLE within KEEPALIVE_TIME_S + KEEPALIVE_TIMEOUT_S, which send()
# retries on a new connection, instead of a stream hanging on TCP retransmissions until the deadline.
KEEPALIVE_TIME_S = 5.0  # ping after this long without reads (also on idle connections)
KEEPALIVE_TIMEOUT_S = 5.0  # no ping ack within this: the connection is dead (raise it on links < ~10 Mbit/s)
CONNECT_TIMEOUT_S = 3.0  # one connection attempt: TCP + TLS + HTTP/2 handshakes, ~3 round trips (also: how
# long an attempt whose SYN was lost while a link was down holds a send back after the link is up)
_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", int(KEEPALIVE_TIME_S * 1000)),
    ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
    ("grpc.keepalive_permit_without_calls", 1),  # probe idle connections too: a dead peer is seen before the next send
    ("grpc.http2.max_pings_without_data", 0),  # no cap on pings while no data flows
    # the timeout that actually closes the connection in grpcio 1.85 (default 60 s): with keepalive_timeout
    # alone, a link down for 20 s was not noticed at all (measured on the WAN bed, tests/wan)
    ("grpc.http2.ping_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
]


def _parse_address(address: str, what: str) -> tuple[str, int]:
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} {address!r} is not 'host:port' (e.g. '127.0.0.1:50051', '[::]:50051')")
    return host, int(port)


_TLS_FAILURES = ("handshake failed", "verification check failed", "certificate_verify_failed")


def _tls_refused(details: str | None) -> bool:
    """Whether an UNAVAILABLE status is a TLS authentication failure (not a peer still starting)."""
    text = (details or "").lower()
    return any(marker in text for marker in _TLS_FAILURES)


def _check_security(party_id: str, tls: TlsConfig | None, insecure: bool) -> None:
    """Exactly one of ``tls`` (for ``party_id``) and ``insecure`` (see :class:`GrpcTransport`)."""
    if tls is None and not insecure:
        raise ValueError(f"{party_id}: no TLS credentials; pass tls=load_party_credentials(...) or, for "
                         f"local experiments only, insecure=True (plaintext, unauthenticated)")
    if tls is not None and insecure:
        raise ValueError(f"{party_id}: both tls and insecure=True given; choose one")
    if tls is not None:
        if not isinstance(tls, TlsConfig):
            raise TypeError(f"tls must be a TlsConfig (see load_party_credentials), not {type(tls).__name__}")
        if tls.identity != party_id:
            raise ValueError(f"TLS certificate is for party {tls.identity!r} (CN) but this party is "
                             f"{party_id!r}: give this party its own certificate")


class _Progress:
    """Whether the chunk generator handed gRPC the whole message (then a failure is ambiguous)."""

    __slots__ = ("all_pulled",)

    def __init__(self):
        self.all_pulled = False


class _Refused(Exception):
    """Internal: the incoming stream breaks a rule; carries its Envelope header if one was read."""

    def __init__(self, reason: str, header: pb.Envelope | None = None):
        super().__init__(reason)
        self.reason, self.header = reason, header


class _Busy(Exception):
    """Internal: the sender already has ``max_streams_per_sender`` streams in flight (plaintext: seen at the header)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _Stream:
    """One incoming stream's claims: the sender whose stream slot it holds, and the bytes it reserved."""

    __slots__ = ("sender", "reserved")

    def __init__(self):
        self.sender: str | None = None
        self.reserved = 0


def _head(h: pb.Envelope) -> Message:
    """The message an Envelope announces, without its payload."""
    return Message(h.job_id, int(h.round), h.sender, h.receiver, h.tag, b"")


class _StreamWatch:
    """Server-side deadline of one incoming stream: a timer that cancels the RPC when it fires.

    ``extend(seconds)`` moves the deadline to ``seconds`` after the stream started (once the header
    tells the payload size). ``header`` is the stream's Envelope once read (for the log).
    """

    def __init__(self, context, seconds: float):
        self._context = context
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.expired = False
        self.seconds = 0.0
        self.header: pb.Envelope | None = None
        self.extend(seconds)

    def extend(self, seconds: float) -> None:
        with self._lock:
            if self.expired:
                return
            if self._timer is not None:
                self._timer.cancel()
            self.seconds = float(seconds)
            self._timer = threading.Timer(max(self._start + self.seconds - time.monotonic(), 0.0), self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
        self._context.cancel()  # the blocked request iterator raises grpc.RpcError

    def stop(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()


class _Servicer(pb_grpc.PartyServiceServicer):
    def __init__(self, transport: "GrpcTransport"):
        self._t = transport

    def Deliver(self, request_iterator, context):  # noqa: N802 - gRPC method name
        return self._t._handle_deliver(request_iterator, context)


class GrpcTransport(Transport):
    """One party's endpoint: a gRPC server for its mailbox plus client channels to its peers.

    Args:
        party_id: this party's id; with TLS it must equal the CN of ``tls.cert``.
        job_id: stamped on every message sent; messages of other jobs are refused.
        listen: address to serve on, ``"host:port"`` (``"0.0.0.0:50051"``, ``"127.0.0.1:0"`` for
            a free port, then read :attr:`bound_port`).
        peers: party id -> ``"host:port"`` of every other party of the job (this party's own entry,
            if present, is ignored: sends to oneself are delivered locally). Only these parties may
            send to this one.
        tls: this party's credentials (:func:`~secureflhv.transport.certs.load_party_credentials`).
        insecure: must be True to run without ``tls`` (plaintext, unauthenticated; logs a warning).
        deadline: default seconds for :meth:`recv` to wait and for :meth:`send` to deliver
            (connection retries and streaming included).
        chunk_size: payload bytes per gRPC message, in [1 KiB, 4 MiB] (default 1 MiB).
        retry_window: seconds :meth:`send` keeps retrying an unreachable peer (default: the
            send's whole deadline).
        max_payload_bytes: largest payload this party accepts (default 256 MiB; the runtime sets it
            from the job file's ``job.max_message_mb``); bigger is refused from the header, before
            any payload byte is buffered.
        max_pending: messages one peer may have queued here, not yet consumed (default 64); a peer
            may also queue at most ``2 * max_payload_bytes`` payload bytes. More is refused (flood).
        stream_timeout: seconds an incoming stream may take beyond ``payload_size / MIN_STREAM_RATE``
            (default 60); a stream still incomplete then (a stalled sender) is cancelled and logged.
        first_chunk_timeout: seconds an incoming stream may take to deliver its first chunk (the
            header; default 10); a stream still without one then (a stalled opener) is cancelled and logged.
        max_streams_per_sender: incoming streams one peer may have in flight at once (default 4);
            more are refused (``RESOURCE_EXHAUSTED``, naming the peer) before any chunk is read.
        max_workers: server threads, i.e. messages received concurrently (default
            ``peers * max_streams_per_sender + 2``, so one peer cannot take the others' threads); gRPC
            admits twice as many calls (the rest wait for a thread), more are refused (``RESOURCE_EXHAUSTED``).
        close_grace: seconds :meth:`close` lets in-flight deliveries finish.

    Raises:
        ValueError: bad address, ``tls`` identity != ``party_id``, neither ``tls`` nor ``insecure``,
            chunk size out of range.
        TransportError: the listen address cannot be bound (names it).
    """

    def __init__(self, party_id: str, job_id: str, listen: str, peers: Mapping[str, str], *,
                 tls: TlsConfig | None = None, insecure: bool = False,
                 deadline: float = DEFAULT_DEADLINE_S, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 retry_window: float | None = None, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 max_pending: int = DEFAULT_MAX_PENDING, stream_timeout: float = DEFAULT_STREAM_TIMEOUT_S,
                 first_chunk_timeout: float = DEFAULT_FIRST_CHUNK_TIMEOUT_S,
                 max_streams_per_sender: int = DEFAULT_MAX_STREAMS_PER_SENDER,
                 max_workers: int | None = None, close_grace: float = 2.0,
                 trace: WireTrace | None = None):
        _check_security(party_id, tls, insecure)
        if not MIN_CHUNK_SIZE <= int(chunk_size) <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk_size must be in [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}] bytes, got {chunk_size}")
        if deadline <= 0:
            raise ValueError(f"deadline must be > 0 seconds, got {deadline}")
        if stream_timeout <= 0:
            raise ValueError(f"stream_timeout must be > 0 seconds, got {stream_timeout}")
        if first_chunk_timeout <= 0:
            raise ValueError(f"first_chunk_timeout must be > 0 seconds, got {first_chunk_timeout}")
        if int(max_streams_per_sender) < 1:
            raise ValueError(f"max_streams_per_sender must be >= 1, got {max_streams_per_sender}")
        self._listen_host, _ = _parse_address(listen, "listen address")
        self._peers: dict[str, str] = {}
        for pid, addr in peers.items():
            if pid != party_id:
                _parse_address(addr, f"address of peer {pid!r}")
                self._peers[pid] = addr

        self.party_id = party_id
        self.job_id = job_id
        self.deadline = float(deadline)
        self.chunk_size = int(chunk_size)
        self.retry_window = None if retry_window is None else float(retry_window)
        self.max_payload_bytes = int(max_payload_bytes)
        self.stream_timeout = float(stream_timeout)
        self.first_chunk_timeout = float(first_chunk_timeout)
        self.max_streams_per_sender = int(max_streams_per_sender)
        self.close_grace = float(close_grace)
        self.sent_bytes = 0  # payload bytes accepted by receivers
        self.received_bytes = 0  # payload bytes queued in this party's mailbox
        self.wire = WireCounter(tls=tls is not None)  # per peer and tag: wire_stats() (transport/wire.py)
        self.trace = trace  # a per-message log of sent messages (transport/wire.py WireTrace), or None
        self._tls = tls
        self.identity = PartyIdentity(tls) if tls is not None else None
        self._box = Mailbox(party_id, job_id, [*self._peers, party_id], max_payload_bytes=self.max_payload_bytes,
                            max_pending=max_pending)
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, pb_grpc.PartyServiceStub]] = {}
        self._closing = threading.Event()
        self._closed = False
        self._streams: dict[str, int] = {}  # sender -> its incoming streams in flight (under self._lock)
        self._busy_refusals: dict[str, int] = {}  # sender -> streams refused for max_streams_per_sender
        self._start_server(listen, max_workers or len(self._peers) * self.max_streams_per_sender + _SPARE_WORKERS)

    def _start_server(self, listen: str, workers: int) -> None:
        """Bind ``listen`` (TLS or plaintext), start serving :meth:`_handle_deliver`, log how."""
        party_id, tls = self.party_id, self._tls
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"secureflhv-{party_id}-rx")
        # At most `workers` calls wait for a thread (a burst of excess calls, each refused in microseconds);
        # a call beyond that is refused by gRPC itself (RESOURCE_EXHAUSTED, retried by the sender) before it
        # takes a thread or memory, instead of queueing without bound behind a flood.
        self._server = grpc.server(self._executor, maximum_concurrent_rpcs=2 * workers, options=[
            ("grpc.max_receive_message_length", MAX_CHUNK_SIZE + _SLACK),
            ("grpc.max_send_message_length", 1 * MiB),
            ("grpc.so_reuseport", 0),  # two parties on one port must fail loudly, not share traffic
            *_KEEPALIVE_OPTIONS,  # the server pings too: a vanished sender's stream is freed
            # accept the peers' pings (at KEEPALIVE_TIME_S) without calling them abusive (GOAWAY too_many_pings)
            ("grpc.http2.min_recv_ping_interval_without_data_ms", int(KEEPALIVE_TIME_S * 1000) // 2),
            ("grpc.http2.max_ping_strikes", 0),
        ])
        pb_grpc.add_PartyServiceServicer_to_server(_Servicer(self), self._server)
        try:
            if tls is not None:
                port = self._server.add_secure_port(listen, server_credentials(tls))
            else:
                port = self._server.add_insecure_port(listen)
        except RuntimeError as exc:
            port, why = 0, exc
        else:
            why = "address in use or not local"
        if not port:
            self._executor.shutdown(wait=False)
            raise TransportError(f"{party_id}: cannot listen on {listen!r}: {why}")
        self._port = port
        self._server.start()
        if tls is None:
            log.warning("%s: INSECURE transport on %s: traffic is plaintext and unauthenticated; sender "
                        "identities are NOT verified (--insecure is for local experiments only)",
                        party_id, self.address)
        else:
            log.info("%s: listening on %s with mutual TLS (identity %r)", party_id, self.address, tls.identity)

    # ------------------------------------------------------------------ properties
    @property
    def bound_port(self) -> int:
        """The TCP port the server listens on (useful with ``listen="host:0"``)."""
        return self._port

    @property
    def address(self) -> str:
        """``listen`` host with the bound port, e.g. ``"127.0.0.1:43117"``."""
        return f"{self._listen_host}:{self._port}"

    @property
    def peers(self) -> dict[str, str]:
        """A copy of party id -> address of every peer."""
        with self._lock:
            return dict(self._peers)

    @property
    def secure(self) -> bool:
        """Whether the channels use mutual TLS (False only with ``insecure``)."""
        return self._tls is not None

    def set_peer_address(self, party_id: str, address: str) -> None:
        """Change where ``party_id`` listens (e.g. after it bound port 0); reopens its channel."""
        if party_id not in self._peers:
            raise KeyError(f"{party_id!r} is not a peer of {self.party_id!r}: {sorted(self._peers)}")
        _parse_address(address, f"address of peer {party_id!r}")
        with self._lock:
            self._peers[party_id] = address
            old = self._channels.pop(party_id, None)
        if old is not None:
            old[0].close()

    def _mailbox(self) -> Mailbox:
        return self._box

    # ------------------------------------------------------------------ sending
    def _stub(self, receiver: str) -> tuple[pb_grpc.PartyServiceStub, str]:
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.party_id}: transport is closed")
            address = self._peers[receiver]
            entry = self._channels.get(receiver)
            if entry is None:
                options = [
                    ("grpc.max_send_message_length", MAX_CHUNK_SIZE + _SLACK),
                    ("grpc.max_receive_message_length", 1 * MiB),
                    ("grpc.enable_retries", 0),  # we retry ourselves; gRPC's retry would buffer whole streams
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    # gRPC reads this as the minimum *connect timeout*: at 100 ms, attempts over a WAN timed
                    # out mid-handshake (first send 3.2 s instead of 0.9 s at a 300 ms round trip); the
                    # retry pace is set by the other two
                    ("grpc.min_reconnect_backoff_ms", int(CONNECT_TIMEOUT_S * 1000)),
                    ("grpc.max_reconnect_backoff_ms", 1000),  # a starting peer is seen within ~1 s
                    *_KEEPALIVE_OPTIONS,
                    ("grpc.use_local_subchannel_pool", 1),
                ]
                if self._tls is not None:
                    channel = grpc.secure_channel(address, channel_credentials(self._tls),
                                                  options + target_name_options(receiver))
                else:
                    channel = grpc.insecure_channel(address, options)
                entry = (channel, pb_grpc.PartyServiceStub(channel))
                self._channels[receiver] = entry
            return entry[1], address

    def _chunks(self, header: pb.Envelope, data: bytes, progress: _Progress):
        cs = self.chunk_size
        yield pb.Chunk(header=header, data=data[:cs])
        for start in range(cs, len(data), cs):
            yield pb.Chunk(data=data[start:start + cs])
        progress.all_pulled = True

    def send(self, receiver: str, tag: str, payload, round: int = 0, timeout: float | None = None) -> None:
        """Deliver ``payload`` (bytes or a protobuf message) to ``receiver``; see the module docstring.

        Raises:
            PeerUnavailable: ``receiver`` unknown, or unreachable / busy / too slow within the deadline
                (names the peer and its address).
            MessageRejected: the receiver refused the message (its reason is in the error).
            TransportError: this transport is closed, or another gRPC failure (names code and peer).
        """
        if self._closed:
            raise TransportError(f"{self.party_id}: transport is closed; cannot send {tag!r} to {receiver!r}")
        data = _as_bytes(payload)
        round = int(round)
        if round < 0:
            raise ValueError(f"round must be >= 0 (uint64 on the wire), got {round}")
        if receiver == self.party_id:
            self._box.deliver(Message(self.job_id, round, self.party_id, receiver, tag, data))
            return
        if receiver not in self._peers:
            raise PeerUnavailable(f"{self.party_id}: {receiver!r} is not a peer of this job "
                                  f"(known: {sorted(self._peers)})")
        header = pb.Envelope(job_id=self.job_id, round=round, sender=self.party_id, receiver=receiver, tag=tag,
                             payload_size=len(data), payload_sha256=hashlib.sha256(data).digest())
        budget = self.deadline if timeout is None else float(timeout)
        start = time.monotonic()
        end = start + budget
        retry_end = start + (budget if self.retry_window is None else min(budget, self.retry_window))
        what = f"{tag!r} (round {round}, {len(data)} bytes)"
        ambiguous = False
        for attempt in itertools.count():
            stub, address = self._stub(receiver)
            progress = _Progress()
            try:
                ack = stub.Deliver(self._chunks(header, data, progress), timeout=max(end - time.monotonic(), 0.001))
            except grpc.RpcError as err:
                # The stream never completed, or completed but the Ack was lost (ambiguous):
                # then a "duplicate"/"stale" refusal of a retry means the first try arrived.
                # RESOURCE_EXHAUSTED (busy) is a refusal before the message was read: not ambiguous.
                ambiguous = ambiguous or (progress.all_pulled and err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED)
                self._back_off_or_raise(err, receiver, address, what, attempt, start, retry_end)
                continue
            self._settle(ack, receiver, what, len(data), ambiguous)
            self.wire.record_grpc_sent(receiver, tag, header.ByteSize(), split_lengths(len(data), self.chunk_size))
            if self.trace is not None:
                self.trace.sent(header)
            return

    def _back_off_or_raise(self, err: grpc.RpcError, receiver: str, address: str, what: str, attempt: int,
                           start: float, retry_end: float) -> None:
        """After a failed attempt: wait the backoff if ``receiver`` may still come up, else raise."""
        code, details = err.code(), err.details()
        if self._closed:
            raise TransportError(f"{self.party_id}: transport closed while sending {what} to "
                                 f"{receiver!r}") from None
        now = time.monotonic()
        if code == grpc.StatusCode.UNAVAILABLE and _tls_refused(details):
            # A certificate problem does not heal by retrying: fail now with the reason.
            raise PeerUnavailable(
                f"{self.party_id}: TLS handshake with {receiver!r} at {address} failed: {details}. "
                f"Both parties need certificates from the same CA, and the one at {address} must be "
                f"for {receiver!r}.") from None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED) and now < retry_end:
            delay = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** attempt) * random.uniform(0.5, 1.5)
            delay = min(delay, max(retry_end - now, 0.0))
            log.debug("%s: %s %s at %s (%s), retry %d in %.2fs", self.party_id, receiver,
                      "busy" if code == grpc.StatusCode.RESOURCE_EXHAUSTED else "unreachable", address, details,
                      attempt + 1, delay)
            if self._closing.wait(delay):
                raise TransportError(f"{self.party_id}: transport closed while sending {what} to "
                                     f"{receiver!r}") from None
            return
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise PeerUnavailable(
                f"{self.party_id}: {receiver!r} at {address} refused {what} as busy for {now - start:.1f}s "
                f"({attempt + 1} attempts): {details}") from None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise PeerUnavailable(
                f"{self.party_id}: could not deliver {what} to {receiver!r} at {address} within "
                f"{now - start:.1f}s ({attempt + 1} attempts; last error {code.name}: {details}). "
                f"Is {receiver!r} running at {address}? With TLS, its certificate must be for "
                f"{receiver!r} and signed by the same CA as ours.") from None
        raise TransportError(f"{self.party_id}: sending {what} to {receiver!r} at {address} failed: "
                             f"{code.name}: {details}") from None

    def _settle(self, ack: pb.Ack, receiver: str, what: str, size: int, ambiguous: bool) -> None:
        """Count an accepted message; raise :class:`MessageRejected` for a refusal (unless a lost Ack)."""
        if ack.accepted:
            with self._lock:
                self.sent_bytes += size
            return
        if ambiguous and ("duplicate message" in ack.error or "stale or replayed" in ack.error):
            log.info("%s: %s already had %s from an earlier attempt whose Ack was lost", self.party_id,
                     receiver, what)
            return
        raise MessageRejected(f"{receiver!r} rejected {what} from {self.party_id!r}: {ack.error}")

    # ------------------------------------------------------------------ receiving
    def _handle_deliver(self, request_iterator, context) -> pb.Ack:
        peer = context.peer()
        stream = _Stream()
        # with TLS the sender is known before any chunk: a peer at its stream cap costs no read at all
        who = peer_identity(context) if self._tls is not None else None
        if who is not None:
            busy = self._open_stream(who, stream)
            if busy is not None:
                return self._busy(context, busy)
        watch = _StreamWatch(context, self.first_chunk_timeout)
        try:
            return self._serve(request_iterator, context, watch, stream, who or peer)
        finally:
            watch.stop()
            self._close_stream(stream)  # every path: the stream slot and any reserved bytes go back

    def _serve(self, request_iterator, context, watch: _StreamWatch, stream: "_Stream", who: str) -> pb.Ack:
        try:
            msg, chunks = self._receive(request_iterator, context, watch, stream)
        except _Busy as exc:
            return self._busy(context, exc.reason)
        except (_Refused, grpc.RpcError) as exc:
            # a cancelled stream may end as an error or as a short iterator: either way, the cut is the reason
            if watch.expired:
                if watch.header is None:
                    reason = (f"stream stalled: no first chunk within {self.first_chunk_timeout:g}s "
                              f"(first_chunk_timeout); cut")
                else:
                    reason = (f"stream stalled: not complete within {watch.seconds:.0f}s (stream_timeout "
                              f"{self.stream_timeout:.0f}s + payload size / {MIN_STREAM_RATE} bytes/s); cut")
                self._refuse(reason, watch.header, who)
                return pb.Ack(accepted=False, error=reason)
            if isinstance(exc, _Refused):
                self._refuse(exc.reason, exc.header, who)
                return pb.Ack(accepted=False, error=exc.reason)
            log.warning("%s: stream from %s broke before the message was complete: %s", self.party_id, who,
                        exc.details() if hasattr(exc, "details") else exc)
            return pb.Ack(accepted=False, error="stream broken")
        except Exception as exc:  # noqa: BLE001 - bad input must never take the party down
            log.exception("%s: error while receiving from %s", self.party_id, who)
            return pb.Ack(accepted=False, error=f"receiver error: {type(exc).__name__}: {exc}")
        finally:
            watch.stop()
        reserved, stream.reserved = stream.reserved, 0  # deliver() releases it, whatever it decides
        try:
            self._box.deliver(msg, reserved=reserved)  # atomic re-check of the wire rules (logs refusals itself)
        except MessageRejected as exc:
            return pb.Ack(accepted=False, error=str(exc))
        with self._lock:
            self.received_bytes += len(msg.payload)
        self.wire.record_grpc_received(msg.sender, msg.tag, watch.header.ByteSize(), chunks)
        log.debug("%s: received %r round %d from %s (%d bytes)", self.party_id, msg.tag, msg.round, msg.sender,
                  len(msg.payload))
        return pb.Ack(accepted=True)

    def _open_stream(self, sender: str, stream: "_Stream") -> str | None:
        """Count a stream of ``sender`` in flight; return why not when it already has its allowed number."""
        cap = self.max_streams_per_sender
        with self._lock:
            n = self._streams.get(sender, 0)
            if n < cap:
                self._streams[sender] = n + 1
                stream.sender = sender
                return None
            refused = self._busy_refusals[sender] = self._busy_refusals.get(sender, 0) + 1
        reason = (f"too many streams in flight from {sender!r} at {self.party_id!r}: {cap} allowed "
                  f"(max_streams_per_sender); refused before reading it")
        if refused & (refused - 1) == 0:  # the 1st, 2nd, 4th, 8th... refusal: a flood cannot flood the log
            log.warning("%s refused a stream from %s: %d streams already in flight, %d allowed (%d such "
                        "refusals so far)", self.party_id, sender, n, cap, refused)
        return reason

    def _close_stream(self, stream: "_Stream") -> None:
        if stream.reserved:
            self._box.release(stream.sender, stream.reserved)
            stream.reserved = 0
        if stream.sender is not None:
            with self._lock:
                n = self._streams.get(stream.sender, 0) - 1
                if n > 0:
                    self._streams[stream.sender] = n
                else:
                    self._streams.pop(stream.sender, None)
            stream.sender = None

    @staticmethod
    def _busy(context, reason: str) -> pb.Ack:
        """End the call with RESOURCE_EXHAUSTED: not read, not recorded; the sender may retry later."""
        context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
        context.set_details(reason)
        return pb.Ack(accepted=False, error=reason)

    def streams_in_flight(self) -> dict[str, tuple[int, int]]:
        """sender -> (incoming streams in flight, declared bytes they reserved), for senders with any."""
        with self._lock:
            streams = dict(self._streams)
        return {s: (n, self._box.reserved(s)) for s, n in streams.items()}

    def _refuse(self, reason: str, header: pb.Envelope | None, who: str) -> None:
        """Record and log a refused stream: by its header (declared size and digest) when one was read.
        ``who``: the sender's certificate CN with TLS, else the connection's address."""
        if header is None:
            log.warning("%s refused a stream from %s: %s", self.party_id, who, reason)
        else:
            self._box.reject(_head(header), reason, int(header.payload_size), bytes(header.payload_sha256))

    def _receive(self, request_iterator, context, watch: _StreamWatch, stream: "_Stream") -> tuple[Message, list[int]]:
        """The message of one incoming stream, and its payload bytes per chunk (for the wire counter)."""
        it = iter(request_iterator)
        first = next(it, None)
        if first is None:
            raise _Refused("empty stream: no chunk received")
        if not first.HasField("header"):
            raise _Refused("first chunk carries no Envelope header")
        h = first.header
        head = _head(h)
        if self._tls is not None:
            cn = peer_identity(context)
            if cn != h.sender:
                raise _Refused(f"claimed sender {h.sender!r} does not match the TLS certificate of the "
                               f"connection (CN {cn!r})", h)
        elif stream.sender is None:  # plaintext: the claimed sender is all there is to count by
            busy = self._open_stream(h.sender, stream)
            if busy is not None:
                raise _Busy(busy)
        watch.header = h
        size = int(h.payload_size)
        if len(h.payload_sha256) != hashlib.sha256().digest_size:
            raise _Refused(f"payload_sha256 has {len(h.payload_sha256)} bytes, expected 32", h)
        # refuse before reading the payload, and hold the declared size against the sender's byte cap
        # while it arrives (deliver() re-checks atomically and releases it)
        reason = self._box.reserve(head, size)
        if reason is not None:
            raise _Refused(reason, h)
        stream.reserved = size
        watch.extend(self.stream_timeout + size / MIN_STREAM_RATE)

        digest = hashlib.sha256()
        parts, total = [], 0
        for index, chunk in enumerate(itertools.chain([first], it)):
            if index and chunk.HasField("header"):
                raise _Refused(f"chunk {index} carries a second header", h)
            data = chunk.data
            total += len(data)
            if total > size:
                raise _Refused(f"more payload bytes than the declared payload_size {size}", h)
            digest.update(data)
            parts.append(data)
        if total != size:
            raise _Refused(f"payload truncated: {total} bytes received, {size} declared", h)
        if digest.digest() != h.payload_sha256:
            raise _Refused("payload SHA-256 does not match the header (corrupted or tampered)", h)
        payload = parts[0] if len(parts) == 1 else b"".join(parts)
        msg = Message(head.job_id, head.round, head.sender, head.receiver, head.tag, payload)
        return msg, [len(p) for p in parts]

    # ------------------------------------------------------------------ shutdown
    def close(self, grace: float | None = None) -> None:
        """Stop: wake pending :meth:`recv` calls, stop the server (letting in-flight deliveries finish
        for ``grace`` seconds, default ``close_grace``), close channels, stop server threads. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
        self._closing.set()
        self._box.close()
        self._server.stop(self.close_grace if grace is None else grace).wait()
        for channel, _ in channels:
            channel.close()
        self._executor.shutdown(wait=True)
        log.debug("%s: transport closed", self.party_id)
