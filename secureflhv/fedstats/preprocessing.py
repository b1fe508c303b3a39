"""Federated preprocessing of a horizontal job: global statistics through secure aggregation.

Before training, every client and the server run this step once; it returns the same
:class:`~secureflhv.fedstats.statistics.FederatedStatistics` everywhere, from which each client builds the
same :class:`~secureflhv.data.tabular.Preprocessor` (mean / most-frequent imputation, one-hot over the
declared vocabularies, standardisation with the global mean and variance) and horizontal SecureBoost
takes its global feature ranges. The statistics, their exact-integer encoding, the range sketch and
the stated numeric error are in :mod:`secureflhv.fedstats.statistics`. Protocol (tags ``fpp.*``; the sums go
through the job's aggregation, :mod:`secureflhv.secagg`, Bonawitz et al. CCS 2017 by default)::

    clients -> server  fpp.hello: the column layout (names, declared vocabularies); all must agree
    aggregation        round A (aggregation round ``first_round``): row count, per column present /
                       missing counts, category counts, log-magnitude histogram (no histogram when the
                       ranges are public)
    server -> clients  fpp.ranges: the pooled round-A vector and the clients whose rows it holds
    aggregation        round B (``first_round + 1``, with ``moments``), over exactly those clients:
                       sum q, sum q^2 and clipped counts per numeric column
    server -> clients  fpp.stats: the pooled round-B vector

Round ids: aggregation rounds ``first_round`` (and ``first_round + 1``) must come before the job's own
aggregation rounds (horizontal FL starts at 8, horizontal SecureBoost at 1: it passes 0 and no
round B), as envelope rounds must increase per tag.

What each role learns: the server learns the column layout and the pooled sums of both rounds (see
:mod:`secureflhv.fedstats.statistics`: counts, category counts, the magnitude histogram, sum q and sum q^2)
and who took part; never one client's vector (with ``kind: secagg``; the plain kinds reveal each
vector). Clients learn the same pooled sums (they need them to build the same preprocessor).

Differential privacy (``dp``: :class:`~secureflhv.params.sum_privacy.SumDPParams`): every client adds its share
of integer Skellam noise to both rounds' vectors before masking (:mod:`secureflhv.fedstats.stats_privacy`: the
unit, the sensitivities, the plan); both rounds' pooled vectors are then noised, the statistics are
post-processed to stay valid, and every party's :class:`FederatedStatistics` carries the (ε, δ) record
(``privacy``). It needs public ``ranges`` (no range sketch).

Failures: a client whose layout differs from the others' stops the server with
:class:`FederatedStatsError` naming it (a clear "declare the same data.schema" message); fewer than t
clients in an aggregation is the aggregation's error (names who dropped where); a client that drops
in round A is left out of round B. A pooled vector from the server that is malformed (wrong shape,
non-integers, negative counts) is rejected by the client's parser.
"""
from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np

from .statistics import (AGG_CLIP, AGG_SCALE_BITS, Counts, FederatedStatistics, StatsError, StatsSpec,
                         decode_round_a, moment_bits, parse_columns_json, round_a_vector, round_b_vector)
from .stats_privacy import MIN_BITS, StatsDP
from ..params.sum_privacy import SumDPParams
from ..proto import messages_pb2
from ..secagg import AggregationConfig, AggregationError, make_client, make_server
from ..transport import ProtocolError, Transport, TransportError, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto
from ..transport.role import ProtocolRole

log = logging.getLogger("secureflhv.fedstats.preprocessing")
_MISSING_SIGMAS = 4.0   # DP: a column has missing cells when its noised missing count passes 4 noise std

TAG_HELLO, TAG_RANGES, TAG_STATS = "fpp.hello", "fpp.ranges", "fpp.stats"
MAX_LAYOUT_CHARS = 1 << 20


class FederatedStatsError(RuntimeError):
    """The federated statistics cannot be computed (clients disagree, too few clients, bad data)."""


def stats_aggregation_config(kind: str = "secagg", **overrides) -> AggregationConfig:
    """Aggregation settings under which integers below 2^52 are summed exactly (clip 2^12, scale 2^40,
    weight 1; see :mod:`secureflhv.fedstats.statistics`)."""
    cfg = dict(kind=kind, clip=AGG_CLIP, precision_bits=AGG_SCALE_BITS, max_weight=1.0)
    cfg.update(overrides)
    return AggregationConfig(**cfg)


