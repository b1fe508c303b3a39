"""Settings of the aggregation layer: :class:`AggregationConfig` (identical at the server and every client).

A pydantic model: the job file's ``params.aggregation`` (:class:`secureflhv.params.AggregationParams`) plus
what the job supplies; a library call gets the same validation, and an :class:`AggregationConfigError`
names the field it refuses.
"""
from __future__ import annotations

import math
from typing import Any

from pydantic import Field, ValidationError, field_validator

from ..crypto.quantise import QuantParams, choose_k_bits
from ..params.aggregation import KINDS, AggregationParams, Kind

__all__ = ["AggregationConfig", "AggregationConfigError", "KINDS", "Kind"]


class AggregationConfigError(ValueError):
    """A refused aggregation setting; ``field`` names it (``threshold``, ``min_clients``, ...), ``str()`` is
    the reason (which starts with the field's name where the field alone is at fault)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field

    @classmethod
    def of(cls, err: ValidationError) -> "AggregationConfigError":
        """The first problem of a pydantic error on :class:`AggregationConfig`."""
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "aggregation"
        msg = first["msg"].removeprefix("Value error, ")
        return cls(field, msg if first["type"] == "value_error" else f"{field}: {msg}")


class AggregationConfig(AggregationParams):
    """Settings of the aggregation layer (identical at the server and every client).

    Attributes (besides those of :class:`~secureflhv.params.AggregationParams`):
        kind: "secagg" | "plain" | "plain_quantised".
        threshold: t as an int, or a fraction in (1/2, 1] of the selected clients; None = the smallest
            t that tolerates ``max_colluders``: floor((n + c) / 2) + 1. For n selected clients t must
            satisfy (n + c)/2 < t <= n, i.e. n_C < 2t − n (Bonawitz et al. 2017, Thm 6.5: with a
            malicious server, a smaller t lets it show two groups of clients different survivor sets and
            collect both kinds of share of a victim, the colluders giving both). A fraction <= 1/2 is
            refused when the config is built, a t too low for n and c when it is resolved for n
            (naming threshold, n, max_colluders and the minimum).
        max_colluders: c, the number of clients the job tolerates colluding with a malicious server.
            t is derived from it; a round must also keep at least 2 inputs of non-colluding clients in
            the sum (n >= c + 2), or the sum itself reveals one client's update.
        min_clients: the fewest clients whose inputs a round may sum (>= 2). Checked at every stage on
            both sides: the server aborts below it, a client refuses to send its masked input when fewer
            than min_clients (itself included) advertised keys (U1) or shared (U2). 2 is an explicit
            opt-in (with ``max_colluders: 0``): in a two-client round each client learns the other's
            update by subtracting its own from the sum.
        job_clients: the job's client ids, from the job file every party validated (empty: not
            known, e.g. a library call without a job). A client refuses a participant list naming
            anyone outside it; with or without it, a list naming the aggregation server, or a
            duplicate, is refused (:func:`~secureflhv.secagg.exchange.check_round`).
        zero_weight_ok: whether Σw = 0 is a valid (empty) sum, e.g. an IFCA cluster nobody chose; else
            the server refuses a round whose total weight is not positive (:mod:`.bounds`).
        clip: clip range c of each coordinate of x (before weighting).
        precision_bits: scale = 2**precision_bits.
        max_weight: largest weight a client may send (bounds k).
        consistency_check: Bonawitz's ConsistencyCheck round (Ed25519 signatures of the survivor set
            by keys inside the certificate-signed advertisement). Turning it off makes the protocol
            secure against a semi-honest server only.
        stage_timeout_s: server wait per stage after the first.
        input_timeout_s: server wait for each client's first message (covers local training).
        seed: seed of stochastic rounding (None: OS randomness); same seed => same rounding.
        ring_bits: k of a fixed ring Z_{2^k} for inputs that are already integers (distributed DP's encoded
            words, :mod:`secureflhv.dp.mechanisms`), None = quantise floats as above. Each input must be a signed
            integer vector in [-2^(k-1), 2^(k-1)) submitted with weight 1; ``clip``, ``precision_bits`` and
            ``max_weight`` are then not used (clip 2^(k-1), scale 1, max weight 1), the sum is taken mod 2^k
            and may wrap (the encoder sizes k so that it does so only with negligible probability), and the
            server's per-coordinate range check is the caller's (its bound covers the whole ring). In [2, 53]:
            float64 carries such integers exactly.

    Raises:
        AggregationConfigError (a ValueError): an unknown kind, a threshold fraction not in (1/2, 1] or
            an int threshold < 2, min_clients < 2, max_colluders < 0, bad clip / precision / timeouts,
            duplicate job_clients (``field`` names it).
    """

    job_clients: tuple[str, ...] = ()
    zero_weight_ok: bool = False
    input_timeout_s: float = 600.0
    ring_bits: int | None = Field(default=None, ge=2, le=53)

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise AggregationConfigError.of(err) from None

    @field_validator("job_clients", mode="before")
    @classmethod
    def _distinct_clients(cls, v):
        ids = tuple(str(c) for c in v)
        if len(set(ids)) != len(ids):
            raise ValueError(f"job_clients has duplicates: {list(ids)}")
        return ids

    def replace(self, **changes: Any) -> "AggregationConfig":
        """A copy with ``changes`` applied and validated again (AggregationConfigError as the constructor)."""
        return type(self)(**{**self.model_dump(), **changes})

    @property
    def scale(self) -> float:
        """The fixed-point scale ``2**precision_bits``: a coordinate x is quantised to an integer near x * scale."""
        return float(2 ** self.precision_bits)

    @property
    def client_timeout_s(self) -> float:
        """The longest a client waits for the server's next message: the server's ``input_timeout_s`` plus
        5 * ``stage_timeout_s`` (the server's later stages), so a client outwaits a slow round. The wait is
        cut short when the server cannot be reached (``Transport.recv_while_reachable``); sends are bounded
        by the job deadline."""
        return self.input_timeout_s + 5 * self.stage_timeout_s

    def lowest_threshold(self, n: int) -> int:
        """The smallest t with n_C < 2t − n for n clients and n_C = ``max_colluders``: floor((n + c)/2) + 1."""
        return (n + self.max_colluders) // 2 + 1

    def smallest_round(self) -> int:
        """The fewest clients a round may select: ``min_clients``, and ``max_colluders`` + 2 (so that at
        least two non-colluding inputs are in the sum)."""
        return max(self.min_clients, self.max_colluders + 2)

    def resolve_threshold(self, n: int) -> int:
        """t for ``n`` selected clients (Bonawitz et al. 2017, Thm 6.5: n_C < 2t − n).

        Raises:
            AggregationConfigError: n below :meth:`smallest_round` (field ``min_clients``), or an explicit
                threshold outside [floor((n + c)/2) + 1, n] (field ``threshold``; the message names n,
                max_colluders and the minimum).
        """
        c = self.max_colluders
        if n < self.smallest_round():
            raise AggregationConfigError(
                "min_clients", f"a round of n={n} clients is too small: at least {self.smallest_round()} are needed "
                                 f"(min_clients={self.min_clients}; with max_colluders={c} a server and {c} colluding "
                                 f"client(s) must still face at least 2 other inputs, or the sum reveals one of them)")
        th = self.threshold
        lowest = self.lowest_threshold(n)
        if th is None:
            return lowest
        t = math.ceil(th * n) if isinstance(th, float) else int(th)  # a fraction of the selected clients, or t
        if not lowest <= t <= n:
            raise AggregationConfigError(
                "threshold", f"threshold t={t} is invalid for n={n} selected clients and max_colluders={c}: it must "
                               f"be in [{lowest}, {n}] (n_C < 2t − n, Bonawitz et al. 2017 Thm 6.5)")
        return t

    def quant_params(self, n_clients: int, dim: int) -> QuantParams:
        """Quantisation settings (clip, scale, max_weight, k bits) for ``n_clients`` vectors of length ``dim``.

        k is the smallest word size whose sum of ``n_clients`` weighted, clipped inputs cannot wrap
        (:func:`~secureflhv.crypto.quantise.choose_k_bits`); identical at every party.

        Raises:
            ValueError: k would exceed the word size (lower ``precision_bits`` or ``max_weight``).
        """
        if self.ring_bits is not None:  # integer inputs in a fixed ring: SR(v * 1) = v, nothing is clipped
            return QuantParams(float(1 << (self.ring_bits - 1)), 1.0, 1.0, self.ring_bits)
        k = choose_k_bits(n_clients, dim, self.clip, self.scale, self.max_weight)
        return QuantParams(self.clip, self.scale, self.max_weight, k)
