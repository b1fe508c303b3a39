"""Client contribution normalisation (Kundalwal, Saraswat, Mishra, Mishra, "Client Contribution
Normalization for Enhanced Federated Learning", 2024, Alg. 1, eqs. 3–8), computed under secure aggregation.

The paper, per round, over the n clients r of the round:

* z_r: client r's mean latent representation — the mean, over its training rows, of the last hidden
  layer of its locally trained model (here: the input of the model's last ``nn.Linear``; 8 values
  for NIID-Bench's MLP, 84 for the simple CNN);
* S(q, p) = cos(z_q, z_p), the cosine-similarity matrix, and s_r = Σ_p S(r, p);
* Λ_r = exp(s_r/T) / Σ_q exp(s_q/T), the contribution factor with temperature T;
* the global update is Σ_r (Λ_r ν_r / Σ_q Λ_q ν_q) · u_r, with ν_r the strategy's own weight (the
  sample count: FedAvg, FedProx, SCAFFOLD's model part, both FedNova parts).

**Secure form** (this module). With unit vectors ẑ_r = z_r/‖z_r‖, Σ_p S(r, p) = ẑ_r · Σ_p ẑ_p, so:

1. each client sends ẑ_r (float64 (d_latent,), weight 1) through the job's aggregation (aggregation
   round id slot 0 of the FL round); the server sends the sum Σẑ and the survivor count n back
   (``fl.latent_sum``);
2. each client computes s_r = ẑ_r · Σẑ and e_r = exp((s_r − c)/T) with the shift c = ‖Σẑ‖. By
   Cauchy–Schwarz every s_r ≤ ‖ẑ_r‖·‖Σẑ‖ = c ≤ n, so e_r ∈ (0, 1]: the exponential cannot overflow
   (the brief's shift by n, the largest s possible, would do the same; c is the tightest bound every
   client knows, and keeps e_r further from underflow). The shift cancels in the ratio:
   exp((s_r − c)/T) / Σ_q exp((s_q − c)/T) = exp(s_r/T) / Σ_q exp(s_q/T);
3. each client sends e_r (one scalar, weight 1, slot 1) through a second aggregation; the server
   sends Σ_q e_q back (``fl.exp_sum``); the client sets Λ_r = e_r / Σ_q e_q;
4. each client multiplies the weight of its sample-weighted parts by Λ_r (``Strategy.sample_weighted_parts``),
   and submits as usual: the aggregation's weighted mean Σ Λ_r ν_r u_r / Σ Λ_q ν_q *is* the paper's
   aggregate. (Σe also cancels there; it is what keeps the weights Λ_r ν_r within the fixed-point
   range: Σ_r Λ_r = 1, so the largest weight is at least min ν / n, however small every e_r is.)

What each role learns: the server learns Σẑ, n and Σ_q e_q (and, from the model aggregation, the
total weight Σ Λ_q ν_q) — never one client's z_r, ẑ_r, s_r or Λ_r. Every client of the round learns
Σẑ and Σe too, i.e. the sum of the *other* clients' unit latents: with n = 2 that is the other
client's ẑ (documented in docs/security.md).

Quantisation: the latent part uses clip 1 (unit-vector coordinates), weight 1 and at least 24
fractional bits; the scalar part clip 1, weight 1 and 40 fractional bits (e_r below 2^-40 counts as
0). Hostile values: a lying client can move each sum only by what its clipped input allows; the
server refuses (logs, and tells the clients to keep their plain weights this round — ``status:
rejected``) a latent sum whose weight is not n or whose norm exceeds n, and an exp sum that is not in
(0, n]; a client refuses (ProtocolError, logged by the transport, and the wait goes on) a server
message with a bad shape, a non-finite value, or an exp sum below its own e_r — so Λ_r is always in
(0, 1], never NaN or infinite.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..proto import messages_pb2
from ..secagg import AggregationConfig, make_client, make_server
from ..transport.base import ProtocolError, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto, whole_count
from .local_data import input_batch
from .models import model_device

log = logging.getLogger("secureflhv.horizontal.contribution")

TAG_LATENT_SUM = "fl.latent_sum"
TAG_EXP_SUM = "fl.exp_sum"
SLOTS = 2  # aggregation round slots used per FL round: latent sum, exp sum (before the strategy's parts)
LATENT_PRECISION_BITS = 24
EXP_PRECISION_BITS = 40


# ------------------------------------------------------------------------------------ the math
def last_linear(model: nn.Module) -> nn.Linear:
    """The model's output layer (its last ``nn.Linear``); ValueError when it has none."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no nn.Linear output layer: no latent representation")
    return linears[-1]


def latent_dim(model: nn.Module) -> int:
    """d_latent: the width of the last hidden layer (the output layer's ``in_features``)."""
    return int(last_linear(model).in_features)


