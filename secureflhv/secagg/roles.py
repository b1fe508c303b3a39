"""The two halves every aggregation kind implements: :class:`AggregationClient`, :class:`AggregationServer`.

Both are :class:`~secureflhv.transport.role.ProtocolRole` subclasses that tell nobody through
``Transport.abort`` when they fail: a failing client is a dropout the round survives while t clients
remain, and a failing server reports the failure in-band (``ServerMessage.abort`` to the clients it
still expects) and raises :class:`~secureflhv.secagg.result.AggregationError` to the algorithm that
called it, whose own role tells its peers.
"""
from __future__ import annotations

import logging
from abc import abstractmethod
from typing import Sequence

import numpy as np

from ..crypto.quantise import QuantParams, quantise, rounding_rng
from ..transport.role import ProtocolRole
from .config import AggregationConfig
from .result import AggregateResult

log = logging.getLogger("secureflhv.secagg")


class AggregationClient(ProtocolRole):
    """Client half; ``submit`` blocks until this client's part of the round ends.

    Args:
        transport: this client's transport.
        server_id: party id of the aggregation server.
        config: shared settings.
    """

    protocol = "aggregation"

    def __init__(self, transport, server_id: str, config: AggregationConfig):
        super().__init__(transport)
        self.server_id = server_id
        self.config = config
        self.last_n_clipped = 0

    def _peers(self) -> list[str]:
        return []  # a failing client is a dropout: it tells nobody

    def _encode(self, x: np.ndarray, weight: float, qp: QuantParams, round_id: int) -> np.ndarray:
        """The words (d+2,) of ``weight * clip(x)`` mod 2^k, with the seeded rounding of ``config.seed``
        (tests override it to stage a client that skips clipping or forges its weight)."""
        words, self.last_n_clipped = quantise(x, weight, qp, rounding_rng(self.config.seed, round_id, self.party_id),
                                              self.party_id)
        return words

    @abstractmethod
    def submit(self, round_id: int, participants: Sequence[str], vector: np.ndarray, weight: float) -> None:
        """Contribute ``weight * vector`` to round ``round_id``; returns when this client's part is done.

        Args:
            round_id: the round (same at the server and every participant).
            participants: party ids of this round's clients (this client among them).
            vector: float64 (d,) (flattened if not 1-D); d is the server's ``dim``.
            weight: in [0, ``config.max_weight``]; 0 contributes nothing (IFCA's clusters a client did not
                pick submit zeros with weight 0, so the server cannot tell them apart).

        Raises:
            AggregationError: the round failed (e.g. too few survivors, a failed check, a server abort) or
                ``participants`` is a list the job does not allow (:func:`~.exchange.check_round`).
            ValueError: a bad ``weight``.
        """


class AggregationServer(ProtocolRole):
    """Server half; ``aggregate`` returns the sum over survivors or raises :class:`AggregationError`."""

    protocol = "aggregation"

    def __init__(self, transport, config: AggregationConfig):
        super().__init__(transport)
        self.config = config

    def _peers(self) -> list[str]:
        return []  # failures go in-band to this round's clients; the calling algorithm tells its peers

    @abstractmethod
    def aggregate(self, round_id: int, participants: Sequence[str], dim: int) -> AggregateResult:
        """Run round ``round_id`` with ``participants``; return the sum over the survivors.

        Args:
            round_id: the round (same at every participant).
            participants: party ids of this round's clients.
            dim: d, the length of every client's float64 (d,) ``vector``.

        Returns:
            :class:`AggregateResult`: the float64 (d,) sum of ``weight * vector`` over the survivors.

        Raises:
            AggregationError: a selection the job does not allow, fewer than t clients survived a
                stage (the error names them), or the round failed otherwise.
            OutOfRangeRound: the sum breaks the bounds of honest, clipped inputs (:mod:`.bounds`).
        """

    def _log_result(self, round_id: int, res: AggregateResult) -> None:
        log.info("aggregation round %d (%s): %d survivors, dropped %s; clip=%g scale=%g k=%d clipped=%d",
                 round_id, self.config.kind, len(res.survivors), res.dropped or "none", res.clip, res.scale,
                 res.k_bits, res.n_clipped)
