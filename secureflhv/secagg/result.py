"""What one aggregation round produces (:class:`AggregateResult`) or why it could not (:class:`AggregationError`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


class AggregationError(RuntimeError):
    """The round cannot produce a correct sum (fewer than t survivors, protocol violation, ...)."""


class OutOfRangeRound(AggregationError):
    """The unmasked sum breaks the bounds that honest inputs cannot break (:mod:`.bounds`): the round is
    refused and its sum never used.

    Attributes:
        offenders: client -> what it sent out of range, where the server can name it (the unprotected
            kinds see each input; secure aggregation sees only the sum, so this is empty there).
    """

    def __init__(self, message: str, offenders: dict[str, str] | None = None):
        super().__init__(message)
        self.offenders = dict(offenders or {})


@dataclass
class AggregateResult:
    """Outcome of one aggregation round.

    Attributes:
        total: float64 (d,): Σ over survivors of weight_i * clip(x_i) (dequantised).
        weight: Σ over survivors of weight_i (dequantised for quantised kinds).
        survivors: clients whose input is in the sum (sorted).
        dropped: selected clients whose input is not, sorted.
        clip: clip range [-clip, clip] (math.inf for plain).
        scale: fixed-point scale (1.0 for plain).
        k_bits: ring Z_{2^k} (0 for plain).
        n_clipped: clipped coordinates summed over survivors (aggregated like the update, so for
            secagg the server learns only the total).
        dropped_at: client -> stage name where it was lost.
        offenders: client -> what it did wrong (secagg: invalid, duplicate or reused public keys or
            signature at AdvertiseKeys; shares not matching their dealer's commitments at Unmasking).
            An offender at AdvertiseKeys is also in ``dropped``; one at Unmasking may still be in
            ``survivors`` (its own input is unmasked from the others' shares); its shares were not used.
    """

    total: np.ndarray
    weight: float
    survivors: list[str]
    dropped: list[str]
    clip: float
    scale: float
    k_bits: int
    n_clipped: int
    dropped_at: dict[str, str] = field(default_factory=dict)
    offenders: dict[str, str] = field(default_factory=dict)

    @property
    def mean(self) -> np.ndarray:
        """total / weight, float64 (d,)."""
        return self.total / self.weight


def fail_message(stage: str, selected: Sequence[str], alive: Sequence[str], t: int,
                 dropped_at: dict[str, str], min_clients: int = 0) -> str:
    """The error text of a round that kept fewer than max(``t``, ``min_clients``) clients: the stage and
    who dropped where."""
    lost = ", ".join(f"{c} (at {s})" for c, s in sorted(dropped_at.items())) or "none"
    floor = f"the threshold t={t}" if t >= min_clients else f"min_clients={min_clients} (threshold t={t})"
    return (f"secure aggregation failed at stage {stage!r}: {len(alive)} of {len(selected)} selected clients "
            f"remain, fewer than {floor}; dropped: {lost}")
