"""Rendezvous: before the protocol starts, the parties meet, and a party that waits says so.

Between organisations, partners start minutes or hours apart. Each party sends a *hello* to every
party it talks to and waits for theirs, logging at a modest cadence::

    waiting for host-1 at 10.0.0.6:50553 (attempt 4, 0:00:31 of 2:00:00)

The wait is bounded by ``job.startup_timeout_s``, separate from the in-protocol
``job.deadline_s``; ``job.startup_log_interval_s`` sets the cadence. Over mutual TLS a delivered hello
proves both identities (the sender's certificate CN is checked by the receiver, the receiver's by the
sender), and its payload carries a digest of the job (id, algorithm, params, parties) so that two
different job files are caught before any protocol message.

Payload: a protobuf ``Bundle`` (at most 1 KiB) with ``text["job"]`` = the job digest (64 hex digits). What each party learns:
that the peer is up and runs the same job description; nothing about its data.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import time

from ...proto import messages_pb2
from ...transport import PROBE_TAG, MessageRejected, PeerTimeout, PeerUnavailable, ProtocolError, Transport
from ..job.job_file import JobConfig, JobConfigError, PartySpec

log = logging.getLogger("secureflhv.rendezvous")

TAG_HELLO = "__hello__"
_MAX_HELLO_BYTES = 1024

__all__ = ["TAG_HELLO", "PartnerMissing", "job_digest", "meet", "partners", "probe"]


class PartnerMissing(PeerUnavailable):
    """A partner did not show up within ``job.startup_timeout_s``; ``peer`` names it."""

    def __init__(self, message: str, peer: str, reason: str):
        super().__init__(message)
        self.peer, self.reason = peer, reason


def job_digest(cfg: JobConfig) -> str:
    """SHA-256 (hex) of what every party's job file must agree on: job id, algorithm, params, the
    parties' ids, roles and addresses, and ``security.insecure_test_keys`` (not local paths)."""
    shared = {"job": cfg.job.id, "algorithm": cfg.job.algorithm, "params": cfg.params,
              "parties": [[p.id, p.role, p.address] for p in cfg.parties],
              "insecure_test_keys": cfg.security.insecure_test_keys}
    return hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode()).hexdigest()


def partners(cfg: JobConfig, party: PartySpec, family: str) -> list[str]:
    """The parties ``party`` talks to: every other party (vertical, peer), or client <-> server (horizontal)."""
    others = [p.id for p in cfg.parties if p.id != party.id]
    if family == "horizontal":
        return others if party.role == "server" else [cfg.server.id]
    return others


def _clock(seconds: float) -> str:
    return str(_dt.timedelta(seconds=int(seconds)))


def _parse_hello(payload: bytes) -> str:
    """``parse`` callback of a hello: the peer's job digest; ProtocolError when it is not one."""
    if len(payload) > _MAX_HELLO_BYTES:
        raise ProtocolError(f"hello of {len(payload)} bytes, at most {_MAX_HELLO_BYTES}")
    digest = messages_pb2.Bundle.FromString(payload).text.get("job", "")
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ProtocolError("hello without a job digest")
    return digest


class _Clock:
    """Elapsed time and attempts of one rendezvous, for the waiting lines."""

    def __init__(self, timeout_s: float, every_s: float):
        self.start = time.monotonic()
        self.timeout_s, self.every_s = float(timeout_s), float(every_s)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def slice(self) -> float:
        """Seconds for the next attempt: one cadence, or what is left."""
        return max(min(self.every_s, self.timeout_s - self.elapsed), 0.01)

    def waiting(self, what: str, attempt: int) -> None:
        log.info("waiting for %s (attempt %d, %s of %s)", what, attempt, _clock(self.elapsed), _clock(self.timeout_s))

    def over(self) -> bool:
        return self.elapsed >= self.timeout_s


