"""Horizontal FL as a job (``job.algorithm: horizontal``): FedAvg / FedProx / SCAFFOLD / FedNova.

Clients are the job's guest and hosts (``cfg.clients``); the server aggregates and holds no data.
Each client reads ``parties[i].data.path`` — an ``.npz`` shard written by ``secureflhv partition``
(:func:`secureflhv.data.write_shards`; label array ``y``) or a CSV / Parquet table (label column
``parties[i].data.label_column``, else ``params.label_column``; the id column, if present, is not a
feature) — and holds out ``params.test_fraction`` of its rows as its local test split.

Example ``params``::

    params:
      strategy: fedprox          # fedavg | fedprox | scaffold | fednova
      mu: 0.01                   # FedProx only
      model: {name: cnn, n_features: 784, n_classes: 10}   # or {name: mlp, n_features: 54, n_classes: 7}
      rounds: 20
      fraction: 1.0              # clients sampled per round
      local_epochs: 2
      batch_size: 64
      lr: 0.01
      momentum: 0.9
      seed: 0
      aggregation: {kind: secagg, clip: 1.0, precision_bits: 16}
      test_fraction: 0.2

Artifacts under ``<output_dir>/<party id>/``: at the server ``global_model.npz`` (named float32
arrays, ``np.load(..., allow_pickle=False)``), ``model.json`` (architecture, parameter shapes, the npz's
SHA-256, params, final metrics), ``metrics.json`` (per round) and ``accuracy.png``; at each client
``metrics.json`` (its local test metrics per round).
"""
from __future__ import annotations

import hashlib
import logging
import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..data import load_table
from ..horizontal.aggregation import AggregationConfig
from ..horizontal.fl import FLConfig, HorizontalClient, HorizontalServer, RoundRecord
from ..horizontal.models import ModelSpec, build_model, named_arrays
from ..horizontal.strategies import LocalTrainConfig, make_strategy
from ..transport import Transport
from .artifacts import plot_curves, save_model, write_json
from .config import JobConfig, JobConfigError, PartySpec, params_error
from .launcher import emit_progress

log = logging.getLogger("secureflhv.job")


class AggregationParams(BaseModel):
    """``params.aggregation``: see :class:`secureflhv.horizontal.aggregation.AggregationConfig`.

    ``input_timeout_s`` defaults to ``job.deadline_s`` (it covers the clients' local training).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["secagg", "plain", "plain_quantised"] = "secagg"
    threshold: int | float | None = Field(default=None, description="t, or a fraction of the selected clients")
    clip: float = Field(default=1.0, gt=0)
    precision_bits: int = Field(default=16, ge=0, le=40)
    max_weight: float = Field(default=float(1 << 20), gt=0)
    consistency_check: bool = False
    stage_timeout_s: float = Field(default=30.0, gt=0)
    input_timeout_s: float | None = Field(default=None, gt=0)
    seed: int | None = Field(default=None, ge=0, description="stochastic rounding seed (tests)")


class HorizontalJobParams(BaseModel):
    """The job file's ``params`` for ``algorithm: horizontal``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: Literal["fedavg", "fedprox", "scaffold", "fednova"] = "fedavg"
    mu: float = Field(default=0.01, ge=0, description="FedProx proximal weight")
    model: ModelSpec
    rounds: int = Field(default=10, ge=1)
    fraction: float = Field(default=1.0, gt=0, le=1, description="share of clients sampled per round")
    local_epochs: int = Field(default=1, ge=1)
    batch_size: int = Field(default=64, ge=1)
    lr: float = Field(default=0.01, gt=0)
    momentum: float = Field(default=0.0, ge=0, lt=1)
    weight_decay: float = Field(default=1e-5, ge=0)
    seed: int = Field(default=0, ge=0)
    aggregation: AggregationParams = AggregationParams()
    part_clips: dict[Literal["control", "nova"], float] = Field(
        default_factory=dict, description="clip of SCAFFOLD's control / FedNova's a_i parts")
    test_fraction: float = Field(default=0.2, ge=0, lt=1, description="local test split of each client")
    label_column: str = Field(default="y", description="label column when parties[i].data.label_column is unset")
    round_timeout_s: float | None = Field(default=None, gt=0, description="default: job.deadline_s")


