"""The unprotected kinds: ``plain`` (the server sees every weighted update) and ``plain_quantised``
(the exact quantisation of secure aggregation, no masks: bit-for-bit the result of ``secagg`` with the
same seed; used by tests). One ``agg.plain`` message (``secagg_pb2.PlainInput``) per client and round.
"""
from __future__ import annotations

import math

import numpy as np

from ..crypto.quantise import EXTRA_COORDS, dequantise
from ..proto import secagg_pb2
from ..transport.base import ProtocolError, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto
from .bounds import check_each, check_sum
from .exchange import TAG_PLAIN, check_round, collect, envelope_round, round_check
from .result import AggregateResult, AggregationError, OutOfRangeRound, fail_message
from .roles import AggregationClient, AggregationServer


class PlainClient(AggregationClient):
    """``plain`` and ``plain_quantised`` clients: one message to the server, no protection."""

    def submit(self, round_id, participants, vector, weight):
        """Send ``weight * vector`` and ``weight`` in the clear (``plain``), or the quantised words of secure
        aggregation without masks (``plain_quantised``). Raises ValueError on a negative or non-finite weight
        (``plain``), and as :func:`~.exchange.check_round` on a participant list the job does not allow.
        """
        parts, _ = check_round(participants, self.config, me=self.party_id, server_id=self.server_id)
        x = np.asarray(vector, dtype=np.float64).ravel()
        if self.config.kind == "plain":
            if not (weight >= 0 and math.isfinite(weight)):
                raise ValueError(f"{self.party_id}: weight must be non-negative and finite, got {weight}")
            msg = secagg_pb2.PlainInput(round_id=round_id, vector=tensor_to_proto(weight * x), weight=float(weight))
        else:
            qp = self.config.quant_params(len(parts), x.size)
            words = self._encode(x, weight, qp, round_id)
            msg = secagg_pb2.PlainInput(round_id=round_id, vector=tensor_to_proto(words.astype(qp.word_dtype)),
                                        k_bits=qp.k_bits)
        self.t.send(self.server_id, TAG_PLAIN, msg, round=envelope_round(round_id, 0))


class PlainServer(AggregationServer):
    """Sums the clients' ``PlainInput`` messages (float64 or words mod 2^k) over the survivors."""

    def aggregate(self, round_id, participants, dim):
        """The sum over the clients whose input arrived (float64 (dim,), or dequantised). Raises AggregationError
        below the threshold, OutOfRangeRound on a weight above ``max_weight``, a non-positive total weight
        (unless ``zero_weight_ok``) or quantised words out of range.
        """
        cfg = self.config
        parts, t = check_round(participants, cfg, server_id=self.party_id)
        qp = cfg.quant_params(len(parts), dim) if cfg.kind == "plain_quantised" else None
        got = collect(self.t, parts, TAG_PLAIN, envelope_round(round_id, 0), cfg.input_timeout_s,
                      parse_message(secagg_pb2.PlainInput, lambda msg: self._validate(msg, round_id, dim, qp)))
        survivors = sorted(got)
        dropped_at = {c: "input" for c in parts if c not in got}
        if len(survivors) < t:
            raise AggregationError(fail_message("input", parts, survivors, t, dropped_at))
        if qp is not None:
            check_each({c: got[c] for c in survivors}, qp, round_id)
            acc = np.zeros(dim + EXTRA_COORDS, dtype=np.uint64)
            for c in survivors:
                acc += got[c]
            acc &= qp.modulus_mask
            check_sum(acc, qp, len(survivors), round_id, zero_weight_ok=cfg.zero_weight_ok)
            total, weight, n_clipped = dequantise(acc, qp)
            res = AggregateResult(total, weight, survivors, sorted(dropped_at), qp.clip, qp.scale, qp.k_bits,
                                  n_clipped, dropped_at)
        else:
            total = np.zeros(dim, dtype=np.float64)
            weight = 0.0
            heavy = {c: f"weight {got[c][1]:g} > max_weight={cfg.max_weight:g}" for c in survivors
                     if got[c][1] > cfg.max_weight}
            if heavy:
                raise OutOfRangeRound(f"round {round_id}: out-of-range input from {sorted(heavy)}, refused: {heavy}",
                                      heavy)
            for vec, w in (got[c] for c in survivors):
                total += vec
                weight += w
            if not weight > 0 and not cfg.zero_weight_ok:
                raise OutOfRangeRound(f"round {round_id}: total weight {weight:g} of {survivors} is not positive, "
                                      f"refused")
            res = AggregateResult(total, weight, survivors, sorted(dropped_at), math.inf, 1.0, 0, 0, dropped_at)
        self._log_result(round_id, res)
        return res

    @staticmethod
    def _validate(msg, round_id: int, dim: int, qp):
        """The words (plain_quantised, ``qp`` given) or (w * x, w) (plain) of one input; ProtocolError if bad."""
        round_check(msg, round_id, "plain input")
        if qp is not None:
            if msg.k_bits != qp.k_bits:
                raise ProtocolError(f"k_bits {msg.k_bits}, expected {qp.k_bits}")
            return tensor_from_proto(msg.vector, dtype=qp.word_dtype.str, shape=(dim + EXTRA_COORDS,),
                                     what="quantised input")
        if not (msg.weight >= 0 and math.isfinite(msg.weight)):
            raise ProtocolError(f"weight {msg.weight} not non-negative and finite")
        v = tensor_from_proto(msg.vector, dtype="<f8", shape=(dim,), what="plain input")
        if not np.all(np.isfinite(v)):
            raise ProtocolError("plain input has non-finite values")
        return v, msg.weight