def _reach(t: Transport, peer: str, address: str, payload: bytes, clock: _Clock) -> float:
    """Send the hello until ``peer`` accepts it; return the seconds of the successful attempt."""
    for attempt in range(1, 1_000_000):
        sent = time.monotonic()
        try:
            t.send(peer, TAG_HELLO, payload, round=0, timeout=clock.slice())
            return time.monotonic() - sent
        except PeerUnavailable as exc:
            if "TLS handshake" in str(exc):  # a certificate problem does not heal by waiting
                raise
            if clock.over():
                raise PartnerMissing(
                    f"{t.party_id}: {peer} did not come up at {address} within {_clock(clock.timeout_s)} "
                    f"(job.startup_timeout_s)", peer,
                    f"did not start within {_clock(clock.timeout_s)} (nothing listening at {address})") from None
            clock.waiting(f"{peer} at {address}", attempt)
    raise AssertionError("unreachable")


def _await(t: Transport, peer: str, clock: _Clock) -> str:
    """Wait for ``peer``'s hello; return its job digest."""
    for attempt in range(1, 1_000_000):
        try:
            return t.recv(peer, TAG_HELLO, 0, timeout=clock.slice(), parse=_parse_hello)
        except PeerTimeout:
            if clock.over():
                raise PartnerMissing(f"{t.party_id}: no hello from {peer} within {_clock(clock.timeout_s)} "
                                     f"(job.startup_timeout_s)", peer,
                                     f"never said hello within {_clock(clock.timeout_s)}") from None
            clock.waiting(f"{peer}'s hello", attempt)
    raise AssertionError("unreachable")


def meet(t: Transport, cfg: JobConfig, peers: list[str], *, timeout_s: float | None = None,
         every_s: float | None = None) -> dict[str, float]:
    """Meet ``peers`` before the protocol: hello to each (retrying until it is up), then each one's hello.

    Args:
        t: this party's transport (its server is already listening).
        cfg: the job (addresses for the waiting lines, the digest, the default timeouts).
        peers: the parties to meet (:func:`partners`).
        timeout_s: total wait (default ``job.startup_timeout_s``); every_s: log cadence (default
            ``job.startup_log_interval_s``).
    Returns:
        peer -> seconds its hello took to deliver.
    Raises:
        PartnerMissing: a peer did not come up in time (names it).
        PeerUnavailable: a TLS handshake failed (certificates).
        MessageRejected: a peer refused the hello (e.g. another job id).
        JobConfigError: a peer's job file differs (algorithm, params or parties).
        JobAborted: a peer announced a failure meanwhile.
    """
    clock = _Clock(cfg.job.startup_timeout_s if timeout_s is None else timeout_s,
                   cfg.job.startup_log_interval_s if every_s is None else every_s)
    mine = job_digest(cfg)
    payload = messages_pb2.Bundle(text={"job": mine}).SerializeToString()
    addresses = {p.id: p.address for p in cfg.parties}
    took = {peer: _reach(t, peer, addresses[peer], payload, clock) for peer in peers}
    for peer in peers:
        if _await(t, peer, clock) != mine:
            raise JobConfigError(f"{peer} runs a different job description (job id, algorithm, params or "
                                 f"parties differ from ours): compare the two job files")
    log.info("%s met %s in %s", t.party_id, ", ".join(f"{p} ({took[p] * 1000:.0f} ms)" for p in peers) or "nobody",
             _clock(clock.elapsed))
    return took


def probe(t: Transport, peer: str, timeout_s: float) -> dict:
    """One ``secureflhv check`` row: reach ``peer`` with a check message over mutual TLS, twice.

    Returns ``{"peer", "reachable", "certificate", "rtt_ms", "detail"}``; ``reachable``/``certificate``
    are "yes", "no" or "?" (unknown: not reached). ``rtt_ms`` is the second delivery (connection open).
    """
    row = {"peer": peer, "reachable": "no", "certificate": "?", "rtt_ms": None, "detail": ""}
    base = time.time_ns() // 1000
    try:
        for i in range(2):
            sent = time.monotonic()
            t.send(peer, PROBE_TAG, b"check", round=base + i, timeout=timeout_s)  # accepted, never queued
            row["rtt_ms"] = (time.monotonic() - sent) * 1000
        row.update(reachable="yes", certificate="yes")
    except MessageRejected as exc:  # it answered, so TLS held both ways; it refused the message itself
        row.update(reachable="yes", certificate="yes", detail=str(exc))
    except PeerUnavailable as exc:
        tls = "TLS handshake" in str(exc)
        row.update(reachable="yes" if tls else "no", certificate="no" if tls else "?", detail=str(exc))
    return row
