"""Secure aggregation as a shared service of the horizontal algorithms (FL and SecureBoost).

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
* ``"secagg"`` — Bonawitz et al., CCS 2017 (:mod:`secureflhv.secagg.bonawitz`): the server learns
  only the sum over survivors (plus who survived and the total clipped count), even when clients
  drop out at any stage, as long as at least ``t`` remain.

Participants and threshold come from the job, never from the server's word
(:func:`~.exchange.check_round`): a client refuses a participant list naming the server, anyone
outside ``config.job_clients`` or a duplicate, and a round smaller than ``config.min_clients``
or ``config.max_colluders + 2``. ``t`` is the smallest count with n_C < 2t − n for
n_C = ``config.max_colluders`` (Bonawitz et al. 2017, Thm 6.5), or ``config.threshold`` (a count or a
fraction in (1/2, 1]) when that is at least as high. Fewer than ``t`` survivors raises
:class:`AggregationError` naming who dropped at which stage, for every kind (so the kinds are
interchangeable in tests); secagg also keeps at least ``config.min_clients`` at every stage, at the
server and at each client. After unmasking, the server refuses a sum that honest, clipped inputs
cannot produce (:mod:`.bounds`: :class:`OutOfRangeRound`).

Dishonest parties: with certificate identities on the transports (mutual TLS, or
``InProcessNetwork(cert_dir=...)``) secagg is secure against a malicious server and detects dishonest
clients (see :mod:`.bonawitz`); the result's ``offenders`` names clients whose input was refused.

Timeouts: the server waits ``input_timeout_s`` for the first message of each client (it covers the
clients' local training), then ``stage_timeout_s`` per later stage; a client silent past the
deadline is counted as dropped at that stage. Clients wait for the server up to
``input_timeout_s + 5 * stage_timeout_s``, but name a server that cannot be reached after one silent job
deadline (``Transport.recv_while_reachable``).

Transport tags start with ``"agg."``; envelope rounds are ``round_id * 16 + stage``, so round ids
must strictly increase from one call to the next (the transport rejects stale rounds).

Modules: :mod:`.config` (settings), :mod:`.result` (result, error), :mod:`.exchange` (collecting and
sending per stage), :mod:`.roles` (the two abstract halves), :mod:`.plain` (the unprotected kinds),
:mod:`.bonawitz` / :mod:`.bonawitz_client` / :mod:`.bonawitz_server` (the secure protocol). Pick the
pair for a config with :func:`make_aggregation`, or build one half with :func:`make_client` /
:func:`make_server`.
"""
from __future__ import annotations

from .bonawitz_client import SecAggClient
from .bonawitz_server import SecAggServer
from .config import KINDS, AggregationConfig, AggregationConfigError, Kind
from .exchange import STAGES
from .plain import PlainClient, PlainServer
from .result import AggregateResult, AggregationError, OutOfRangeRound
from .roles import AggregationClient, AggregationServer

__all__ = ["KINDS", "STAGES", "AggregateResult", "AggregationClient", "AggregationConfig", "AggregationConfigError",
           "AggregationError",
           "AggregationServer", "Kind", "OutOfRangeRound", "PlainClient", "PlainServer", "SecAggClient", "SecAggServer",
           "make_aggregation", "make_client", "make_server"]


def make_aggregation(config: AggregationConfig) -> tuple[type[AggregationClient], type[AggregationServer]]:
    """(client class, server class) for ``config.kind``.

    The client class is built as ``client_cls(transport, server_id, config)``, the server class as
    ``server_cls(transport, config)`` (what :func:`make_client` / :func:`make_server` do).
    """
    if config.kind in ("plain", "plain_quantised"):
        return PlainClient, PlainServer
    return SecAggClient, SecAggServer


def make_client(transport, server_id: str, config: AggregationConfig) -> AggregationClient:
    """The client half of ``config.kind`` for this party's ``transport``."""
    client_cls, _ = make_aggregation(config)
    return client_cls(transport, server_id, config)


def make_server(transport, config: AggregationConfig) -> AggregationServer:
    """The server half of ``config.kind`` for this party's ``transport``."""
    _, server_cls = make_aggregation(config)
    return server_cls(transport, config)
