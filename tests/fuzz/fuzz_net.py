"""The fuzzing network: an in-process network that records every receiver's ``parse`` callback and can
swap one honest message for a mutated one (not a test module).

* Capture: every :meth:`FuzzTransport.recv` with a ``parse`` records a :class:`Capture` (receiver, sender,
  tag, round, the real parse callback, the honest payload it was first applied to).
* Attack: :class:`Attack` names (receiver, tag, occurrence); when that honest message is sent, the
  mutated payload is delivered in its place *through the real mailbox and the real parse*. When the
  receiver's parse rejects it, the held honest message is delivered right after (the protocol must
  then give exactly the honest result); when parse accepts it, the honest one is dropped (a lie got in).
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Callable

from secureflhv.transport.base import Mailbox, Message
from secureflhv.transport.inprocess import InProcessNetwork, InProcessTransport


@dataclass
class Capture:
    receiver: str
    sender: str
    tag: str
    round: int
    parse: Callable[[bytes], object]
    payload: bytes


@dataclass
class Attack:
    """Replace occurrence ``index`` of (``receiver``, ``tag``) with ``mutate(honest payload)``."""

    receiver: str
    tag: str
    index: int
    mutate: Callable[[bytes], bytes]
    seen: int = 0
    honest: bytes | None = None
    mutated: bytes | None = None
    rejected: str | None = None  # the mailbox's reason, when the receiver's parse refused the mutation

    @property
    def fired(self) -> bool:
        return self.honest is not None


class FuzzMailbox(Mailbox):
    def __init__(self, party_id, job_id, peers, net: "FuzzNetwork", **limits):
        super().__init__(party_id, job_id, peers, **limits)
        self._net = net

    def _reject(self, msg, reason):
        super()._reject(msg, reason)
        self._net._after_reject(msg, reason)


class FuzzNetwork(InProcessNetwork):
    """InProcessNetwork whose transports capture parse callbacks and whose deliveries can be attacked.

    Set the class attribute ``attack`` on a subclass (see :func:`network_class`) to attack a run.
    """

    attack: Attack | None = None
    instances: list = []

    def __init__(self, job_id, party_ids, deadline=60.0, **limits):
        super().__init__(job_id, party_ids, deadline=deadline, **limits)  # limits: max_payload_bytes, max_pending
        self._mailboxes = {p: FuzzMailbox(p, job_id, self.party_ids, self, **limits) for p in self.party_ids}
        self.captured: list[Capture] = []
        self._held: Message | None = None
        self._flock = threading.RLock()
        type(self).instances.append(self)

    def transport(self, party_id):
        if party_id not in self._mailboxes:
            raise KeyError(party_id)
        return FuzzTransport(self, party_id)

    def inject(self, msg):
        a = type(self).attack
        with self._flock:
            if a is not None and not a.fired and msg.receiver == a.receiver and msg.tag == a.tag:
                a.seen += 1
                if a.seen - 1 == a.index:
                    a.honest, a.mutated = msg.payload, a.mutate(msg.payload)
                    if a.mutated != msg.payload:
                        self._held = msg
                        msg = dataclasses.replace(msg, payload=a.mutated)
        super().inject(msg)

    def _after_reject(self, msg, reason):
        a = type(self).attack
        held = self._held
        if held is None or not reason.startswith("invalid payload"):
            return
        if (held.receiver, held.sender, held.tag, held.round) != (msg.receiver, msg.sender, msg.tag, msg.round):
            return
        self._held = None
        a.rejected = reason
        self._mailboxes[held.receiver].deliver(held)  # the mailbox lock is re-entrant


class FuzzTransport(InProcessTransport):
    """Records the parse callback and first payload of every ``recv`` (the receivers' real parsers)."""

    def recv(self, sender, tag, round=0, timeout=None, parse=None):
        if parse is None:
            return super().recv(sender, tag, round, timeout, parse)
        seen = []

        def recording(payload):
            if not seen:
                seen.append(True)
                self.network.captured.append(Capture(self.party_id, sender, tag, round, parse, payload))
            return parse(payload)

        return super().recv(sender, tag, round, timeout, recording)


def network_class(attack: Attack | None = None):
    """A FuzzNetwork subclass bound to ``attack`` (harnesses build networks from a class)."""
    return type("BoundFuzzNetwork", (FuzzNetwork,), {"attack": attack, "instances": []})
