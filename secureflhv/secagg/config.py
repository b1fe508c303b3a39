"""Settings of the aggregation layer: :class:`AggregationConfig` (identical at the server and every client)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..crypto.quantise import QuantParams, choose_k_bits

Kind = Literal["secagg", "plain", "plain_quantised"]
KINDS = ("secagg", "plain", "plain_quantised")


@dataclass(frozen=True)
class AggregationConfig:
    """Settings of the aggregation layer (identical at the server and every client).

    Attributes:
        kind: "secagg" | "plain" | "plain_quantised".
        threshold: t as an int, or a fraction in (0, 1] of the selected clients; None = ceil(2n/3).
        clip: clip range c of each coordinate of x (before weighting).
        precision_bits: scale = 2**precision_bits.
        max_weight: largest weight a client may send (bounds k).
        consistency_check: Bonawitz's ConsistencyCheck round (Ed25519 signatures of the survivor set).
        stage_timeout_s: server wait per stage after the first.
        input_timeout_s: server wait for each client's first message (covers local training).
        seed: seed of stochastic rounding (None: OS randomness); same seed => same rounding.
    """

    kind: Kind = "secagg"
    threshold: int | float | None = None
    clip: float = 1.0
    precision_bits: int = 16
    max_weight: float = float(1 << 20)
    consistency_check: bool = False
    stage_timeout_s: float = 30.0
    input_timeout_s: float = 600.0
    seed: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"aggregation kind {self.kind!r} unknown; choose one of {KINDS}")
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError(f"clip must be positive and finite, got {self.clip}")
        if not 0 <= self.precision_bits <= 40:
            raise ValueError(f"precision_bits must be in [0, 40], got {self.precision_bits}")
        if self.stage_timeout_s <= 0 or self.input_timeout_s <= 0:
            raise ValueError(f"stage_timeout_s and input_timeout_s must be > 0, got {self.stage_timeout_s} "
                             f"and {self.input_timeout_s}")

    @property
    def scale(self) -> float:
        """The fixed-point scale ``2**precision_bits``: a coordinate x is quantised to an integer near x * scale."""
        return float(2 ** self.precision_bits)

    @property
    def client_timeout_s(self) -> float:
        """A client's timeout for each send to / receive from the server: the server's ``input_timeout_s``
        plus 5 * ``stage_timeout_s`` (the server's later stages), so a client outwaits a slow round."""
        return self.input_timeout_s + 5 * self.stage_timeout_s

    def resolve_threshold(self, n: int) -> int:
        """t for ``n`` selected clients; raises ValueError when not in [1, n]."""
        th = self.threshold
        if th is None:
            t = math.ceil(2 * n / 3)
        elif isinstance(th, float):  # a fraction of the selected clients
            if not 0 < th <= 1:
                raise ValueError(f"threshold fraction must be in (0, 1], got {th}; give an int for a count")
            t = math.ceil(th * n)
        else:
            t = int(th)
        if not 1 <= t <= n:
            raise ValueError(f"threshold t={t} must be in [1, {n}] for {n} selected clients")
        return t

    def quant_params(self, n_clients: int, dim: int) -> QuantParams:
        """Quantisation settings (clip, scale, max_weight, k bits) for ``n_clients`` vectors of length ``dim``.

        k is the smallest word size whose sum of ``n_clients`` weighted, clipped inputs cannot wrap
        (:func:`~secureflhv.crypto.quantise.choose_k_bits`); identical at every party.

        Raises:
            ValueError: k would exceed the word size (lower ``precision_bits`` or ``max_weight``).
        """
        k = choose_k_bits(n_clients, dim, self.clip, self.scale, self.max_weight)
        return QuantParams(self.clip, self.scale, self.max_weight, k)
