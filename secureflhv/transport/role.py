"""Base class of the algorithms' role classes (guest, host, server/arbiter of a protocol)."""
from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from typing import Iterable

from .base import PeerLost, PeerTimeout, Transport

PROBE_S = 2.0  # longest a second look at a silent peer may take (probes run in parallel)


def lost_peer_behind(t: Transport, timeout: PeerTimeout, peers: Iterable[str]) -> PeerLost | None:
    """The root cause behind a peer's silence, when it is another party that is gone.

    A peer that sent nothing within the deadline may be alive and itself blocked on a party that died (e.g.
    the guest, retrying a delivery to a killed host, owes the arbiter its next message). Blaming the silent
    peer would hide the dead one, so before blaming it every peer in ``peers`` is probed
    (:meth:`Transport.reachable`, at most :data:`PROBE_S` seconds in all): when the silent peer answers and
    another one cannot be reached, a :class:`PeerLost` naming the first unreachable one (in ``peers`` order)
    is returned. None: the silent peer is gone itself, or nobody else is (the silent peer is the cause).
    """
    silent = timeout.sender
    others = [p for p in peers if p != t.party_id]
    if silent is None or silent not in others or len(others) < 2:
        return None
    seconds = min(PROBE_S, max(t.deadline / 4, 0.1))
    up: dict[str, bool] = {}

    def probe(peer: str) -> None:
        up[peer] = t.reachable(peer, seconds)

    threads = [threading.Thread(target=probe, args=(p,), daemon=True, name=f"probe-{p}") for p in others]
    for th in threads:
        th.start()
    for th in threads:
        th.join(seconds + 1.0)
    lost = [p for p in others if up.get(p) is False]
    if not up.get(silent) or not lost:
        return None
    address = getattr(t, "peers", {}).get(lost[0], "its address")
    return PeerLost(t.party_id, lost[0], f"could not be reached at {address} (stopped or crashed?); {silent!r} is "
                    f"running but sent nothing while it waited on {lost[0]!r}", timeout)


class ProtocolRole(ABC):
    """Holds a party's transport and runs its protocol steps so that a failure reaches the peers.

    Subclasses set ``protocol`` (a name for logs) and list the parties they talk to in :meth:`_peers`.
    """

    protocol = "protocol"

    def __init__(self, transport: Transport):
        self.t = transport
        self.party_id = transport.party_id

    @abstractmethod
    def _peers(self) -> list[str]:
        """Every other party this role talks to (told when this role fails)."""

    def _abort_message(self, exc: BaseException) -> str | None:
        """The abort text the peers get when this role fails with ``exc``; None: tell nobody."""
        return f"{self.party_id}: {type(exc).__name__}: {exc}"

    def _guarded(self, fn, *args, **kwargs):
        """Run ``fn``; on failure tell the peers (so they stop now, not at their deadline) and re-raise.

        The peers get :meth:`_abort_message` (the failure is logged); when it is None, nothing is sent.
        A peer's silence is looked at twice (:func:`lost_peer_behind`): when it only waited on a party that
        is gone, a :class:`PeerLost` naming that party is raised instead (from the timeout).
        """
        try:
            return fn(*args, **kwargs)
        except PeerTimeout as exc:
            lost = None if isinstance(exc, PeerLost) else lost_peer_behind(self.t, exc, self._peers())
            if lost is None:
                self._tell(exc)
                raise
            self._tell(lost)
            raise lost from exc
        except BaseException as exc:
            self._tell(exc)
            raise

    def _tell(self, exc: BaseException) -> None:
        message = self._abort_message(exc)
        if message is not None:
            logging.getLogger(type(self).__module__).error("%s: %s failed: %s", self.party_id, self.protocol, exc)
            self.t.abort(message, self._peers())