def _encode(vec: np.ndarray) -> np.ndarray:
    return np.asarray(vec, dtype=np.float64) * 2.0 ** -AGG_SCALE_BITS


def _decode(total: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(total, dtype=np.float64) * 2.0 ** AGG_SCALE_BITS)


def _vector_parser(dim: int, what: str, integers: bool = True):
    """Parse a server's pooled vector: a float64 Tensor of shape (dim,), whole numbers."""
    def check(msg: messages_pb2.Bundle):
        if set(msg.tensors) != {"total"}:
            raise ProtocolError(f"{what}: expected one tensor 'total', got {sorted(msg.tensors)}")
        v = tensor_from_proto(msg.tensors["total"], what=what, shape=(dim,))
        if integers and (v != np.round(v)).any():
            raise ProtocolError(f"{what}: pooled statistics must be whole numbers")
        if np.abs(v).max(initial=0) >= 2.0 ** 62:
            raise ProtocolError(f"{what}: pooled statistics out of range")
        clients = [c for c in msg.text.get("clients", "").split(",") if c]
        return v, clients
    return parse_message(messages_pb2.Bundle, check)


def _stats_dp(spec: StatsSpec, config: AggregationConfig, dp: SumDPParams | None) -> StatsDP | None:
    """The run's noise plan (None without DP); FederatedStatsError for settings that do not fit."""
    if dp is None:
        return None
    try:
        return StatsDP.of(spec, config, delta=dp.delta, noise_multiplier=dp.noise_multiplier,
                          target_epsilon=dp.target_epsilon, noise_seed=dp.noise_seed)
    except ValueError as exc:   # StatsError included: no public ranges
        raise FederatedStatsError(f"differential privacy: {exc}") from None


def _with_privacy(out: FederatedStatistics, sdp: StatsDP, n_a: int, survivors_a: int, bits: int | None,
                  survivors_b: int) -> FederatedStatistics:
    """Attach the (ε, δ) record and the missing-count threshold (identical at every party). Round A had
    ``n_a`` participants, round B round A's survivors; ``bits`` None: no moments released."""
    try:
        out.privacy = sdp.account(out.spec, survivors_a, n_a, bits, survivors_b, survivors_a)
    except ValueError as exc:
        raise FederatedStatsError(f"differential privacy: {exc}") from None
    out.missing_threshold = _MISSING_SIGMAS * out.privacy["noise_std"]["counts"]
    return out


def _dp_bits(sdp: StatsDP, spec: StatsSpec, counts: Counts, n_a: int, n_b: int) -> int | None:
    """Round B's b under DP (None when no moments are released)."""
    if not (spec.moments and spec.numeric):
        return None
    try:
        return sdp.moment_bits(spec, counts.n_rows, n_a, n_b)
    except ValueError as exc:   # StatsError, or a threshold that n_b clients cannot meet
        raise FederatedStatsError(f"differential privacy: {exc}") from None


