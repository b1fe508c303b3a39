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
        threshold: t as an int, or a fraction in (1/2, 1] of the selected clients; None = ceil(2n/3).
            For n selected clients t must satisfy n/2 < t <= n (Bonawitz et al. Sec. 6: with a
            malicious server, t <= n/2 lets it show two halves of the clients different survivor sets
            and collect both shares of a victim); so n = 2 needs t = 2. A fraction <= 1/2 is refused
            when the config is built, an int when the threshold is resolved for n (ValueError naming
            threshold, n and the minimum).
        min_clients: the fewest clients whose inputs a secagg round may sum (>= 2, default 2): the
            sum of one client is that client's update. Checked at every stage on both sides: the
            server aborts below it, a client refuses to send its masked input when fewer than
            min_clients (itself included) advertised keys (U1) or shared (U2).
        clip: clip range c of each coordinate of x (before weighting).
        precision_bits: scale = 2**precision_bits.
        max_weight: largest weight a client may send (bounds k).
        consistency_check: Bonawitz's ConsistencyCheck round (Ed25519 signatures of the survivor set
            by keys inside the certificate-signed advertisement). On by default; turning it off makes
            the protocol secure against a semi-honest server only.
        stage_timeout_s: server wait per stage after the first.
        input_timeout_s: server wait for each client's first message (covers local training).
        seed: seed of stochastic rounding (None: OS randomness); same seed => same rounding.

    Raises:
        ValueError: an unknown kind, a threshold fraction not in (1/2, 1] or an int threshold < 2,
            min_clients < 2, bad clip / precision / timeouts (each names the field).
    """

    kind: Kind = "secagg"
    threshold: int | float | None = None
    clip: float = 1.0
    precision_bits: int = 16
    max_weight: float = float(1 << 20)
    consistency_check: bool = True
    min_clients: int = 2
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
        self._check_threshold_type()
        if isinstance(self.min_clients, bool) or not isinstance(self.min_clients, int) or self.min_clients < 2:
            raise ValueError(f"min_clients must be an int >= 2 (a sum of one client reveals its update), "
                             f"got {self.min_clients!r}")
        if self.stage_timeout_s <= 0 or self.input_timeout_s <= 0:
            raise ValueError(f"stage_timeout_s and input_timeout_s must be > 0, got {self.stage_timeout_s} "
                             f"and {self.input_timeout_s}")

    def _check_threshold_type(self) -> None:
        th = self.threshold
        if th is None:
            return
        if isinstance(th, bool) or not isinstance(th, (int, float)):
            raise ValueError(f"threshold must be an int count, a fraction in (1/2, 1] or None, got {th!r}")
        if isinstance(th, float) and not 0.5 < th <= 1:
            raise ValueError(f"threshold fraction must be in (1/2, 1] so that t > n/2 for every n, got {th}; "
                             f"give an int for a count")
        if isinstance(th, int) and th < 2:
            raise ValueError(f"threshold must be >= 2 (t > n/2 with n >= 2 clients), got {th}")

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
        """t for ``n`` selected clients; raises ValueError (naming threshold, n and the minimum) unless
        n/2 < t <= n."""
        th = self.threshold
        if th is None:
            t = math.ceil(2 * n / 3)
        elif isinstance(th, float):  # a fraction of the selected clients
            t = math.ceil(th * n)
        else:
            t = int(th)
        lowest = n // 2 + 1
        if not lowest <= t <= n:
            raise ValueError(f"threshold t={t} is invalid for n={n} selected clients: it must be in [{lowest}, {n}] "
                             f"(t > n/2, minimum {lowest}; Bonawitz et al. Sec. 6)")
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