@torch.no_grad()
def mean_latent(model: nn.Module, X: np.ndarray, batch_size: int = 1024) -> np.ndarray:
    """z_r: the mean over the rows of ``X`` (n, n_features) of the last hidden layer; float64 (d_latent,).

    Raises ValueError when ``X`` has no rows.
    """
    if len(X) == 0:
        raise ValueError("mean latent representation of no rows")
    out = last_linear(model)
    total = torch.zeros(out.in_features, dtype=torch.float64)
    captured: list[torch.Tensor] = []
    handle = out.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))
    model.train(False)  # inference mode
    device = model_device(model)
    try:
        for start in range(0, len(X), batch_size):
            captured.clear()
            model(input_batch(X, start, start + batch_size).to(device))
            total += captured[0].detach().cpu().to(torch.float64).reshape(-1, out.in_features).sum(0)
    finally:
        handle.remove()
    return (total / len(X)).numpy()


def unit(z: np.ndarray) -> np.ndarray:
    """ẑ = z/‖z‖ (float64); the zero vector for z = 0 (all-dead ReLUs: cosine taken as 0)."""
    z = np.asarray(z, dtype=np.float64)
    norm = float(np.linalg.norm(z))
    return z / norm if norm > 0 and math.isfinite(norm) else np.zeros_like(z)


def exp_score(z_hat: np.ndarray, latent_sum: np.ndarray, temperature: float) -> tuple[float, float]:
    """(s_r, e_r): s_r = ẑ_r · Σẑ and e_r = exp((s_r − ‖Σẑ‖)/T) ∈ [0, 1] (see the module docstring)."""
    s = float(np.dot(z_hat, latent_sum))
    shift = float(np.linalg.norm(latent_sum))
    return s, math.exp(min((s - shift) / temperature, 0.0))


def contribution_factor(e: float, exp_sum: float) -> float:
    """Λ_r = e_r / Σ_q e_q, kept in [0, 1] (Σ_q e_q ≥ e_r up to quantisation; checked on receipt)."""
    return min(max(e / exp_sum, 0.0), 1.0)


def latent_config(agg: AggregationConfig) -> AggregationConfig:
    """Aggregation settings of the ẑ sum: clip 1, weight 1, at least 24 fractional bits."""
    return agg.replace(clip=1.0, max_weight=1.0,
                               precision_bits=max(agg.precision_bits, LATENT_PRECISION_BITS))


def exp_config(agg: AggregationConfig) -> AggregationConfig:
    """Aggregation settings of the Σ e sum: clip 1, weight 1, 40 fractional bits."""
    return agg.replace(clip=1.0, max_weight=1.0, precision_bits=EXP_PRECISION_BITS)


def _latent_tolerance(n: int, dim: int, agg: AggregationConfig) -> float:
    """Largest ‖quantised Σẑ‖ − ‖Σẑ‖ of n honest clients (each coordinate off by < n units of 2^-p)."""
    return math.sqrt(dim) * n / latent_config(agg).scale + 1e-9


def _exp_tolerance(n: int) -> float:
    return n / 2.0 ** EXP_PRECISION_BITS + 1e-12


# ------------------------------------------------------------------------------------ server
@dataclass
class ContributionRecord:
    """What the server learns and decides in one round (``status``: ok / rejected / skipped)."""

    status: str
    n: int = 0
    latent_sum_norm: float = float("nan")
    exp_sum: float = float("nan")
    reason: str = ""


class ContributionServer:
    """The server half: two aggregations and two answers per round.

    Args:
        transport: the server's transport.
        dim: d_latent.
        agg: the FL job's aggregation settings (derived per sum, see :func:`latent_config`).
        send: ``send(receivers, tag, round, payload_of)`` of the FL server (marks unreachable clients dead).
    """

    def __init__(self, transport, dim: int, agg: AggregationConfig,
                 send: Callable[[Sequence[str], str, int, Callable], None]):
        self.dim = dim
        self.agg = agg
        self.send = send
        self.latent_server = make_server(transport, latent_config(agg))
        self.exp_server = make_server(transport, exp_config(agg))

    def run(self, r: int, selected: Sequence[str], first_round_id: int) -> ContributionRecord:
        """Round ``r``: aggregate ẑ (round id ``first_round_id``), answer, aggregate e (next id), answer.

        Raises AggregationError (from the aggregation layer) when fewer than t clients survive.
        """
        res = self.latent_server.aggregate(first_round_id, selected, self.dim)
        n, total = len(res.survivors), res.total
        norm = float(np.linalg.norm(total))
        rec = ContributionRecord("ok", n, norm)
        if abs(res.weight - n) > 1e-6 or not norm <= n + _latent_tolerance(n, self.dim, self.agg):
            rec.status, rec.reason = "rejected", (f"latent sum of {n} clients has weight {res.weight!r} and norm "
                                                  f"{norm!r} (expected weight {n}, norm <= {n}): a client lied")
        self.send(res.survivors, TAG_LATENT_SUM, r, lambda _c: messages_pb2.Bundle(
            tensors={"latent_sum": tensor_to_proto(total, "<f8")}, scalars={"n": float(n)},
            text={"status": rec.status}))
        if rec.status != "ok":
            log.warning("round %d: contribution normalisation off this round: %s", r, rec.reason)
            return rec
        res = self.exp_server.aggregate(first_round_id + 1, selected, 1)
        m, exp_sum = len(res.survivors), float(res.total[0])
        rec.exp_sum = exp_sum
        if abs(res.weight - m) > 1e-6 or not 0 < exp_sum <= m + _exp_tolerance(m):
            rec.status, rec.reason = "rejected", (f"exp sum {exp_sum!r} of {m} clients (weight {res.weight!r}) "
                                                  f"is not in (0, {m}]: a client lied")
            log.warning("round %d: contribution normalisation off this round: %s", r, rec.reason)
        self.send(res.survivors, TAG_EXP_SUM, r, lambda _c: messages_pb2.Bundle(
            scalars={"exp_sum": exp_sum, "n": float(m)}, text={"status": rec.status}))
        return rec