def job_params(cfg: JobConfig) -> HorizontalJobParams:
    """Validate ``params`` of a horizontal job. Raises JobConfigError naming ``params.<field>``."""
    try:
        params = HorizontalJobParams(**cfg.params)
    except ValidationError as err:
        raise params_error(err) from None
    except TypeError as exc:
        raise JobConfigError(f"params: {exc}") from None
    try:
        fl_config(cfg, params)
    except ValueError as exc:
        raise JobConfigError(f"params.aggregation: {exc}") from None
    n = len(cfg.clients)
    m = max(1, int(n * params.fraction))
    agg = _aggregation(cfg, params)
    try:
        agg.resolve_threshold(m)
    except ValueError as exc:
        raise JobConfigError(f"params.aggregation.threshold: {exc} (fraction {params.fraction} of {n} clients)") \
            from None
    if m < 2 and agg.kind == "secagg":
        raise JobConfigError(f"params.fraction: selects {m} client per round; secure aggregation of one client "
                             f"would reveal its update (select at least 2)")
    return params


def _aggregation(cfg: JobConfig, params: HorizontalJobParams) -> AggregationConfig:
    a = params.aggregation.model_dump()
    if a["input_timeout_s"] is None:
        a["input_timeout_s"] = cfg.job.deadline_s
    return AggregationConfig(**a)


def fl_config(cfg: JobConfig, params: HorizontalJobParams) -> FLConfig:
    local = LocalTrainConfig(epochs=params.local_epochs, batch_size=params.batch_size, lr=params.lr,
                             momentum=params.momentum, weight_decay=params.weight_decay)
    from ..horizontal.fl import DEFAULT_PART_CLIPS

    timeout = params.round_timeout_s or cfg.job.deadline_s
    return FLConfig(rounds=params.rounds, fraction=params.fraction, seed=params.seed, local=local,
                    aggregation=_aggregation(cfg, params), part_clips={**DEFAULT_PART_CLIPS, **params.part_clips},
                    # a send may retry for a quarter of a client's wait, so a slow delivery to one
                    # client never makes the others give up on the server
                    round_timeout_s=timeout, send_timeout_s=min(30.0, timeout / 4))


def _columns(path: Path) -> list[str]:
    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return list(z.files)
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    import pandas as pd

    return list(pd.read_csv(path, nrows=0).columns)


def load_client_data(cfg: JobConfig, spec: PartySpec, params: HorizontalJobParams) -> tuple[np.ndarray, np.ndarray]:
    """(X float32 (n, n_features), y int64 (n,)) of a client; JobConfigError naming the party's data."""
    index = cfg.parties.index(spec)
    where = f"parties[{index}].data"
    data = spec.data
    path = cfg.resolve(data.path)
    label = data.label_column or params.label_column
    try:
        cols = _columns(path)
        id_col = data.id_column if data.id_column in cols else None
        table = load_table(path, label_column=label, id_column=id_col, feature_columns=data.feature_columns)
    except (OSError, ValueError) as exc:
        raise JobConfigError(f"{where}: {exc}") from None
    if table.y is None:
        raise JobConfigError(f"{where}: no label column {label!r} in {path}")
    y = np.asarray(table.y)
    if not np.issubdtype(y.dtype, np.number) or not np.all(np.asarray(y, float) == np.round(np.asarray(y, float))):
        raise JobConfigError(f"{where}: labels in {path} must be integer class ids 0..n_classes-1")
    y = y.astype(np.int64)
    if table.n_features != params.model.n_features:
        raise JobConfigError(f"{where}: {path} has {table.n_features} feature columns, params.model.n_features is "
                             f"{params.model.n_features}")
    if len(y) and (y.min() < 0 or y.max() >= params.model.n_classes):
        raise JobConfigError(f"{where}: labels in {path} range {y.min()}..{y.max()}, outside 0.."
                             f"{params.model.n_classes - 1} (params.model.n_classes)")
    return np.asarray(table.X, dtype=np.float32), y


