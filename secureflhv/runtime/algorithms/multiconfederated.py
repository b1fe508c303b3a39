"""MultiConfederated learning as a job (``job.algorithm: multiconfederated``): decentralised, **no server**.

Duchesne, Zhang, Talhi 2024 (arXiv:2404.13421, Alg. 1–2); the protocol is
:class:`secureflhv.horizontal.mc_peer.MultiConfederatedPeer`, the rules :mod:`secureflhv.horizontal.mc_rules`.
Every party is a peer (role guest or host, at least two; a server is refused by config validation) and
exchanges its trained models with every other peer over the job's mTLS transport: **peers see each other's
updates** (no secure aggregation), as in the paper. Dropouts are not tolerated: a peer that goes silent
stops the others at their deadline, naming it.

Each peer reads ``parties[i].data.path`` like a horizontal FL client (``.npz`` shard or CSV / Parquet with the
label column ``parties[i].data.label_column`` or ``params.label_column``) and holds out
``params.test_fraction`` of its rows as its local test split.

Example ``params``::

    params:
      model: {name: mlp, n_features: 30, n_classes: 2, hidden: [16]}
      rounds: 10
      local_epochs: 1
      batch_size: 32
      learning_rate: 0.05
      seed: 0
      tolerance: 1.0          # divergence filter: accept δ <= median + tolerance·std
      popularity_weight: 0.1  # selection: accuracy + popularity_weight · popularity share
      fork_margin: 0.1        # fork when the own model beats the aggregate by this accuracy on local rows
      merge_tolerance: 0.01   # merge two models whose divergence is at most this
      max_models: 8           # most models ever in the network
      initial_models: null    # default max(2, ceil(sqrt(peers)))
      test_fraction: 0.2

Artifacts under ``<output_dir>/<peer>/``: ``pool_models.npz`` (every model of the peer's pool, arrays
``<model id>/<parameter>``, float32, ``np.load(..., allow_pickle=False)``), ``metrics.json`` (per round:
trained models, divergences, accepted / rejected peers, forks, merges, pool, personal model, local test
accuracy) and the personal model as a bundle (``model/``, ``model.safetensors``).

Checkpoints: after every round each peer saves its whole state (its pool, announced ids, popularity,
pending fork, round records) under ``<output_dir>/<peer>/checkpoints/``; ``secureflhv run JOB --resume``
(or ``party --resume``) makes the peers agree on the newest round all of them completed
(:func:`~secureflhv.runtime.store.resume.role_lifecycle`) and continue from it; the finished pools equal an
uninterrupted run's with the same seed.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
from pydantic import Field

from ...horizontal.mc_peer import MultiConfederatedPeer
from ...horizontal.models import build_model, named_arrays
from ...horizontal.mc_rules import MCConfig
from ...transport import Transport
from ..store.artifacts import write_json
from ..job.data_prep import local_split
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..store.model_bundle import save_job_bundle
from ..store.resume import role_lifecycle
from .horizontal_fl import LocalTrainingParams, _finite, load_client_data

log = logging.getLogger("secureflhv.job")


class MultiConfederatedJobParams(LocalTrainingParams):
    """The job file's ``params`` for ``algorithm: multiconfederated`` (no federated preprocessing: it needs a server)."""

    tolerance: float = Field(default=1.0, ge=0, allow_inf_nan=False,
                             description="divergence filter: accept δ <= median + tolerance·std")
    popularity_weight: float = Field(default=0.1, ge=0, allow_inf_nan=False)
    fork_margin: float = Field(default=0.1, ge=0, allow_inf_nan=False)
    merge_tolerance: float = Field(default=0.01, ge=0, allow_inf_nan=False)
    max_models: int = Field(default=8, ge=1, le=64)
    initial_models: int | None = Field(default=None, ge=1, le=64)


