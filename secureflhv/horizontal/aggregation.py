"""The aggregation interface between horizontal FL algorithms and (secure) aggregation.

Each round the FL server selects clients (``participants``); every selected client calls
:meth:`AggregationClient.submit` with its update ``x`` (float, (d,)) and a weight ``w`` (e.g. its
number of samples), and the server calls :meth:`AggregationServer.aggregate`, which returns
:class:`AggregateResult` with ``total = Σ w_i x_i`` and ``weight = Σ w_i`` over the survivors.

Kinds (``AggregationConfig.kind``):

* ``"plain"`` — baseline: each client sends ``w * x`` (float64) and ``w``. **The server sees every
  client's update.** No clipping, no quantisation (``clip = inf``, ``scale = 1``, ``k_bits = 0``).
* ``"plain_quantised"`` — the exact quantisation of secure aggregation (clip to [-c, c], scale,
  seeded stochastic rounding into Z_{2^k}, see :mod:`secureflhv.crypto.quantise`) but no masks: the
  server sees every client's quantised update. With the same ``seed`` it gives bit-for-bit the same
  result as ``"secagg"`` (used by tests).
* ``"secagg"`` — Bonawitz et al., CCS 2017 (:mod:`secureflhv.horizontal.secagg`): the server learns
  only the sum over survivors (plus who survived and the total clipped count), even when clients
  drop out at any stage, as long as at least ``t`` remain.

Threshold ``t``: ``config.threshold`` as an absolute count, or a fraction of the selected clients,
default ``ceil(2n/3)``. Fewer than ``t`` survivors raises :class:`AggregationError` naming who dropped
at which stage, for every kind (so the kinds are interchangeable in tests).

Timeouts: the server waits ``input_timeout_s`` for the first message of each client (it covers the
clients' local training), then ``stage_timeout_s`` per later stage; a client silent past the
deadline is counted as dropped at that stage. Clients wait for the server up to
``input_timeout_s + 5 * stage_timeout_s``.

Transport tags start with ``"agg."``; envelope rounds are ``round_id * 16 + stage``, so round ids
must strictly increase from one call to the next (the transport rejects stale rounds).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import numpy as np

from ..crypto.quantise import EXTRA_COORDS, QuantParams, choose_k_bits, dequantise, quantise, rounding_rng
from ..proto import secagg_pb2
from ..transport.base import PeerTimeout, PeerUnavailable, ProtocolError, TransportError, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto

log = logging.getLogger("secureflhv.horizontal.aggregation")

Kind = Literal["secagg", "plain", "plain_quantised"]
KINDS = ("secagg", "plain", "plain_quantised")
STAGES = 16  # envelope round = round_id * STAGES + stage

TAG_PLAIN = "agg.plain"
TAG_SERVER = "agg.server"


class AggregationError(RuntimeError):
    """The round cannot produce a correct sum (fewer than t survivors, protocol violation, ...)."""


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

    @property
    def mean(self) -> np.ndarray:
        """total / weight, float64 (d,)."""
        return self.total / self.weight


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
            raise ValueError("stage_timeout_s and input_timeout_s must be > 0")

    @property
    def scale(self) -> float:
        return float(2 ** self.precision_bits)

    @property
    def client_timeout_s(self) -> float:
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
        k = choose_k_bits(n_clients, dim, self.clip, self.scale, self.max_weight)
        return QuantParams(self.clip, self.scale, self.max_weight, k)


# ---------------------------------------------------------------------------------- helpers
def check_participants(participants: Sequence[str], me: str | None = None) -> list[str]:
    parts = [str(p) for p in participants]
    if len(set(parts)) != len(parts):
        raise ValueError(f"participants contain duplicates: {parts}")
    if me is not None and me not in parts:
        raise ValueError(f"{me!r} is not among this round's participants {parts}")
    return sorted(parts)


def collect(transport, senders: Sequence[str], tag: str, round: int, timeout: float,
            parse: Callable[[bytes], object]) -> dict[str, object]:
    """Receive ``tag``/``round`` from each sender within one shared deadline; missing ones are omitted."""
    deadline = time.monotonic() + timeout
    got: dict[str, object] = {}
    for s in senders:
        try:
            got[s] = transport.recv(s, tag, round, timeout=max(deadline - time.monotonic(), 0.001), parse=parse)
        except PeerTimeout:
            log.warning("%s: no valid %r (round %d) from %s within the stage deadline: counted as dropped",
                        transport.party_id, tag, round, s)
    return got


def send_all(transport, receivers: Sequence[str], tag: str, round: int, payloads, timeout: float) -> list[str]:
    """Send to each receiver (``payloads`` is one message or a dict); return those that failed."""
    failed = []
    for r in receivers:
        msg = payloads[r] if isinstance(payloads, dict) else payloads
        try:
            transport.send(r, tag, msg, round=round, timeout=timeout)
        except (PeerUnavailable, TransportError) as exc:
            log.warning("%s: could not send %r to %s: %s: counted as dropped", transport.party_id, tag, r, exc)
            failed.append(r)
    return failed


def fail_message(stage: str, selected: Sequence[str], alive: Sequence[str], t: int,
                 dropped_at: dict[str, str]) -> str:
    lost = ", ".join(f"{c} (at {s})" for c, s in sorted(dropped_at.items())) or "none"
    return (f"secure aggregation failed at stage {stage!r}: {len(alive)} of {len(selected)} selected clients "
            f"remain, fewer than the threshold t={t}; dropped: {lost}")


def _round_check(msg, round_id: int, what: str):
    if msg.round_id != round_id:
        raise ProtocolError(f"{what}: payload is for round {msg.round_id}, expected {round_id} (replay?)")


# ---------------------------------------------------------------------------------- base classes
class AggregationClient(ABC):
    """Client half; ``submit`` blocks until this client's part of the round ends.

    Args:
        transport: this client's transport.
        server_id: party id of the aggregation server.
        config: shared settings.
    """

    def __init__(self, transport, server_id: str, config: AggregationConfig):
        self.transport = transport
        self.server_id = server_id
        self.config = config
        self.client_id = transport.party_id
        self.last_n_clipped = 0

    @abstractmethod
    def submit(self, round_id: int, participants: Sequence[str], vector: np.ndarray, weight: float) -> None:
        """Contribute ``weight * vector`` to round ``round_id``; returns when this client's part is done."""