class FederatedStatsServer(ProtocolRole):
    """The data-less side: checks the layouts, runs the aggregations, sends the pooled sums back.

    Args:
        transport: the server's transport.
        client_ids: the job's clients (at least 2).
        aggregation: :func:`stats_aggregation_config` (its threshold: the job's).
        ranges: public (lo, hi) per numeric column (as :class:`StatsSpec`), or None.
        moments: run round B. The columns are the clients' agreed layout.
        first_round: aggregation round id of round A (see the module docstring).
        timeout_s: wait for each client's hello.
        dp: record-level DP of the sums (the same settings as the clients'), or None.
    """

    protocol = "federated preprocessing"

    def __init__(self, transport: Transport, client_ids: Sequence[str], aggregation: AggregationConfig, *,
                 ranges=None, moments: bool = True, first_round: int = 1, timeout_s: float = 600.0,
                 dp: SumDPParams | None = None):
        super().__init__(transport)
        self.client_ids = sorted(client_ids)
        if len(self.client_ids) < 2:
            raise ValueError("client_ids: federated statistics need at least two clients")
        self.ranges, self.moments, self.dp = ranges, moments, dp
        self.config, self.first_round, self.timeout_s = aggregation, first_round, timeout_s
        self.agg = make_server(transport, aggregation)
        self._active = list(self.client_ids)

    def _peers(self) -> list[str]:
        return self._active

    def run(self) -> FederatedStatistics:
        """Both rounds; returns the pooled statistics (also sent to the clients)."""
        return self._guarded(self._run)

    def _hello(self) -> StatsSpec:
        layouts = {}
        deadline = time.monotonic() + self.timeout_s   # one wait for all: absent clients do not add up
        for c in self.client_ids:
            try:
                layouts[c] = self.t.recv(c, TAG_HELLO, 0, timeout=max(deadline - time.monotonic(), 0.01),
                                         parse=parse_message(messages_pb2.Bundle, _layout_check))
            except TransportError as exc:
                log.warning("%s: no layout from %s (%s): left out", self.party_id, c, exc)
        if not layouts:
            raise FederatedStatsError("no client sent its column layout")
        first = next(iter(layouts.values()))
        differ = sorted(c for c, v in layouts.items() if v != first)
        if differ:
            raise FederatedStatsError(
                f"clients disagree on the feature columns: {differ} differ from {next(iter(layouts))} "
                f"({first[:200]}...): give every client the same data.schema (columns, categories)")
        self._active = sorted(layouts)
        try:
            names, vocab = parse_columns_json(first)
            return StatsSpec(names, vocab, self.ranges, self.moments)
        except StatsError as exc:
            raise FederatedStatsError(f"column layout: {exc}") from None

    def _aggregate(self, round_id: int, dim: int, what: str):
        try:
            res = self.agg.aggregate(round_id, self._active, dim)
        except (AggregationError, TransportError, ValueError) as exc:   # ValueError: t too high for those left
            raise FederatedStatsError(f"aggregation of {what} over {self._active} failed: {exc}") from exc
        if res.dropped:
            log.warning("%s: %s: clients %s dropped (%s)", self.party_id, what, res.dropped, res.dropped_at)
        if res.n_clipped:
            raise FederatedStatsError(f"{what}: {res.n_clipped} entries exceeded the exact-integer range")
        self._active = list(res.survivors)
        return _decode(res.total)

    def _send(self, tag: str, total: np.ndarray) -> None:
        msg = messages_pb2.Bundle(tensors={"total": tensor_to_proto(total, "<f8")},
                                  text={"clients": ",".join(self._active)})
        for c in list(self._active):
            try:
                self.t.send(c, tag, msg, round=self.first_round)
            except TransportError as exc:
                log.warning("%s: could not send %s to %s: %s", self.party_id, tag, c, exc)

    def _run(self) -> FederatedStatistics:
        spec = self._hello()
        sdp = _stats_dp(spec, self.config, self.dp)
        total_a = self._aggregate(self.first_round, spec.dim_a, "round A (counts)")
        counts = decode_round_a(total_a, spec, noisy=sdp is not None)
        self._send(TAG_RANGES, total_a)
        out = FederatedStatistics(spec, counts, participants=list(self._active))
        n_a, n_b = len(self.client_ids), len(self._active)
        bits = None if sdp is None else _dp_bits(sdp, spec, counts, n_a, n_b)
        if spec.moments:
            # DP without numeric columns: round B is empty, any b will do
            out.bits = bits if bits is not None else MIN_BITS if sdp is not None else moment_bits(counts.n_rows)
            before = list(self._active)
            total_b = self._aggregate(self.first_round + 1, spec.dim_b, "round B (moments)")
            if self._active != before:
                raise FederatedStatsError(f"clients {sorted(set(before) - set(self._active))} dropped between "
                                          f"round A and round B: the counts and moments would cover different rows")
            out.moments = total_b.astype(np.int64).reshape(-1, 3)
            self._send(TAG_STATS, total_b)
        if sdp is not None:
            _with_privacy(out, sdp, n_a, n_b, bits, len(self._active))
        log.info("%s: federated statistics of %d rows from %s", self.party_id, counts.n_rows, out.participants)
        return out


def _layout_check(msg: messages_pb2.Bundle) -> str:
    text = msg.text.get("columns", "")
    if not text or len(text) > MAX_LAYOUT_CHARS:
        raise ProtocolError(f"column layout missing or longer than {MAX_LAYOUT_CHARS} characters")
    try:
        parse_columns_json(text)
    except StatsError as exc:
        raise ProtocolError(str(exc)) from None
    return text


