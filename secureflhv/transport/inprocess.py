"""In-process transport for unit tests: the same interface as gRPC, no sockets.

Payloads are still bytes (protobuf-serialised), so a protocol that works here exercises the
same (de)serialisation as over the wire.

Example::

    net = InProcessNetwork("job-1", ["guest", "host-1", "server"])
    guest, host = net.transport("guest"), net.transport("host-1")

With ``cert_dir`` (a folder written by :func:`~secureflhv.transport.certs.generate_certificates` for
these parties) every transport carries its party's
:class:`~secureflhv.transport.identity.PartyIdentity`, so protocols that sign relayed messages run
authenticated in tests too.

Bytes are counted as over gRPC (:mod:`~secureflhv.transport.wire`): ``transport.wire_stats()`` per party,
``net.wire_stats()`` for all; payload exact, framing what gRPC with TLS and 1 MiB chunks would add.
"""
from __future__ import annotations

import threading
import time

from .base import (DEFAULT_DEADLINE_S, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_PENDING, Mailbox, Message,
                   PeerUnavailable, Transport, _as_bytes)
from .identity import PartyIdentity
from .wire import WireCounter, envelope_size, split_lengths


class InProcessNetwork:
    """A set of parties of one job whose mailboxes live in this process.

    Args:
        job_id: the job id.
        party_ids: the parties.
        deadline: default seconds of ``recv`` / ``send``.
        cert_dir: optional folder with ``ca.pem`` and ``<party>.pem`` / ``<party>.key`` of every party:
            each transport then has that party's ``identity`` (else ``identity`` is None).
        max_payload_bytes, max_pending: every mailbox's limits (see :class:`~secureflhv.transport.base.Mailbox`).
    """

    def __init__(self, job_id: str, party_ids, deadline: float = DEFAULT_DEADLINE_S, cert_dir=None, *,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, max_pending: int = DEFAULT_MAX_PENDING):
        self.job_id = job_id
        self.party_ids = list(party_ids)
        self.deadline = deadline
        self.identities = ({p: PartyIdentity.from_cert_dir(cert_dir, p) for p in self.party_ids}
                           if cert_dir is not None else {})
        self._mailboxes = {p: Mailbox(p, job_id, self.party_ids, max_payload_bytes=max_payload_bytes,
                                      max_pending=max_pending) for p in self.party_ids}
        self._down: set[str] = set()
        self._lock = threading.Lock()
        self.sent_bytes = 0  # payload bytes sent over this network, all parties together
        # per party: payload exact, framing as gRPC with TLS would add (transport/wire.py)
        self.wire = {p: WireCounter(tls=True) for p in self.party_ids}

    def transport(self, party_id: str) -> "InProcessTransport":
        """The transport of ``party_id`` on this network; KeyError if it is not one of its parties."""
        if party_id not in self._mailboxes:
            raise KeyError(f"party {party_id!r} is not in this network: {self.party_ids}")
        return InProcessTransport(self, party_id)

    def take_down(self, party_id: str) -> None:
        """Simulate a party that died: its mailbox closes and sends to it fail."""
        self._down.add(party_id)
        self._mailboxes[party_id].close()

    def inject(self, msg: Message) -> None:
        """Deliver a raw message as if it came over the wire (tests of rejection paths)."""
        self._mailboxes[msg.receiver].deliver(msg)

    def inject_until_rejected(self, msg: Message, timeout: float = 10.0) -> str:
        """Deliver a bad message, wait until its receiver has consumed and rejected it; return the reason.

        For tests of "rejected and logged while the protocol goes on". Raises TimeoutError if the
        receiver never got to it within ``timeout`` seconds.
        """
        box = self._mailboxes[msg.receiver]
        before = len(box.rejected)
        self.inject(msg)
        deadline = time.monotonic() + timeout
        while len(box.rejected) == before:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{msg.receiver} never consumed the bad {msg.tag!r} (round {msg.round})")
            time.sleep(0.005)
        return box.rejected[-1][1]

    def mailbox(self, party_id: str) -> Mailbox:
        """The mailbox of ``party_id`` (KeyError if absent), for tests that inspect or inject messages."""
        return self._mailboxes[party_id]

    def wire_stats(self) -> dict:
        """``{party: its transport's wire_stats()}`` for every party of this network."""
        return {p: counter.stats() for p, counter in self.wire.items()}

    def _count(self, msg: Message) -> None:
        if msg.sender == msg.receiver:
            return  # never leaves the party
        chunks = split_lengths(len(msg.payload))
        header = envelope_size(msg.job_id, msg.round, msg.sender, msg.receiver, msg.tag, len(msg.payload))
        self.wire[msg.sender].record_grpc_sent(msg.receiver, msg.tag, header, chunks)
        self.wire[msg.receiver].record_grpc_received(msg.sender, msg.tag, header, chunks)


class InProcessTransport(Transport):
    """One party's :class:`~secureflhv.transport.base.Transport` on an :class:`InProcessNetwork`: messages go
    straight into the receiver's mailbox (the same wire rules as gRPC, no sockets); for tests and
    single-process simulations.
    """
    def __init__(self, network: InProcessNetwork, party_id: str):
        self.network = network
        self.party_id = party_id
        self.job_id = network.job_id
        self.deadline = network.deadline
        self.identity = network.identities.get(party_id)
        self.wire = network.wire[party_id]
        self.max_payload_bytes = network.mailbox(party_id).max_payload_bytes

    def _mailbox(self) -> Mailbox:
        return self.network.mailbox(self.party_id)

    def send(self, receiver, tag, payload, round=0, timeout=None):
        """Hand ``payload`` to ``receiver``'s mailbox, whose wire rules apply (counted in ``sent_bytes``);
        PeerUnavailable when the receiver is not on the network or is marked down.
        """
        if receiver in self.network._down or receiver not in self.network._mailboxes:
            raise PeerUnavailable(f"{self.party_id}: party {receiver!r} is unreachable")
        data = _as_bytes(payload)
        with self.network._lock:
            self.network.sent_bytes += len(data)
        msg = Message(self.job_id, int(round), self.party_id, receiver, tag, data)
        self.network.inject(msg)
        self.network._count(msg)  # only once accepted, as over gRPC