def roles(cfg: JobConfig) -> None:
    """Decentralised: no server, at least two peers (guest/host), at most one guest."""
    for i, p in enumerate(cfg.parties):
        if p.role == "server":
            raise JobConfigError(f"parties[{i}].role: {cfg.job.algorithm} is decentralised and has no server "
                                 f"role; remove party {p.id!r} (every peer aggregates for itself)")
    if [p.role for p in cfg.parties].count("guest") > 1:
        raise JobConfigError("parties: at most one guest")
    if len(cfg.clients) < 2:
        raise JobConfigError(f"parties: {cfg.job.algorithm} needs at least two peers (guest/host), "
                             f"found {len(cfg.clients)}")


def check(cfg: JobConfig, params: MultiConfederatedJobParams) -> None:
    """Validation of the whole job: the protocol config must build (JobConfigError naming the field)."""
    try:
        mc_config(cfg, params)
    except ValueError as exc:
        field = next((f for f in ("initial_models", "max_models") if str(exc).startswith(f)), "")
        raise JobConfigError(f"params{'.' + field if field else ''}: {exc}") from None


def mc_config(cfg: JobConfig, params: MultiConfederatedJobParams) -> MCConfig:
    """The protocol's :class:`MCConfig` from the job: local training, pool rules (Duchesne et al. 2024,
    Alg. 1-2) and timeouts (``round_timeout_s``, else the job deadline; sends retry for a quarter of it,
    at most 30 s). ValueError from the config's own checks.
    """
    local = params.local_config()
    timeout = params.round_timeout_s or cfg.job.deadline_s
    return MCConfig(rounds=params.rounds, seed=params.seed, local=local, initial_models=params.initial_models,
                    tolerance=params.tolerance, popularity_weight=params.popularity_weight,
                    fork_margin=params.fork_margin, merge_tolerance=params.merge_tolerance,
                    max_models=params.max_models, round_timeout_s=timeout, send_timeout_s=min(30.0, timeout / 4))


def make_peer(cfg: JobConfig, party: PartySpec, transport: Transport,
              params: MultiConfederatedJobParams, resume: bool = False) -> MultiConfederatedPeer:
    """This party's peer with its data loaded and split and its checkpoint agreed with the other peers
    (``resume``: offer the stored ones); JobConfigError naming the party's data."""
    X, y = load_client_data(cfg, party, params)
    split = local_split(len(y), params.test_fraction, params.seed, party.id)
    log.info("%s: %d rows (%d train, %d local test) x %d features from %s", party.id, len(y), len(split.train),
             len(split.test), X.shape[1], cfg.resolve(party.data.path))
    try:
        return MultiConfederatedPeer(transport, [p.id for p in cfg.clients], X[split.train], y[split.train],
                                     X[split.test], y[split.test], params.model, mc_config(cfg, params),
                                     **role_lifecycle(cfg, party, transport, resume,
                                                      [p.id for p in cfg.clients if p.id != party.id]))
    except ValueError as exc:
        raise JobConfigError(f"{cfg.where(party, 'data')}: {exc}") from None


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: MultiConfederatedJobParams, *,
        resume: bool = False) -> dict:
    """Run this peer; save its pool, metrics and personal model; return its last round's record.

    Raises JobConfigError for bad data, PeerTimeout naming a silent peer, JobAborted when a peer failed.
    """
    peer = make_peer(cfg, party, transport, params, resume)
    history = peer.run()
    out_dir = cfg.output_dir(party.id)
    out_dir.mkdir(parents=True, exist_ok=True)
    blank = build_model(params.model)
    np.savez(out_dir / "pool_models.npz", **{f"{m}/{k}": v for m, vec in sorted(peer.pool.items())
                                             for k, v in named_arrays(blank, vec).items()})
    rounds = [_finite(dataclasses.asdict(r)) for r in history]
    final = rounds[-1] if rounds else {}
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "party_id": party.id, "algorithm": cfg.job.algorithm,
                                          "n_train": len(peer.y_train), "n_test": len(peer.y_test),
                                          "rounds": rounds, "final": final})
    save_job_bundle(cfg, party, files={"model.safetensors": named_arrays(blank, peer.personal_model)},
                    config=params.model_dump(mode="json"), metrics=final,
                    extra={"n_features": params.model.n_features, "personal_model": final.get("personal")})
    return final
