"""Base class of the algorithms' role classes (guest, host, server/arbiter of a protocol)."""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from .base import Transport


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
        """
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            message = self._abort_message(exc)
            if message is not None:
                logging.getLogger(type(self).__module__).error("%s: %s failed: %s", self.party_id, self.protocol, exc)
                self.t.abort(message, self._peers())
            raise
