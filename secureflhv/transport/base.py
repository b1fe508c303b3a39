"""The transport interface every algorithm talks through, and the mailbox behind it.

Algorithms never open sockets: they call :meth:`Transport.send` and :meth:`Transport.recv`
with a receiver/sender party id, a *tag* naming what the payload is, and a *round* id.
Two implementations share this interface: :class:`~secureflhv.transport.inprocess.InProcessNetwork`
(unit tests, one process) and :class:`~secureflhv.transport.grpc_transport.GrpcTransport`
(real deployments: gRPC with mutual TLS).

Wire rules enforced here (docs/architecture.md, "One message, from the job file to the wire"; docs/security.md):

* a message for another job or another receiver is rejected;
* a message from a party that is not in the job is rejected;
* a message whose (sender, tag, round) was already consumed, or whose round is not newer than
  the last round consumed for that (sender, tag), is rejected as stale / replayed;
* a payload larger than ``max_payload_bytes`` is rejected (gRPC: from the declared size in the
  header, before any payload byte is read);
* a sender may have at most ``max_pending`` messages and ``max_pending_bytes`` payload bytes queued
  (delivered, not yet consumed) at a receiver; more is rejected as a flood, so a peer sending
  future-round messages cannot exhaust the receiver's memory. The declared size of the sender's
  streams still being received (:meth:`Mailbox.reserve`, gRPC) counts toward the same byte cap;
* a payload that fails the caller's ``parse`` check (wrong shape, wrong key, ...) is rejected
  and logged, and the receiver keeps waiting for a valid message until its deadline.

Rejections raise :class:`MessageRejected` to the *sender* (gRPC answers with an error Ack) and are
logged at the receiver; they never crash the receiving party. A rejected payload is not kept: the
log and :attr:`Mailbox.rejected` hold a :class:`Rejected` record (envelope, size, SHA-256 prefix).

Limits (defaults; the runtime sets ``max_payload_bytes`` from the job file's ``job.max_message_mb``):
``max_payload_bytes`` 256 MiB, ``max_pending`` 64 messages per sender, ``max_pending_bytes`` twice
``max_payload_bytes`` per sender. Memory held for queued and in-flight messages is therefore at most
``peers * max_pending_bytes``.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar

log = logging.getLogger("secureflhv.transport")

T = TypeVar("T")

ABORT_TAG = "__abort__"
PROBE_TAG = "__check__"  # a reachability probe (``secureflhv check``): accepted, answered, never queued
DEFAULT_DEADLINE_S = 120.0
MiB = 1 << 20
DEFAULT_MAX_PAYLOAD_BYTES = 256 * MiB  # largest payload a party accepts unless the job raises it
DEFAULT_MAX_PENDING = 64  # messages one sender may have queued (delivered, not yet consumed) at a receiver
MAX_ABORT_REASON = 2000  # characters of a peer's abort reason kept
DIGEST_HEX = 16  # hex digits of the SHA-256 prefix that names a rejected payload in logs


class TransportError(RuntimeError):
    """Base class of every transport failure."""


class PeerTimeout(TransportError):
    """No (valid) message arrived from a peer before the deadline. ``sender``: that peer (None if unknown)."""

    sender: str | None = None


class PeerLost(PeerTimeout):
    """A wait on a live peer timed out while another party of the job could no longer be reached.

    The live peer is most likely blocked on the lost one, so the lost one is the root cause: ``peer`` (the
    lost party) and ``reason`` (one sentence) say so; ``sender`` is the peer that was waited on. Raised by
    :func:`secureflhv.transport.role.lost_peer_behind` from the original :class:`PeerTimeout`.
    """

    def __init__(self, me: str, peer: str, reason: str, timeout: PeerTimeout):
        self.peer, self.reason, self.sender = peer, reason, timeout.sender
        super().__init__(f"{me}: {peer} failed: {reason}")


class PeerUnavailable(TransportError):
    """A message could not be delivered to a peer before the deadline (peer down or unreachable)."""


class MessageRejected(TransportError):
    """The receiver refused a message (wrong job, stale round, replay, bad sender, ...)."""


class JobAborted(TransportError):
    """A peer announced that the job failed; carries the peer's reason. ``waiting_for``: the peer this
    party was waiting on when the abort came (None if unknown)."""

    waiting_for: str | None = None


class ProtocolError(ValueError):
    """A payload is well-formed protobuf but wrong for the protocol (shape, key, range).

    Raise it from a ``parse`` callback passed to :meth:`Transport.recv`: the message is then
    rejected and logged, and ``recv`` keeps waiting for a valid one.
    """


@dataclass(frozen=True)
class Message:
    """One delivered message. ``payload`` is the serialised protobuf payload (bytes)."""

    job_id: str
    round: int
    sender: str
    receiver: str
    tag: str
    payload: bytes


@dataclass(frozen=True)
class Rejected:
    """What a receiver keeps of a message it refused: the envelope, the payload's size and a SHA-256
    prefix (``digest``, hex; the declared one when refused from a gRPC header), and the reason.
    Never the payload itself, so refusals cost no memory beyond this record."""

    job_id: str
    round: int
    sender: str
    receiver: str
    tag: str
    size: int
    digest: str
    reason: str

    @classmethod
    def of(cls, msg: Message, reason: str, size: int | None = None, digest: bytes | None = None) -> "Rejected":
        """The record of ``msg``; ``size``/``digest`` override the payload's (header-only refusals)."""
        size = len(msg.payload) if size is None else int(size)
        digest = hashlib.sha256(msg.payload).digest() if digest is None else bytes(digest)
        return cls(msg.job_id, msg.round, msg.sender, msg.receiver, msg.tag, size, digest.hex()[:DIGEST_HEX], reason)