class AggregationServer(ABC):
    """Server half; ``aggregate`` returns the sum over survivors or raises :class:`AggregationError`."""

    def __init__(self, transport, config: AggregationConfig):
        self.transport = transport
        self.config = config

    @abstractmethod
    def aggregate(self, round_id: int, participants: Sequence[str], dim: int) -> AggregateResult:
        """Run round ``round_id`` with ``participants``; return the sum over the survivors."""

    def _log_result(self, round_id: int, res: AggregateResult) -> None:
        log.info("aggregation round %d (%s): %d survivors, dropped %s; clip=%g scale=%g k=%d clipped=%d",
                 round_id, self.config.kind, len(res.survivors), res.dropped or "none", res.clip, res.scale,
                 res.k_bits, res.n_clipped)


# ---------------------------------------------------------------------------------- plain kinds
class PlainClient(AggregationClient):
    """``plain`` and ``plain_quantised`` clients: one message to the server, no protection."""

    def submit(self, round_id, participants, vector, weight):
        parts = check_participants(participants, self.client_id)
        x = np.asarray(vector, dtype=np.float64).ravel()
        if self.config.kind == "plain":
            if not (weight > 0 and math.isfinite(weight)):
                raise ValueError(f"{self.client_id}: weight must be positive and finite, got {weight}")
            msg = secagg_pb2.PlainInput(round_id=round_id, vector=tensor_to_proto(weight * x), weight=float(weight))
        else:
            qp = self.config.quant_params(len(parts), x.size)
            words, self.last_n_clipped = quantise(x, weight, qp, rounding_rng(self.config.seed, round_id,
                                                                             self.client_id), self.client_id)
            msg = secagg_pb2.PlainInput(round_id=round_id, vector=tensor_to_proto(words.astype(qp.word_dtype)),
                                        k_bits=qp.k_bits)
        self.transport.send(self.server_id, TAG_PLAIN, msg, round=round_id * STAGES,
                            timeout=self.config.client_timeout_s)


class PlainServer(AggregationServer):
    def aggregate(self, round_id, participants, dim):
        parts = check_participants(participants)
        cfg = self.config
        t = cfg.resolve_threshold(len(parts))
        quantised = cfg.kind == "plain_quantised"
        qp = cfg.quant_params(len(parts), dim) if quantised else None

        def validate(msg):
            _round_check(msg, round_id, "plain input")
            if quantised:
                if msg.k_bits != qp.k_bits:
                    raise ProtocolError(f"k_bits {msg.k_bits}, expected {qp.k_bits}")
                return tensor_from_proto(msg.vector, dtype=qp.word_dtype.str, shape=(dim + EXTRA_COORDS,), what="quantised input")
            if not (msg.weight > 0 and math.isfinite(msg.weight)):
                raise ProtocolError(f"weight {msg.weight} not positive and finite")
            v = tensor_from_proto(msg.vector, dtype="<f8", shape=(dim,), what="plain input")
            if not np.all(np.isfinite(v)):
                raise ProtocolError("plain input has non-finite values")
            return v, msg.weight

        got = collect(self.transport, parts, TAG_PLAIN, round_id * STAGES, cfg.input_timeout_s,
                      parse_message(secagg_pb2.PlainInput, validate))
        survivors = sorted(got)
        dropped_at = {c: "input" for c in parts if c not in got}
        if len(survivors) < t:
            raise AggregationError(fail_message("input", parts, survivors, t, dropped_at))
        if quantised:
            acc = np.zeros(dim + EXTRA_COORDS, dtype=np.uint64)
            for c in survivors:
                acc += got[c]
            total, weight, n_clipped = dequantise(acc & qp.modulus_mask, qp)
            res = AggregateResult(total, weight, survivors, sorted(dropped_at), cfg.clip, cfg.scale, qp.k_bits,
                                  n_clipped, dropped_at)
        else:
            total = np.zeros(dim, dtype=np.float64)
            weight = 0.0
            for c in survivors:
                total += got[c][0]
                weight += got[c][1]
            res = AggregateResult(total, weight, survivors, sorted(dropped_at), math.inf, 1.0, 0, 0, dropped_at)
        self._log_result(round_id, res)
        return res


def make_aggregation(config: AggregationConfig) -> tuple[type[AggregationClient], type[AggregationServer]]:
    """(client class, server class) for ``config.kind``; both take the constructor arguments above."""
    if config.kind in ("plain", "plain_quantised"):
        return PlainClient, PlainServer
    from .secagg import SecAggClient, SecAggServer  # noqa: PLC0415 - avoids a cycle
    return SecAggClient, SecAggServer


def make_client(transport, server_id: str, config: AggregationConfig) -> AggregationClient:
    return make_aggregation(config)[0](transport, server_id, config)


def make_server(transport, config: AggregationConfig) -> AggregationServer:
    return make_aggregation(config)[1](transport, config)