# ------------------------------------------------------------------------------------ client
class ContributionClient:
    """The client half: computes z_r, takes part in both sums, returns Λ_r.

    Args:
        transport: this client's transport.
        server_id: the FL server.
        dim: d_latent.
        agg: the FL job's aggregation settings.
        temperature: T > 0.
        timeout: how long to wait for each of the server's answers.

    Attributes (of the last round, for logs and tests): ``z`` (z_r), ``s``, ``e``, ``exp_sum``, ``factor`` (Λ_r).
    """

    def __init__(self, transport, server_id: str, dim: int, agg: AggregationConfig, temperature: float,
                 timeout: float):
        if not (temperature > 0 and math.isfinite(temperature)):
            raise ValueError(f"contribution temperature must be positive and finite, got {temperature}")
        self.t = transport
        self.server_id = server_id
        self.dim = dim
        self.agg = agg
        self.temperature = float(temperature)
        self.timeout = timeout
        self.latent_client = make_client(transport, server_id, latent_config(agg))
        self.exp_client = make_client(transport, server_id, exp_config(agg))
        self.z = self.s = self.e = self.exp_sum = self.factor = None

    def factor_for(self, r: int, participants: Sequence[str], model: nn.Module, X: np.ndarray,
                   first_round_id: int) -> float | None:
        """Λ_r of this round for the locally trained ``model`` and training rows ``X``; None when the
        server turned normalisation off this round (status ``rejected``: keep the plain weights).

        Raises AggregationError / PeerTimeout when the round fails (this client drops out).
        """
        self.z = mean_latent(model, X)
        z_hat = unit(self.z)
        self.latent_client.submit(first_round_id, participants, z_hat, 1.0)
        status, latent_sum, n = self.t.recv(self.server_id, TAG_LATENT_SUM, r, timeout=self.timeout,
                                            parse=self._latent_parser(len(participants)))
        if status != "ok":
            log.warning("%s: round %d: the server turned contribution normalisation off", self.t.party_id, r)
            return None
        self.s, self.e = exp_score(z_hat, latent_sum, self.temperature)
        self.exp_client.submit(first_round_id + 1, participants, np.array([self.e]), 1.0)
        status, self.exp_sum = self.t.recv(self.server_id, TAG_EXP_SUM, r, timeout=self.timeout,
                                           parse=self._exp_parser(len(participants), self.e))
        if status != "ok":
            log.warning("%s: round %d: the server turned contribution normalisation off", self.t.party_id, r)
            return None
        self.factor = contribution_factor(self.e, self.exp_sum)
        log.info("%s: round %d: s=%.4f, Λ=%.4g (n=%d, T=%g)", self.t.party_id, r, self.s, self.factor, n,
                 self.temperature)
        return self.factor

    def _latent_parser(self, n_max: int):
        def validate(msg):
            status = msg.text.get("status")
            if status not in ("ok", "rejected"):
                raise ProtocolError(f"latent sum: unknown status {status!r}")
            n = whole_count(msg.scalars.get("n", -1.0), "latent sum: 'n'", lo=2, hi=n_max + 1)
            total = tensor_from_proto(msg.tensors["latent_sum"], what="latent sum", dtype="<f8", shape=(self.dim,)) \
                if "latent_sum" in msg.tensors else None
            if total is None:
                raise ProtocolError("latent sum: no 'latent_sum' tensor")
            if status == "ok" and not np.linalg.norm(total) <= n + _latent_tolerance(n, self.dim, self.agg):
                raise ProtocolError(f"latent sum: norm {np.linalg.norm(total)!r} exceeds n={n} unit vectors")
            return status, total, n
        return parse_message(messages_pb2.Bundle, validate)

    @staticmethod
    def _exp_parser(n_max: int, own: float):
        def validate(msg):
            status = msg.text.get("status")
            if status not in ("ok", "rejected"):
                raise ProtocolError(f"exp sum: unknown status {status!r}")
            n = whole_count(msg.scalars.get("n", -1.0), "exp sum: 'n'", lo=2, hi=n_max + 1)
            v = msg.scalars.get("exp_sum", float("nan"))
            tol = _exp_tolerance(n)
            if status == "ok" and not (math.isfinite(v) and 0 < v <= n + tol and v >= own - tol):
                raise ProtocolError(f"exp sum {v!r}: not finite in (0, {n}] and at least this client's own "
                                    f"term {own!r}")
            return status, v
        return parse_message(messages_pb2.Bundle, validate)