def _as_bytes(payload) -> bytes:
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    serialize = getattr(payload, "SerializeToString", None)
    if serialize is None:
        raise TypeError(f"payload must be bytes or a protobuf message, not {type(payload).__name__}")
    return serialize()


class Mailbox:
    """Thread-safe store of messages delivered to one party, keyed by (sender, tag, round).

    Args:
        party_id: the owner of the mailbox; messages addressed elsewhere are rejected.
        job_id: the job; messages of other jobs are rejected.
        peers: party ids allowed to send here (``None`` accepts any sender).
        max_payload_bytes: largest payload accepted (default 256 MiB).
        max_pending: messages one sender may have queued here (default 64).
        max_pending_bytes: payload bytes one sender may have queued here (default 2 * max_payload_bytes).

    Raises:
        ValueError: a limit is not positive.
    """

    def __init__(self, party_id: str, job_id: str, peers: Iterable[str] | None = None, *,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, max_pending: int = DEFAULT_MAX_PENDING,
                 max_pending_bytes: int | None = None):
        self.party_id = party_id
        self.job_id = job_id
        self.peers = None if peers is None else frozenset(peers)
        self.max_payload_bytes = int(max_payload_bytes)
        self.max_pending = int(max_pending)
        self.max_pending_bytes = 2 * self.max_payload_bytes if max_pending_bytes is None else int(max_pending_bytes)
        for name in ("max_payload_bytes", "max_pending", "max_pending_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{party_id}: {name} must be > 0, got {getattr(self, name)}")
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, str, int], Message] = {}
        self._queued: dict[str, tuple[int, int]] = {}  # sender -> (messages, payload bytes) pending
        self._reserved: dict[str, int] = {}  # sender -> declared bytes of its streams being received
        self._last_round: dict[tuple[str, str], int] = {}
        self._abort: tuple[str, str] | None = None
        self._closed = False
        self.rejected: list[tuple[Rejected, str]] = []  # (record, reason): no payloads kept

    def queued(self, sender: str) -> tuple[int, int]:
        """(messages, payload bytes) that ``sender`` has queued here, not yet consumed."""
        with self._cond:
            return self._queued.get(sender, (0, 0))

    def reserved(self, sender: str) -> int:
        """Declared payload bytes of ``sender``'s messages still being received (see :meth:`reserve`)."""
        with self._cond:
            return self._reserved.get(sender, 0)

    def reserve(self, msg: Message, size: int) -> str | None:
        """Check ``msg`` (header only) as :meth:`check` does and, if acceptable, reserve its declared
        ``size`` against the sender's byte cap until :meth:`deliver` (``reserved=size``) or
        :meth:`release`. Return why it is refused (nothing reserved), or ``None``.

        A transport that buffers a message before delivering it calls this first, so a sender's
        in-flight streams cannot buffer more than ``max_pending_bytes`` beyond what it has queued.
        """
        with self._cond:
            reason = self.check(msg, size)
            if reason is None:
                self._reserved[msg.sender] = self._reserved.get(msg.sender, 0) + int(size)
            return reason

    def release(self, sender: str, size: int) -> None:
        """Give back ``size`` bytes reserved by :meth:`reserve` (the stream failed or was refused)."""
        with self._cond:
            self._release(sender, size)

    def _release(self, sender: str, size: int) -> None:
        left = self._reserved.get(sender, 0) - int(size)
        if left > 0:
            self._reserved[sender] = left
        else:
            self._reserved.pop(sender, None)

    # ------------------------------------------------------------------ receiving side
    def check(self, msg: Message, size: int | None = None) -> str | None:
        """Return why ``msg`` must be rejected, or ``None`` when it is acceptable.

        ``size``: the payload size to judge (default ``len(msg.payload)``; gRPC passes the size its
        header declares, to refuse before reading the payload).
        """
        size = len(msg.payload) if size is None else int(size)
        if msg.job_id != self.job_id:
            return f"message for job {msg.job_id!r}, this party runs job {self.job_id!r}"
        if msg.receiver != self.party_id:
            return f"message addressed to {msg.receiver!r} delivered to {self.party_id!r}"
        if self.peers is not None and msg.sender not in self.peers:
            return f"sender {msg.sender!r} is not a party of job {self.job_id!r}"
        if size > self.max_payload_bytes:
            return (f"payload of {size} bytes from {msg.sender!r} exceeds this party's limit of "
                    f"{self.max_payload_bytes} bytes at {self.party_id!r} (max_payload_bytes; job file: "
                    f"job.max_message_mb)")
        if msg.tag in (ABORT_TAG, PROBE_TAG):
            return None
        last = self._last_round.get((msg.sender, msg.tag))
        if last is not None and msg.round <= last:
            return (f"stale or replayed message: tag {msg.tag!r} round {msg.round} from {msg.sender!r}, "
                    f"round {last} already consumed")
        if (msg.sender, msg.tag, msg.round) in self._pending:
            return f"duplicate message: tag {msg.tag!r} round {msg.round} from {msg.sender!r} already queued"
        count, queued = self._queued.get(msg.sender, (0, 0))
        inflight = self._reserved.get(msg.sender, 0)
        if count + 1 > self.max_pending or queued + inflight + size > self.max_pending_bytes:
            return (f"flood: {msg.sender!r} already has {count} messages ({queued} bytes) queued at "
                    f"{self.party_id!r} and not consumed, and {inflight} bytes declared by streams still "
                    f"arriving; limit {self.max_pending} messages / {self.max_pending_bytes} bytes per sender "
                    f"(tag {msg.tag!r} round {msg.round}, {size} bytes)")
        return None

    def deliver(self, msg: Message, reserved: int = 0) -> None:
        """Queue ``msg`` or raise :class:`MessageRejected` (and log) when it breaks a wire rule.

        ``reserved``: bytes this message reserved with :meth:`reserve`; released first, whatever the outcome.
        """
        with self._cond:
            if reserved:
                self._release(msg.sender, reserved)
            reason = self.check(msg)
            if reason is not None:
                self._reject(msg, reason)
                raise MessageRejected(reason)
            if msg.tag == ABORT_TAG:
                self._abort = (msg.sender, msg.payload[:4 * MAX_ABORT_REASON].decode("utf-8", "replace")
                               [:MAX_ABORT_REASON])
            elif msg.tag != PROBE_TAG:
                self._pending[(msg.sender, msg.tag, msg.round)] = msg
                count, queued = self._queued.get(msg.sender, (0, 0))
                self._queued[msg.sender] = (count + 1, queued + len(msg.payload))
            self._cond.notify_all()

    def reject(self, msg: Message, reason: str, size: int | None = None, digest: bytes | None = None) -> None:
        """Record and log a message refused before it reached the mailbox (e.g. by the transport's
        certificate or integrity checks), so that :attr:`rejected` lists every refusal.
        ``size``/``digest``: the declared ones when the payload was never read."""
        with self._cond:
            self._reject(msg, reason, size, digest)

    def _reject(self, msg: Message, reason: str, size: int | None = None, digest: bytes | None = None) -> None:
        rec = Rejected.of(msg, reason, size, digest)
        log.warning("%s rejected a message from %s (tag %r, round %d, %d bytes, sha256 %s): %s",
                    self.party_id, rec.sender, rec.tag, rec.round, rec.size, rec.digest, reason)
        self.rejected.append((rec, reason))  # after the log: a recorded refusal has been logged

    def _unqueue(self, msg: Message) -> None:
        count, queued = self._queued[msg.sender]
        if count == 1:
            del self._queued[msg.sender]
        else:
            self._queued[msg.sender] = (count - 1, queued - len(msg.payload))

    def take(self, sender: str, tag: str, round: int, timeout: float,
             parse: Callable[[bytes], T] | None = None):
        """Wait for the message (sender, tag, round) and return its payload, parsed if asked.

        Raises:
            PeerTimeout: nothing valid arrived within ``timeout`` seconds (names sender, tag, round).
            JobAborted: a peer announced that the job failed.
        """
        key = (sender, tag, round)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._abort is not None:
                    who, why = self._abort
                    aborted = JobAborted(f"party {who!r} aborted the job: {why}")
                    aborted.waiting_for = sender  # what this party was blocked on (runtime/process/blame.py)
                    raise aborted
                msg = self._pending.pop(key, None)
                if msg is not None:
                    self._unqueue(msg)
                    if parse is None:
                        self._consumed(sender, tag, round)
                        return msg.payload
                    try:
                        value = parse(msg.payload)
                    except Exception as exc:  # noqa: BLE001 - any bad payload is rejected, never fatal
                        self._reject(msg, f"invalid payload: {exc}")
                        continue
                    self._consumed(sender, tag, round)
                    return value
                if self._closed:
                    raise TransportError(f"{self.party_id}: transport closed while waiting for {tag!r} from {sender!r}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    silent = PeerTimeout(
                        f"{self.party_id}: no valid message {tag!r} (round {round}) from {sender!r} "
                        f"within {timeout:.0f}s: is {sender!r} still running?")
                    silent.sender = sender
                    raise silent
                self._cond.wait(min(remaining, 1.0))

    def _consumed(self, sender: str, tag: str, round: int) -> None:
        # Keep the highest consumed round: taking an older queued round after a newer one must not
        # lower the bar and let a replay of the newer round in.
        key = (sender, tag)
        last = self._last_round.get(key)
        self._last_round[key] = round if last is None else max(last, round)

    def close(self) -> None:
        """Close the mailbox: every waiting :meth:`take` wakes and raises; later deliveries are refused."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Transport(ABC):
    """What an algorithm's role class sees of the network.

    Attributes:
        party_id: this party's id (as in the job file and its certificate).
        job_id: the job id stamped on every message.
        deadline: default seconds to wait in :meth:`recv` and to keep retrying in :meth:`send`.
        identity: this party's :class:`~secureflhv.transport.identity.PartyIdentity` (certificate and
            signing key; verifies peers' certificate-signed data), or ``None`` without certificates.
        max_payload_bytes: the largest payload this party accepts (the job's ``job.max_message_mb``;
            every party of a job has the same), or ``None`` where unknown.
    """

    party_id: str
    job_id: str
    deadline: float
    identity = None
    max_payload_bytes: int | None = None
    wire = None  # a WireCounter (transport/wire.py) where the transport counts bytes

    def wire_stats(self) -> dict:
        """Bytes sent to / received from each peer, per tag (see :mod:`secureflhv.transport.wire`);
        ``{}`` for a transport that does not count."""
        return self.wire.stats() if self.wire is not None else {}

    @abstractmethod
    def send(self, receiver: str, tag: str, payload, round: int = 0, timeout: float | None = None) -> None:
        """Deliver ``payload`` (bytes or a protobuf message) to ``receiver``.

        Raises:
            PeerUnavailable: the receiver could not be reached before the deadline.
            MessageRejected: the receiver refused the message (the reason is in the error).
        """

    @abstractmethod
    def _mailbox(self) -> Mailbox:
        """This party's mailbox."""

    def recv(self, sender: str, tag: str, round: int = 0, timeout: float | None = None,
             parse: Callable[[bytes], T] | None = None):
        """Wait for message ``tag`` of ``round`` from ``sender``; return its bytes or ``parse(bytes)``.

        A payload for which ``parse`` raises is rejected and logged, and the wait goes on.

        Raises:
            PeerTimeout: nothing valid arrived before the deadline; the error names the sender.
            JobAborted: a peer announced the job failed.
        """
        return self._mailbox().take(sender, tag, round, self.deadline if timeout is None else timeout, parse)

    def recv_while_reachable(self, sender: str, tag: str, round: int = 0, timeout: float | None = None,
                             parse: Callable[[bytes], T] | None = None):
        """:meth:`recv` for a wait that may rightly outlast the deadline, because ``sender`` itself waits on
        others (a secure-aggregation server outwaits slow clients): wait up to ``timeout`` seconds in slices
        of :attr:`deadline`, and after each silent slice probe ``sender`` (:meth:`reachable`, for up to one
        more deadline). A sender that cannot be reached ends the wait, so a crashed peer is named within two
        deadlines, not after the whole ``timeout``; a link down for less than a deadline is survived.

        Raises:
            PeerTimeout: ``sender`` could not be reached after a silent slice, or sent nothing valid within
                ``timeout``; the error names it.
            JobAborted: a peer announced the job failed.
        """
        total = self.deadline if timeout is None else timeout
        end = time.monotonic() + total
        while True:
            remaining = end - time.monotonic()
            try:
                return self.recv(sender, tag, round, timeout=min(self.deadline, max(remaining, 0.0)), parse=parse)
            except PeerTimeout as exc:
                if end - time.monotonic() <= 0:
                    why = f"within {total:g}s: is {sender!r} still running?"
                elif not self.reachable(sender, self.deadline):  # a link down for less than a deadline is survived
                    why = f"for {self.deadline:g}s, and it could not be reached for {self.deadline:g}s more " \
                          f"(stopped or crashed?)"
                else:
                    continue
                silent = PeerTimeout(f"{self.party_id}: no valid message {tag!r} (round {round}) from {sender!r} {why}")
                silent.sender = sender
                raise silent from exc

    def abort(self, reason: str, peers: Iterable[str]) -> None:
        """Tell ``peers`` this party failed, so they stop now instead of at their deadline (best effort)."""
        for peer in peers:
            try:
                self.send(peer, ABORT_TAG, reason.encode("utf-8"), round=0, timeout=2.0)
            except Exception as exc:  # noqa: BLE001 - a dead peer cannot be told; deadlines cover it
                log.debug("could not tell %s about the abort: %s", peer, exc)

    def reachable(self, peer: str, timeout: float) -> bool:
        """Whether ``peer`` answers a probe (:data:`PROBE_TAG`, accepted and never queued) within ``timeout``
        seconds. A peer that answers with a refusal (also "busy": its per-sender stream cap) or a failed TLS
        handshake is up; only one that cannot be reached (connection refused, no answer) is not."""
        try:
            self.send(peer, PROBE_TAG, b"alive?", round=0, timeout=timeout)
        except MessageRejected:
            return True
        except PeerUnavailable as exc:
            return "TLS handshake" in str(exc) or " as busy " in str(exc)
        except TransportError:  # e.g. this transport closed: nothing learnt about the peer
            return True
        return True

    @property
    def rejected(self) -> list[tuple[Rejected, str]]:
        """Messages this party rejected, as (record without payload, reason) (for logs and tests)."""
        return self._mailbox().rejected

    def close(self) -> None:
        """Stop receiving; pending ``recv`` calls fail at once."""
        self._mailbox().close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def parse_message(cls, validate: Callable | None = None) -> Callable[[bytes], object]:
    """A ``parse`` callback for :meth:`Transport.recv`: decode protobuf ``cls``, then run ``validate``.

    ``validate(msg)`` may raise :class:`ProtocolError`; it may also return a converted value,
    which ``recv`` then returns instead of the message.
    """

    def parse(payload: bytes):
        msg = cls.FromString(payload)
        if validate is None:
            return msg
        out = validate(msg)
        return msg if out is None else out

    return parse