def local_split(n: int, fraction: float, seed: int, party_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) of a client's table; depends only on (n, fraction, seed, party id)."""
    cid = int.from_bytes(hashlib.sha256(party_id.encode()).digest()[:8], "little")
    perm = np.random.default_rng([seed, cid, 7]).permutation(n)
    n_test = int(round(fraction * n))
    if n - n_test < 1:
        n_test = n - 1
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _finite(obj):
    """JSON-safe copy: non-finite floats (no test rows, no clip) become None."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _record_json(rec: RoundRecord) -> dict:
    return _finite(dict(vars(rec)))


def run_job(cfg: JobConfig, spec: PartySpec, transport: Transport) -> dict:
    """Run this party's role of a horizontal job; return a summary (also saved as artifacts).

    Raises JobConfigError for bad params or data, TransportError when the server or too many clients
    fail, AggregationError when a round keeps fewer than t clients.
    """
    params = job_params(cfg)
    config = fl_config(cfg, params)
    out_dir = cfg.output_dir(spec.id)
    clients = [p.id for p in cfg.clients]
    strategy = make_strategy(params.strategy, mu=params.mu)
    if config.aggregation.kind in ("plain", "plain_quantised"):
        log.warning("%s: aggregation kind %r: the server sees every client's update", spec.id,
                    config.aggregation.kind)

    if spec.role == "server":
        def on_round(rec: RoundRecord, _vec) -> None:
            emit_progress("rounds", rec.round, params.rounds,
                          f"accuracy {rec.test_accuracy:.4f}" if rec.test_n else f"loss {rec.train_loss:.4f}")

        server = HorizontalServer(transport, clients, params.model, strategy, config, on_round=on_round)
        history = server.run()
        model = build_model(params.model)
        arrays = named_arrays(model, server.global_vec)
        out_dir.mkdir(parents=True, exist_ok=True)
        npz = out_dir / "global_model.npz"
        np.savez(npz, **arrays)
        digest = hashlib.sha256(npz.read_bytes()).hexdigest()
        final = _record_json(history[-1]) if history else {}
        rounds = [_record_json(r) for r in history]
        write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "strategy": params.strategy, "rounds": rounds,
                                              "final": final})
        acc = [r.test_accuracy for r in history]
        plot = None
        if any(math.isfinite(a) for a in acc):
            plot = plot_curves(out_dir / "accuracy.png", {"clients' local test accuracy": acc},
                               title=f"{params.strategy}, job {cfg.job.id}", xlabel="round", ylabel="accuracy")
        save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role="server", algorithm="horizontal",
                   model={"file": npz.name, "sha256": digest, "format": "npz (named float32 arrays)",
                          "parameters": {k: list(v.shape) for k, v in arrays.items()}},
                   metadata={"architecture": params.model.model_dump(mode="json"),
                             "params": params.model_dump(mode="json"), "clients": clients,
                             "final_metrics": final})
        log.info("%s: done: %d rounds, final accuracy %.4f; model %s; plot %s", spec.id, len(history),
                 history[-1].test_accuracy if history else float("nan"), npz, plot)
        return final

    X, y = load_client_data(cfg, spec, params)
    train, test = local_split(len(y), params.test_fraction, params.seed, spec.id)
    log.info("%s: %d rows (%d train, %d local test) x %d features from %s", spec.id, len(y), len(train), len(test),
             X.shape[1], cfg.resolve(spec.data.path))
    server_id = cfg.server.id
    try:
        client = HorizontalClient(transport, server_id, X[train], y[train], X[test], y[test], params.model, strategy,
                                  config)
    except ValueError as exc:
        raise JobConfigError(f"parties[{cfg.parties.index(spec)}].data: {exc}") from None
    history = client.run()
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "party_id": spec.id, "n_train": len(train),
                                          "n_test": len(test), "rounds": _finite(history)})
    return history[-1] if history else {}
