"""Bytes on the wire: what one party sent to and received from each peer, per protocol step (message tag).

Each transport owns a :class:`WireCounter`; ``transport.wire_stats()`` returns its plain-dict snapshot::

    {peer: {"sent": int, "received": int,              # payload bytes (exact)
            "sent_framing": int, "received_framing": int,  # framing bytes (part exact, part estimated)
            "messages_sent": int, "messages_received": int,
            "by_tag": {tag: {the same six counters}}}}

All figures are bytes. Direction is this party's: ``sent`` went to ``peer``, ``received`` came from it.

What is counted, per message that the receiver **accepted** (a refused message or a failed attempt
is not counted, so "A sent to B" equals "B received from A"; a message to oneself never leaves the
process and is not counted):

* payload — **exact**: the serialised protobuf message the protocol sends (``len(payload)``).
* framing of the request (sender -> receiver), from the actual chunk layout:
  - our streaming protocol — **exact**: each :class:`Chunk` is a protobuf message; the first carries the
    :class:`Envelope` header (job, round, sender, receiver, tag, size, SHA-256), every chunk a field tag
    and length prefix around its slice of the payload (``chunk_size`` bytes);
  - gRPC's message prefix — **exact**: 5 bytes (flag + 4-byte length) per chunk;
  - HTTP/2 — **estimated**: a 9-byte frame header per DATA frame of at most 16 KiB (HTTP/2's default
    maximum frame size; gRPC may use larger frames, so this errs high by < 0.1%) plus one closing DATA
    frame, and ``REQUEST_HEADERS`` bytes for the call's HEADERS frame (HPACK-compressed; the first call
    on a connection sends more, later ones less);
  - TLS — **estimated** (when the transport uses TLS): ``TLS_RECORD_OVERHEAD`` bytes (TLS 1.3 with
    AES-GCM: 5-byte record header, 16-byte tag, 1 content-type byte) per record of at most 16 KiB, plus
    ``TLS_EXTRA_RECORDS`` for the call's separate writes (headers, data, end of stream).
* framing of the reply (receiver -> sender), counted as ``received_framing`` at the sender and
  ``sent_framing`` at the receiver: the :class:`Ack` protobuf and its 5-byte prefix (exact), the
  response HEADERS and trailers (estimated, ``RESPONSE_HEADERS``), frame headers and TLS (estimated).

Not counted: TCP/IP headers and ACKs, the TLS handshake, HTTP/2 connection preface, SETTINGS, PING
(keep-alive) and WINDOW_UPDATE frames, and bytes of refused or retried attempts.

Accuracy, measured against the kernel's byte counts of the connection on loopback (``ss -ti``; mutual
TLS, 1 MiB chunks): bytes sent within 3% for 100-byte messages (framing is most of them) and within
0.1% for 50 kB and 3 MB messages; the estimated framing alone within about 12%. The reply direction
undercounts large transfers, whose WINDOW_UPDATE frames are not counted (a few kB per 3 MB).

The in-process transport (tests, benchmarks) has no wire: it counts the payload exactly and the
framing that :class:`~secureflhv.transport.grpc_transport.GrpcTransport` with TLS and 1 MiB chunks
would add for the same message (estimated as above).
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..proto import transport_pb2 as pb

GRPC_PREFIX = 5  # gRPC length-prefixed message: 1 flag byte + 4-byte big-endian length (exact)
H2_FRAME_HEADER = 9  # HTTP/2 frame header (RFC 9113, 4.1)
H2_MAX_FRAME = 16 * 1024  # SETTINGS_MAX_FRAME_SIZE default (RFC 9113); larger frames, where allowed, cost less
# Estimates calibrated on loopback against the kernel's per-connection byte counts (``ss -ti``), grpcio 1.x:
REQUEST_HEADERS = 40  # HPACK bytes of a Deliver call's request headers (indexed after the first call)
RESPONSE_HEADERS = 30  # HPACK bytes of the response headers and trailers (grpc-status) together
TLS_RECORD = 16 * 1024  # largest TLS plaintext record (RFC 8446, 5.1)
TLS_RECORD_OVERHEAD = 22  # TLS 1.3 AES-GCM: 5-byte header + 16-byte tag + 1 inner content type
TLS_EXTRA_RECORDS = (2, 1)  # records beyond the full ones: a call's separate writes (request, reply)
DEFAULT_CHUNK = 1 << 20  # GrpcTransport's default chunk_size (1 MiB)
SHA256_BYTES = 32
_ACK_BYTES = pb.Ack(accepted=True).ByteSize()

COUNTERS = ("sent", "received", "sent_framing", "received_framing", "messages_sent", "messages_received")


def varint_size(n: int) -> int:
    """Bytes of ``n`` (>= 0) as a protobuf varint."""
    return max(1, (int(n).bit_length() + 6) // 7)


def field_size(n: int) -> int:
    """Bytes of a length-delimited protobuf field (field number < 16) holding ``n`` bytes; 0 when ``n`` is 0
    (proto3 omits an empty ``bytes`` field; an empty sub-message is still written, see :func:`chunk_message_sizes`)."""
    return 1 + varint_size(n) + n if n else 0


def split_lengths(payload_size: int, chunk_size: int = DEFAULT_CHUNK) -> list[int]:
    """Payload bytes per chunk as :class:`GrpcTransport` splits ``payload_size`` bytes (one chunk if empty)."""
    if payload_size <= 0:
        return [0]
    full, rest = divmod(int(payload_size), int(chunk_size))
    return [int(chunk_size)] * full + ([rest] if rest else [])


def chunk_message_sizes(header_size: int, chunk_lengths: Sequence[int]) -> list[int]:
    """Serialised size of each :class:`Chunk`: the first carries the header (``header_size`` bytes) too."""
    sizes = [field_size(n) for n in chunk_lengths]
    sizes[0] += 1 + varint_size(header_size) + header_size
    return sizes


def _h2_tls(messages: Iterable[int], headers: int, tls: bool, extra_records: int) -> int:
    """Estimated HTTP/2 + TLS bytes around gRPC messages of the given sizes (5-byte prefix included)."""
    h2 = H2_FRAME_HEADER + headers  # the HEADERS frame
    body = 0
    for m in messages:
        wire = GRPC_PREFIX + m
        body += wire + H2_FRAME_HEADER * max(1, -(-wire // H2_MAX_FRAME))
    h2 += body
    if not tls:
        return h2
    return h2 + TLS_RECORD_OVERHEAD * (-(-h2 // TLS_RECORD) + extra_records)


def request_framing(header_size: int, chunk_lengths: Sequence[int], tls: bool = True) -> int:
    """Framing bytes of one Deliver call carrying chunks of ``chunk_lengths`` payload bytes.

    Exact: chunk protobuf overhead and the 5-byte gRPC prefixes; estimated: HTTP/2 and TLS (see the module
    docstring). Add ``sum(chunk_lengths)`` for all bytes of the request.
    """
    msgs = chunk_message_sizes(header_size, chunk_lengths)
    # the closing (END_STREAM) DATA frame of the client stream is empty: one more frame header
    return _h2_tls(msgs, REQUEST_HEADERS, tls, TLS_EXTRA_RECORDS[0]) + H2_FRAME_HEADER - sum(chunk_lengths)


def reply_framing(tls: bool = True) -> int:
    """Bytes of the reply to an accepted message: an ``Ack`` (exact) in estimated HTTP/2 framing (a HEADERS
    frame, one DATA frame, a trailers HEADERS frame) and TLS."""
    return _h2_tls([_ACK_BYTES], RESPONSE_HEADERS + H2_FRAME_HEADER, tls, TLS_EXTRA_RECORDS[1])


def envelope_size(job_id: str, round: int, sender: str, receiver: str, tag: str, payload_size: int) -> int:
    """Serialised size of the :class:`Envelope` header GrpcTransport sends for this message (exact)."""
    return pb.Envelope(job_id=job_id, round=int(round), sender=sender, receiver=receiver, tag=tag,
                       payload_size=int(payload_size), payload_sha256=b"\0" * SHA256_BYTES).ByteSize()


def _zero() -> dict:
    return dict.fromkeys(COUNTERS, 0)


class WireCounter:
    """Thread-safe byte counters of one party, per peer and per tag (see the module docstring).

    Args:
        tls: whether the transport runs TLS (adds the estimated record overhead to the framing).
    """

    def __init__(self, tls: bool = True):
        self.tls = bool(tls)
        self._lock = threading.Lock()
        self._peers: dict[str, dict] = {}  # peer -> counters + "by_tag": {tag: counters}

    def _add(self, peer: str, tag: str, values: Mapping[str, int]) -> None:
        with self._lock:
            entry = self._peers.get(peer)
            if entry is None:
                entry = self._peers[peer] = {**_zero(), "by_tag": {}}
            per_tag = entry["by_tag"].setdefault(tag, _zero())
            for key, value in values.items():
                entry[key] += value
                per_tag[key] += value

    def record_sent(self, peer: str, tag: str, payload: int, framing: int, reply: int = 0) -> None:
        """``peer`` accepted a message of ``payload`` bytes; ``framing`` bytes went with it, ``reply`` came back."""
        self._add(peer, tag, {"sent": int(payload), "sent_framing": int(framing), "received_framing": int(reply),
                              "messages_sent": 1})

    def record_received(self, peer: str, tag: str, payload: int, framing: int, reply: int = 0) -> None:
        """A message of ``payload`` bytes from ``peer`` was accepted; ``framing`` came with it, ``reply`` went back."""
        self._add(peer, tag, {"received": int(payload), "received_framing": int(framing), "sent_framing": int(reply),
                              "messages_received": 1})

    def record_grpc_sent(self, peer: str, tag: str, header_size: int, chunk_lengths: Sequence[int]) -> None:
        """Count an accepted gRPC Deliver call from here to ``peer`` (framing from the chunk layout)."""
        self.record_sent(peer, tag, sum(chunk_lengths), request_framing(header_size, chunk_lengths, self.tls),
                         reply_framing(self.tls))

    def record_grpc_received(self, peer: str, tag: str, header_size: int, chunk_lengths: Sequence[int]) -> None:
        """Count an accepted gRPC Deliver call from ``peer`` to here (framing from the chunks received)."""
        self.record_received(peer, tag, sum(chunk_lengths), request_framing(header_size, chunk_lengths, self.tls),
                             reply_framing(self.tls))

    def stats(self) -> dict:
        """A deep copy: ``{peer: {counters..., "by_tag": {tag: {counters...}}}}`` (plain ints, JSON-ready)."""
        with self._lock:
            return {peer: {**{k: e[k] for k in COUNTERS},
                           "by_tag": {tag: dict(c) for tag, c in e["by_tag"].items()}}
                    for peer, e in self._peers.items()}


def totals(stats: Mapping[str, Mapping]) -> dict:
    """The six counters summed over every peer of a :meth:`WireCounter.stats` snapshot."""
    out = _zero()
    for entry in stats.values():
        for key in COUNTERS:
            out[key] += int(entry.get(key, 0))
    return out


def report(stats: Mapping[str, Mapping]) -> dict:
    """What a party writes under ``metrics.json["wire"]``: ``{"total": ..., "peers": stats, "counted": ...}``."""
    return {"total": totals(stats), "peers": dict(stats),
            "counted": "payload bytes exact; framing: protobuf chunking and gRPC 5-byte prefixes exact, "
                       "HTTP/2 frame headers and TLS records estimated (secureflhv.transport.wire)"}


TRACE_ENV = "SECUREFLHV_WIRE_TRACE"  # a folder: each party appends its sent messages to PARTY.jsonl there


class WireTrace:
    """A per-message log of what one party sent: one JSON line per message its receiver accepted.

    Fields: ``to`` (receiver id), ``tag``, ``round`` (the transport's integer round), ``bytes`` (payload
    length) and ``sha256`` (hex of the payload). Made to compare a job's traffic before and after a change
    to the code: order across threads is not fixed, so compare the sorted lines; payload hashes repeat only
    where the protocol is deterministic (no fresh keys or masks). Never enabled by default: a party writes
    one only with ``SECUREFLHV_WIRE_TRACE=FOLDER`` in its environment.

    Args:
        path: the file to append to (its folder is created).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def sent(self, header: pb.Envelope) -> None:
        """Append the line of one accepted message (``header`` is its :class:`Envelope`)."""
        line = json.dumps({"to": header.receiver, "tag": header.tag, "round": int(header.round),
                           "bytes": int(header.payload_size), "sha256": header.payload_sha256.hex()})
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