class FederatedStatsClient(ProtocolRole):
    """A client's side: announces its columns, contributes its integer statistics, gets the pooled sums.

    Args:
        transport: this client's transport.
        server_id: the server.
        client_ids: every client of the job (the aggregation participants of round A).
        spec: the columns of this client's table (and the ranges / moments settings; same everywhere).
        aggregation: :func:`stats_aggregation_config` (the same as the server's).
        first_round: aggregation round id of round A.
        dp: record-level DP of the sums (the same settings as the server's), or None.
    """

    protocol = "federated preprocessing"

    def __init__(self, transport: Transport, server_id: str, client_ids: Sequence[str], spec: StatsSpec,
                 aggregation: AggregationConfig, *, first_round: int = 1, dp: SumDPParams | None = None):
        super().__init__(transport)
        self.server_id, self.client_ids, self.spec = server_id, sorted(client_ids), spec
        self.first_round, self.config = first_round, aggregation
        self.sdp = _stats_dp(spec, aggregation, dp)   # refused before anything is sent
        self.agg = make_client(transport, server_id, aggregation)
        self.timeout = aggregation.client_timeout_s

    def _peers(self) -> list[str]:
        return []   # a failing client is a dropout (the server goes on while t clients remain)

    def _abort_message(self, exc: BaseException) -> None:
        log.warning("%s: leaving federated preprocessing: %s: %s", self.party_id, type(exc).__name__, exc)
        return None

    def run(self, X: np.ndarray) -> FederatedStatistics:
        """Contribute ``X`` (rows, columns; NaN = missing; categorical codes); return the pooled statistics.

        Raises StatsError for a table that does not fit the spec (before anything is sent),
        AggregationError / TransportError when the rounds fail.
        """
        return self._guarded(self._run, X)

    def _run(self, X) -> FederatedStatistics:
        spec, sdp, n_a, me = self.spec, self.sdp, len(self.client_ids), self.party_id
        vec_a = round_a_vector(X, spec)              # checks the table before anything is sent
        self.t.send(self.server_id, TAG_HELLO, messages_pb2.Bundle(text={"columns": spec.columns_json()}),
                    round=0)
        sent_a = vec_a if sdp is None else sdp.noised_a(vec_a, spec, n_a, self.first_round, me)
        self.agg.submit(self.first_round, self.client_ids, _encode(sent_a), 1.0)
        total_a, clients = self.t.recv_while_reachable(self.server_id, TAG_RANGES, self.first_round,
                                                       timeout=self.timeout, parse=_vector_parser(spec.dim_a, "fpp.ranges"))
        try:
            counts: Counts = decode_round_a(total_a, spec, noisy=sdp is not None)
            bits = moment_bits(counts.n_rows) if sdp is None else MIN_BITS   # DP: _dp_bits below
        except StatsError as exc:
            raise ProtocolError(f"fpp.ranges from the server: {exc}") from None
        # under DP the noised row count may fall below this client's own, by its noise's reach at most
        slack = 0.0 if sdp is None else sdp.count_slack(spec, n_a)
        if me not in clients or not set(clients) <= set(self.client_ids) or len(clients) < 2 \
                or counts.n_rows + slack < vec_a[0]:
            raise FederatedStatsError(f"{me}: the server's round A ({counts.n_rows} rows, clients "
                                      f"{clients}) does not hold this client's rows")
        out = FederatedStatistics(spec, counts, participants=clients)
        dp_bits = None if sdp is None else _dp_bits(sdp, spec, counts, n_a, len(clients))
        clients_b = clients
        if spec.moments:
            out.bits = bits if dp_bits is None else dp_bits
            out.moments, clients_b = self._round_b(X, counts, clients, out.bits, dp_bits is not None)
        if sdp is not None:
            _with_privacy(out, sdp, n_a, len(clients), dp_bits, len(clients_b))
        return out

    def _round_b(self, X, counts: Counts, clients: list[str], bits: int, noised: bool) -> tuple[np.ndarray, list[str]]:
        """Round B: this client's (``noised``) moments in, the pooled moments (int64 (m, 3)) and the clients out."""
        spec = self.spec
        vec = round_b_vector(X, spec, counts, bits)
        if noised:
            vec = self.sdp.noised_b(vec, spec, bits, len(clients), self.first_round + 1, self.party_id)
        self.agg.submit(self.first_round + 1, clients, _encode(vec), 1.0)
        total_b, clients_b = self.t.recv_while_reachable(self.server_id, TAG_STATS, self.first_round,
                                                         timeout=self.timeout,
                                                         parse=_vector_parser(spec.dim_b, "fpp.stats"))
        return total_b.astype(np.int64).reshape(-1, 3), clients_b
