"""Horizontal FL as a job (``job.algorithm: horizontal``): FedAvg / FedProx / SCAFFOLD / FedNova, each
optionally with client contribution normalisation (``contribution_temperature``); IFCA (clustered) and
FedPer (personal head); all through the job's aggregation (secure by default).

Clients are the job's guest and hosts (``cfg.clients``); the server aggregates and holds no data.
Each client reads ``parties[i].data.path`` — an ``.npz`` shard written by ``secureflhv partition``
(:func:`secureflhv.data.write_shards`; label array ``y``) or a CSV / Parquet table (label column
``parties[i].data.label_column``, else ``params.label_column``; the id column, if present, is not a
feature), or the torch ``Dataset`` its ``parties[i].data.factory`` builds — and holds out
``params.test_fraction`` of its rows as its local test split.

The model is a built-in one (``params.model.name``) or the user's own (``params.model.factory``), trained by the
built-in loop or the user's (``params.train`` / ``params.evaluate``) on ``params.device``: :mod:`.user_code`,
:mod:`secureflhv.horizontal.user_model`, docs/byom.md.

Example ``params``::

    params:
      strategy: fedprox          # fedavg | fedprox | scaffold | fednova | ifca | fedper
      mu: 0.01                   # FedProx only
      clusters: 2                # IFCA only: k cluster models (Ghosh et al. 2020)
      personal_layers: 1         # FedPer only: final linear layers kept local
      contribution_temperature: 1.0   # client contribution normalisation (Kundalwal et al.), T; null = off
      model: {name: cnn, n_features: 784, n_classes: 10}   # or {name: mlp, n_features: 54, n_classes: 7}
      # regression: model: {name: mlp, task: regression, n_features: 10, target_mean: 150, target_std: 75}
      rounds: 20
      fraction: 1.0              # clients sampled per round
      local_epochs: 2
      batch_size: 64
      learning_rate: 0.01
      momentum: 0.9
      seed: 0
      aggregation: {kind: secagg, clip: 1.0, precision_bits: 16}
      test_fraction: 0.2
      preprocessing: {standardize: true, missing_indicator: false}   # optional: federated preprocessing

With ``params.preprocessing`` (:mod:`secureflhv.runtime.job.fed_prep`) the clients first compute global
statistics of their training rows through the job's aggregation (the server learns only pooled counts
and sums), build the same imputation / one-hot / standardisation and train on its output; tables may
then have missing cells and categorical columns (declared in ``data.schema``), and
``params.model.n_features`` is the width after one-hot encoding. The bundles record the preprocessor.

Artifacts under ``<output_dir>/<party id>/``: at the server ``global_model.npz`` (named float32
arrays, ``np.load(..., allow_pickle=False)``; IFCA: the most chosen cluster, and every cluster in
``cluster_models.npz``, arrays ``cluster<j>/<name>``), ``metrics.json`` (per round, with each client's own accuracy and the
worst client's) and ``accuracy.png`` (overall and worst client); at each client
``metrics.json`` (its local test metrics per round, and under ``final`` the task's metrics of the last
global model on its local test rows: :func:`secureflhv.data.metrics.task_metrics`), ``predictions.csv``
(those rows: ``row`` = row number in its data file, ``label``, then ``value`` / ``probability`` /
``p0..``) and that task's plots (``roc_ks.png`` and ``confusion.png``; ``confusion.png``; ``predicted_vs_true.png``). A regression
head (``model.task: regression``) reports pooled RMSE / MAE / R² per round (``test_metrics``) and draws
``r2.png`` at the server instead of the accuracy curve. The server and every client also write the final
global model as a bundle (``model/``, :mod:`secureflhv.runtime.store.model_bundle`: ``model.safetensors``),
which :func:`secureflhv.load_model` scores locally.

Checkpoints (:mod:`secureflhv.runtime.store.checkpoint`): the server and every client save their state after
each round under ``<output_dir>/<party>/checkpoints/step-<rounds done>/`` (what is stored:
:mod:`secureflhv.horizontal.fl`). At start-up (clients: after loading their data) all parties agree on a
step (:mod:`secureflhv.runtime.store.resume`); with ``--resume`` they continue after it. With a fixed
``aggregation.seed`` the finished model equals an uninterrupted run's exactly. What a peer learns from the
agreement: which rounds the others completed, nothing else.
"""
from __future__ import annotations

import copy
import logging
import math
from dataclasses import replace
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from ...params import AggregationParams, ClientDPParams, FactoryRef, LocalTraining
from ...params.record_privacy import RecordDPParams
from ...secagg import AggregationConfig, AggregationConfigError
from ...horizontal.dp_distributed import DistributedDP
from ...horizontal.dp_fedavg import CentralDP, ClientDP
from ...horizontal.dp_record_sum import RecordSumDP
from ...horizontal.fl import (DEFAULT_PART_CLIPS, PARTS_PER_ROUND, FLConfig, HorizontalClient,
                              HorizontalServer, RoundRecord)
from ...data.metrics import task_metrics
from ...horizontal.local_data import DatasetRows, input_batch, take
from ...horizontal.models import ModelSpec, build_model, get_flat, model_device, named_arrays, set_flat
from ...horizontal.user_model import UserModelSpec
from . import user_code
from ...horizontal.strategy_registry import make_strategy
from ...horizontal.dp_sgd import DP_SGD_STRATEGIES
from ...horizontal.local_config import LR_SCHEDULERS, LocalTrainConfig
from ...transport import Transport
from ..store.artifacts import plot_curves, write_json
from ..job.data_prep import load_party_table, local_split
from ..job import fed_prep
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..store.model_bundle import save_job_bundle
from ..process.progress import emit_progress
from ..observe.reports import save_task_plots
from ..store.resume import role_lifecycle

log = logging.getLogger("secureflhv.job")


class LocalTrainingParams(LocalTraining):
    """The ``params`` that the horizontal jobs with a torch model share (``algorithm: horizontal`` and
    ``multiconfederated``): the model, rounds, each client's local SGD (:class:`secureflhv.params.LocalTraining`)
    and its data (label column, local test split). Every field: ``docs/parameters.md``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSpec
    rounds: int = Field(default=10, ge=1)
    seed: int = Field(default=0, ge=0)
    test_fraction: float = Field(default=0.2, ge=0, lt=1, description="local test split of each client (peer)")
    label_column: str = Field(default="y", description="label column when parties[i].data.label_column is unset")
    round_timeout_s: float | None = Field(default=None, gt=0, description="default: job.deadline_s")

    @property
    def raw_features(self) -> bool:
        """Whether a client's table columns are the model's inputs as they are (no federated preprocessing
        makes them): then their count must be ``model.n_features``."""
        return True

    def local_config(self) -> LocalTrainConfig:
        """A client's local training settings (:class:`~secureflhv.horizontal.strategies.LocalTrainConfig`)."""
        return LocalTrainConfig(epochs=self.local_epochs, batch_size=self.batch_size, lr=self.learning_rate,
                                momentum=self.momentum, weight_decay=self.weight_decay)


def _model_kind(v) -> str:
    """The union tag: ``<factory>`` for a user's model (a mapping with ``factory``), else ``<builtin>`` (tags in
    angle brackets are dropped from the field names of errors: :func:`~..job.job_file.params_error`)."""
    if isinstance(v, UserModelSpec) or (isinstance(v, dict) and "factory" in v):
        return "<factory>"
    return "<builtin>"


AnyModel = Annotated[Union[Annotated[ModelSpec, Tag("<builtin>")], Annotated[UserModelSpec, Tag("<factory>")]],
                     Discriminator(_model_kind)]


class LRSchedulerParams(BaseModel):
    """``params.lr_scheduler``: a torch.optim.lr_scheduler class stepped once per round (round r trains with the
    learning rate it gives after r - 1 steps; every client and a resumed job compute the same)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal[LR_SCHEDULERS] = Field(description="torch.optim.lr_scheduler class, e.g. CosineAnnealingLR")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="its keyword arguments, e.g. {T_max: 20}")


class HorizontalJobParams(LocalTrainingParams):
    """The job file's ``params`` for ``algorithm: horizontal``: a built-in model or the user's own
    (``model.factory``, :mod:`secureflhv.horizontal.user_model`), optionally the user's training and evaluation
    loops (:mod:`secureflhv.horizontal.user_loop`) and where training runs."""

    model: AnyModel
    train: FactoryRef | None = Field(default=None, description="the user's train(model, loader, ctx) (default: "
                                                               "the built-in SGD loop)")
    evaluate: FactoryRef | None = Field(default=None, description="the user's evaluate(model, loader, ctx) -> "
                                                                  "{'loss', 'accuracy'} (default: built-in)")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="where clients train: auto = "
                                                                                "cuda when present, else cpu")
    optimizer: Literal["sgd", "adam", "adamw"] = Field(default="sgd", description="the clients' optimiser (momentum: "
                                                                                   "SGD only)")
    lr_scheduler: LRSchedulerParams | None = Field(default=None, description="learning rate per round (None: "
                                                                               "constant)")
    dp: ClientDPParams | None = Field(default=None, description="client-level differential privacy (DP-FedAvg, "
                                                                "central or distributed noise); docs/privacy.md")
    record_dp: RecordDPParams | None = Field(default=None, description="record-level DP-SGD at every client "
                                                                       "(Opacus); docs/privacy.md")

    def local_config(self) -> LocalTrainConfig:
        """A client's local training settings, with the job's optimiser, learning-rate schedule and DP-SGD."""
        sched = None if self.lr_scheduler is None else (self.lr_scheduler.name,
                                                        tuple(sorted(self.lr_scheduler.kwargs.items())))
        return replace(super().local_config(), optimizer=self.optimizer, lr_scheduler=sched,
                       dp_sgd=self.record_dp if self.record_dp is not None and self.record_dp.placement == "local"
                       else None, dp_sgd_rounds=self.rounds)

    strategy: Literal["fedavg", "fedprox", "scaffold", "fednova", "ifca", "fedper"] = "fedavg"
    clusters: int = Field(default=2, ge=2, description="IFCA: number of cluster models k (at most 8)")
    personal_layers: int = Field(default=1, ge=1, description="FedPer: final linear layers kept local")
    mu: float = Field(default=0.01, ge=0, description="FedProx proximal weight")
    contribution_temperature: float | None = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="T of client contribution normalisation (secureflhv.horizontal.contribution); null = off")
    fraction: float = Field(default=1.0, gt=0, le=1, description="share of clients sampled per round")
    aggregation: AggregationParams = AggregationParams()
    part_clips: dict[Literal["control", "nova"], float] = Field(
        default_factory=dict, description="clip of SCAFFOLD's control / FedNova's a_i parts")
    preprocessing: fed_prep.FederatedPreprocessingParams | None = Field(
        default=None, description="federated imputation / one-hot / standardisation before training")

    @property
    def raw_features(self) -> bool:
        """Whether clients train on their columns as read (no ``params.preprocessing``); preflight reads it."""
        return self.preprocessing is None

    def party_checks(self, cfg: JobConfig, party: PartySpec) -> list[tuple[str, str]]:
        """Preflight of the user's code at ``party`` (:mod:`.user_code`): (job-file field, problem)."""
        return user_code.party_checks(cfg, party, self)

    @property
    def accepts_missing_values(self) -> bool:
        """Preflight: empty cells are fine when the federated preprocessing imputes them."""
        return self.preprocessing is not None


def check(cfg: JobConfig, params: HorizontalJobParams) -> None:
    """The aggregation settings fit the job: a valid threshold for the clients sampled per round, and
    never a secure aggregate of one client (it would reveal that client's update)."""
    try:
        agg = fl_config(cfg, params).aggregation
    except AggregationConfigError as exc:
        raise JobConfigError(f"params.aggregation.{exc.field}: {exc}") from None
    n = len(cfg.clients)
    m = max(1, int(n * params.fraction))
    if m < agg.smallest_round():
        raise JobConfigError(f"params.fraction: selects {m} of {n} clients per round, fewer than the {agg.smallest_round()} "
                             f"a round needs (params.aggregation.min_clients={agg.min_clients}, max_colluders="
                             f"{agg.max_colluders}: a sum of fewer reveals a client's update to the server and the "
                             f"colluders); add clients, raise the fraction, or see docs/security.md on two-client "
                             f"rounds")
    try:
        agg.resolve_threshold(m)
    except AggregationConfigError as exc:
        raise JobConfigError(f"params.aggregation.{exc.field}: {exc} (fraction {params.fraction} of {n} clients)") \
            from None
    if params.preprocessing is not None:
        fed_prep.check_dp(params.preprocessing.dp, agg)
    user_data = any(p.data is not None and p.data.factory is not None for p in cfg.clients)
    if params.preprocessing is not None and (isinstance(params.model, UserModelSpec) or user_data):
        raise JobConfigError("params.preprocessing: federated preprocessing works on tables for the built-in models; "
                             "a user's model or dataset does its own (remove params.preprocessing)")
    if params.dp is not None:
        _check_dp(cfg, params)
    if params.record_dp is not None:
        _check_record_dp(cfg, params)
    if params.optimizer != "sgd" and params.strategy in ("scaffold", "fednova"):
        raise JobConfigError(f"params.optimizer: {params.strategy}'s update assumes SGD (its control variates / its "
                             f"normaliser a_i are defined for SGD steps); use optimizer: sgd")
    if params.lr_scheduler is not None:
        try:
            lrs = params.local_config().round_lrs(params.rounds)
        except (TypeError, ValueError) as exc:
            raise JobConfigError(f"params.lr_scheduler: {params.lr_scheduler.name}: {exc}") from None
        bad = [r for r, lr in enumerate(lrs, 1) if not lr > 0]
        if bad:
            raise JobConfigError(f"params.lr_scheduler: {params.lr_scheduler.name} gives learning rate {lrs[bad[0] - 1]} "
                                 f"in round {bad[0]} of {params.rounds} (every round must train: e.g. eta_min > 0, "
                                 f"or T_max >= rounds)")
    if params.strategy == "ifca" and params.contribution_temperature is not None:
        raise JobConfigError("params.contribution_temperature: contribution normalisation re-weights sample-weighted "
                             "updates (FedAvg family, FedPer); IFCA's cluster averages are unweighted (set it to null)")
    if params.strategy == "ifca" and params.clusters > PARTS_PER_ROUND:
        raise JobConfigError(f"params.clusters: {params.clusters} IFCA clusters exceed the {PARTS_PER_ROUND} "
                             f"aggregations of a round")


def _check_dp(cfg: JobConfig, params: HorizontalJobParams) -> None:
    """What client-level DP needs of the job: a single model part (FedAvg, FedProx), no contribution
    normalisation (it re-weights the clipped updates), δ below 1 / clients."""
    if params.strategy not in ("fedavg", "fedprox"):
        raise JobConfigError(f"params.dp: client-level DP clips and noises the model delta of FedAvg / FedProx; "
                             f"{params.strategy} sends other parts (use strategy fedavg or fedprox)")
    if params.contribution_temperature is not None:
        raise JobConfigError("params.dp: contribution normalisation re-weights the clipped updates, which changes "
                             "the sensitivity (set contribution_temperature to null)")
    if params.dp.placement == "distributed" and params.aggregation.kind == "plain":
        raise JobConfigError("params.dp.placement: distributed noise is added in the ring of secure aggregation; "
                             "aggregation kind plain has none (use secagg)")
    if params.dp.placement == "distributed" and params.dp.accountant != "rdp":
        raise JobConfigError("params.dp.accountant: the Skellam mechanism of placement distributed is accounted "
                             "with its RDP bound (use rdp)")
    if not params.dp.delta < 1 / len(cfg.clients):
        raise JobConfigError(f"params.dp.delta: {params.dp.delta:g} is not below 1 / {len(cfg.clients)} clients: "
                             f"such a δ allows releasing one client's data outright")
    if params.dp.placement == "distributed" and isinstance(params.model, ModelSpec) and params.preprocessing is None:
        dim = get_flat(build_model(params.model, seed=params.seed)).size
        try:  # a built-in model's size is known now: plan for it, so a ring too small fails at validation
            dp_config(cfg, params).bound(dim)
        except ValueError as exc:
            raise JobConfigError(str(exc)) from None


def _check_record_dp(cfg: JobConfig, params: HorizontalJobParams) -> None:
    """What DP-SGD at the clients needs of the job: a strategy whose every use of the training records is the
    noised steps (:data:`~secureflhv.horizontal.dp_sgd.DP_SGD_STRATEGIES`; IFCA also picks its cluster by the
    training loss), no contribution normalisation (it scores the trained model on the training rows)."""
    if params.strategy not in DP_SGD_STRATEGIES:
        raise JobConfigError(f"params.record_dp: DP-SGD covers {', '.join(DP_SGD_STRATEGIES)}; {params.strategy} "
                             f"reads the training records outside the noised steps")
    if params.contribution_temperature is not None:
        raise JobConfigError("params.record_dp: contribution normalisation scores the trained model on the training "
                             "rows outside DP-SGD (set contribution_temperature to null)")
    if params.record_dp.placement == "distributed":
        _check_record_sum(cfg, params)


def _check_record_sum(cfg: JobConfig, params: HorizontalJobParams) -> None:
    """What distributed record-level DP-GD needs: FedAvg's single model part, the ring of secure aggregation, the
    built-in training step (the server steps SGD without momentum), its RDP accountant, no client-level DP on the
    same model part; a built-in model is planned now, so a ring too small fails at validation."""
    rec, field = params.record_dp, "params.record_dp"
    problems = [
        (params.strategy != "fedavg", f"{field}.placement: distributed DP-GD takes one noised step per round from "
                                      f"the clients' gradient sums (strategy fedavg, not {params.strategy})"),
        (params.aggregation.kind == "plain", f"{field}.placement: distributed noise is added in the ring of secure "
                                             f"aggregation; aggregation kind plain has none (use secagg)"),
        (params.dp is not None, f"{field}.placement: distributed record-level DP and params.dp (client-level) both "
                                f"own the model's aggregation; use one"),
        (params.train is not None, f"{field}.placement: distributed DP-GD computes the per-record gradients itself; "
                                   f"a user training loop (params.train) cannot be used with it"),
        (params.optimizer != "sgd" or params.momentum != 0, f"{field}.placement: the server takes plain gradient "
                                                            f"steps (optimizer sgd, momentum 0)"),
        (rec.accountant != "rdp", f"{field}.accountant: the Skellam mechanism is accounted with its RDP bound (use "
                                  f"rdp)"),
    ]
    for bad, why in problems:
        if bad:
            raise JobConfigError(why)
    if isinstance(params.model, ModelSpec) and params.preprocessing is None:
        dim = get_flat(build_model(params.model, seed=params.seed)).size
        try:
            dp_config(cfg, params).bound(dim)
        except ValueError as exc:
            raise JobConfigError(str(exc)) from None


def dp_config(cfg: JobConfig, params: HorizontalJobParams) -> ClientDP | None:
    """The protocol's client-level DP (None without ``params.dp``), derived from the job alone, so the same at every
    party: central (:class:`~secureflhv.horizontal.dp_fedavg.CentralDP`, z as given or calibrated for
    ``target_epsilon`` over ``params.rounds``) or distributed (:class:`~secureflhv.horizontal.dp_distributed.
    DistributedDP`, planned for the model's dimension by each role)."""
    dp = params.dp
    if params.record_dp is not None and params.record_dp.placement == "distributed":
        return _record_sum_dp(cfg, params)
    if dp is None:
        return None
    if dp.placement == "distributed":
        return _distributed_dp(cfg, params)
    z = dp.noise_multiplier
    if z is None:
        from ...dp.accounting import noise_multiplier_for

        z = noise_multiplier_for(dp.target_epsilon, dp.delta, params.rounds, params.fraction, amplification=False,
                                 accountant=dp.accountant)
    return CentralDP(clip_norm=dp.clip_norm, noise_multiplier=z, delta=dp.delta, epsilon_budget=dp.epsilon_budget,
                     accountant=dp.accountant, sampling_rate=params.fraction, noise_seed=dp.noise_seed)


def _distributed_dp(cfg: JobConfig, params: HorizontalJobParams) -> DistributedDP:
    """Client-level distributed DP-FedAvg, planned for every round size the job allows (:func:`_round_sizes`)."""
    dp, agg = params.dp, _aggregation(cfg, params)
    sizes = _round_sizes(cfg, params, agg)
    return DistributedDP(clip_norm=dp.clip_norm, bits=dp.bits, aggregation=agg, sizes=tuple(sizes),
                         noise_multiplier=dp.noise_multiplier, target_epsilon=dp.target_epsilon, rounds=params.rounds,
                         job_seed=params.seed, delta=dp.delta, epsilon_budget=dp.epsilon_budget,
                         sampling_rate=params.fraction, noise_seed=dp.noise_seed)


def _round_sizes(cfg: JobConfig, params: HorizontalJobParams, agg: AggregationConfig) -> list[tuple[int, int]]:
    """Every round size the job allows (up to ``fraction`` of the clients, at least the aggregation's smallest
    round) with its fewest honest survivors t - c."""
    sizes = []
    for n in range(agg.smallest_round(), max(1, int(len(cfg.clients) * params.fraction)) + 1):
        try:
            sizes.append((n, agg.resolve_threshold(n) - agg.max_colluders))
        except AggregationConfigError:  # such a round fails anyway
            continue
    if not sizes:
        raise JobConfigError(f"params.aggregation: no round of this job can be aggregated (min_clients "
                             f"{agg.min_clients}, {len(cfg.clients)} clients, fraction {params.fraction:g})")
    return sizes


def _record_sum_dp(cfg: JobConfig, params: HorizontalJobParams) -> RecordSumDP:
    """Distributed record-level DP-GD (:class:`~secureflhv.horizontal.dp_record_sum.RecordSumDP`) from the job."""
    rec, agg, local = params.record_dp, _aggregation(cfg, params), params.local_config()
    return RecordSumDP(clip_norm=rec.clip_norm, bits=rec.bits, aggregation=agg,
                       least_honest=min(h for _, h in _round_sizes(cfg, params, agg)),
                       lrs=tuple(local.round_lrs(params.rounds)), weight_decay=local.weight_decay,
                       noise_multiplier=rec.noise_multiplier, target_epsilon=rec.target_epsilon, rounds=params.rounds,
                       job_seed=params.seed, delta=rec.delta, noise_seed=rec.noise_seed,
                       chunk=params.batch_size)


def _aggregation(cfg: JobConfig, params: HorizontalJobParams) -> AggregationConfig:
    a = params.aggregation.model_dump()
    if a["input_timeout_s"] is None:
        a["input_timeout_s"] = cfg.job.deadline_s
    return AggregationConfig(**a, job_clients=tuple(c.id for c in cfg.clients))


def fl_config(cfg: JobConfig, params: HorizontalJobParams) -> FLConfig:
    """The protocol's :class:`FLConfig` from the job: local training, aggregation (bound to the job's clients),
    per-part clip ranges, and timeouts (``round_timeout_s``, else the job deadline). ValueError from the
    config's own checks.
    """
    local = params.local_config()
    timeout = params.round_timeout_s or cfg.job.deadline_s
    return FLConfig(rounds=params.rounds, fraction=params.fraction, seed=params.seed, local=local,
                    aggregation=_aggregation(cfg, params), part_clips={**DEFAULT_PART_CLIPS, **params.part_clips},
                    contribution_temperature=params.contribution_temperature, dp=dp_config(cfg, params),
                    # a send may retry for a quarter of a client's wait, so a slow delivery to one
                    # client never makes the others give up on the server
                    round_timeout_s=timeout, send_timeout_s=min(30.0, timeout / 4))


def load_client_data(cfg: JobConfig, party: PartySpec, params: LocalTrainingParams):
    """(X, y) of a client: X float32 (n, n_features) of its table, or the :class:`DatasetRows` of its dataset
    factory (``data.factory``); y int64 (n,) class ids, regression: float64 targets. JobConfigError naming the
    party's data."""
    if party.data.factory is not None:
        X, y = user_code.load_dataset(cfg, party)
        where, path = cfg.where(party, "data.factory"), party.data.factory
    else:
        table = load_party_table(cfg, party, label_column=party.data.label_column or params.label_column,
                                 require_label=True, id_required=False)
        where, path = cfg.where(party, "data"), cfg.resolve(party.data.path)
        X, y = np.asarray(table.X, dtype=np.float32), np.asarray(table.y)
        if params.raw_features and table.n_features != params.model.n_features:
            raise JobConfigError(f"{where}: {path} has {table.n_features} feature columns, params.model.n_features is "
                                 f"{params.model.n_features}")
    if params.model.task == "regression":
        if not np.issubdtype(y.dtype, np.number) or not np.all(np.isfinite(np.asarray(y, float))):
            raise JobConfigError(f"{where}: regression targets in {path} must be finite numbers")
        y = np.asarray(y, np.float64)
    elif not np.issubdtype(y.dtype, np.number) or not np.all(np.asarray(y, float) == np.round(np.asarray(y, float))):
        raise JobConfigError(f"{where}: labels in {path} must be integer class ids 0..n_classes-1")
    else:
        y = y.astype(np.int64)
    if params.model.task == "classification" and len(y) and (y.min() < 0 or y.max() >= params.model.n_classes):
        raise JobConfigError(f"{where}: labels in {path} range {y.min()}..{y.max()}, outside 0.."
                             f"{params.model.n_classes - 1} (params.model.n_classes)")
    return X, y


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


def _save_bundle(cfg: JobConfig, party: PartySpec, params: HorizontalJobParams, arrays: dict, metrics: dict,
                 prep: dict | None = None, privacy: dict | None = None, layout: str = "") -> None:
    """The global model as a bundle: ``model.safetensors`` (the torch ``state_dict``, float32) and the
    architecture in the config (:func:`secureflhv.load_model` rebuilds and runs it); with federated
    preprocessing its state (``prep``: input columns, preprocessor, pooled statistics); with ``params.dp`` its
    ``privacy`` record; a user model's ``layout`` digest (``extra.layout_hash``)."""
    spec = params.model
    task = "regression" if spec.task == "regression" else ("binary" if spec.n_classes == 2 else "multiclass")
    config = params.model_dump(mode="json")
    if isinstance(spec, UserModelSpec):  # the bundle holds the whole state_dict: no initial weights file needed
        config["model"]["weights"] = None
        extra = {"layout_hash": layout}  # the role's ParamLayout digest, agreed before round 1
    else:
        extra = {"n_features": spec.n_features}
    if privacy:  # the (ε, δ) of the released model, its mechanism and parameters
        extra["privacy"] = privacy
    save_job_bundle(cfg, party, files={"model.safetensors": arrays}, config=config,
                    metrics=metrics, extra=extra, task=task,
                    feature_names=prep["input_features"] if prep else None, preprocessing=prep)


def bundle_arrays(params: HorizontalJobParams, vec: np.ndarray, model=None) -> dict[str, np.ndarray]:
    """The arrays of a model bundle for the flat vector ``vec``: a built-in model's parameters (float32), or a
    user model's whole ``state_dict`` (``model``: this client's own, with its local batch-norm state under
    FedBN; default a fresh one from the factory and the job's seed) with ``vec`` loaded."""
    if not isinstance(params.model, UserModelSpec):
        return named_arrays(build_model(params.model), vec)
    model = build_model(params.model, seed=params.seed) if model is None else copy.deepcopy(model)
    set_flat(model, vec)
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def _check_width(params: HorizontalJobParams, pre, where: str) -> None:
    if len(pre.output_names) != params.model.n_features:
        raise JobConfigError(f"{where}: the federated preprocessing gives {len(pre.output_names)} features "
                             f"{pre.output_names[:8]}{'...' if len(pre.output_names) > 8 else ''}; set "
                             f"params.model.n_features to {len(pre.output_names)}")


def _preprocess_server(cfg: JobConfig, party: PartySpec, transport: Transport, params: HorizontalJobParams,
                       config: FLConfig) -> dict | None:
    """The server's part of the federated preprocessing (before training); its bundle state or None."""
    if params.preprocessing is None:
        return None
    stats = fed_prep.run_server(cfg, party, transport, config.aggregation, ranges=params.preprocessing.ranges,
                                dp=params.preprocessing.dp)
    pre = fed_prep.preprocessor_of(stats, params.preprocessing, "params.preprocessing")
    _check_width(params, pre, "params.model.n_features")
    return fed_prep.bundle_state(stats, pre, cfg.clients[0].data.table_schema)   # clients agreed on the columns


def _preprocess_client(cfg: JobConfig, party: PartySpec, transport: Transport, params: HorizontalJobParams,
                       config: FLConfig, X: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, dict | None]:
    """Federated preprocessing of this client's rows (statistics of its training rows); returns the
    transformed float32 features and the bundle state, or ``X`` unchanged and None when it is off."""
    if params.preprocessing is None:
        return X, None
    # the float64 table (X was cast to float32): the bundle scores raw float64 rows the same way
    table = load_party_table(cfg, party, label_column=party.data.label_column or params.label_column,
                             require_label=True, id_required=False)
    X64 = np.asarray(table.X, dtype=np.float64)
    stats = fed_prep.run_client(cfg, party, transport, config.aggregation, X64[train], table.feature_names,
                                table.categories, ranges=params.preprocessing.ranges, dp=params.preprocessing.dp)
    pre = fed_prep.preprocessor_of(stats, params.preprocessing, cfg.where(party, "data"))
    _check_width(params, pre, "params.model.n_features")
    return pre.transform(X64).astype(np.float32), fed_prep.bundle_state(stats, pre, party.data.table_schema)


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: HorizontalJobParams, *,
        resume: bool = False) -> dict:
    """Run this party's role of a horizontal job; return a summary (also saved as artifacts).

    Raises JobConfigError for bad data, TransportError when the server or too many clients fail,
    AggregationError when a round keeps fewer than t clients. ``resume``: continue from the last checkpoint
    every party holds (``--resume``, :func:`~secureflhv.runtime.store.resume.role_lifecycle`).
    """
    if isinstance(params.model, UserModelSpec):  # the factory's folder and weights, relative to the job file
        params = params.model_copy(update={"model": params.model.resolved(cfg.base_dir)})
    config = fl_config(cfg, params)
    strategy = make_strategy(params.strategy, mu=params.mu, clusters=params.clusters,
                             personal_layers=params.personal_layers)
    if config.aggregation.kind in ("plain", "plain_quantised"):
        log.warning("%s: aggregation kind %r: the server sees every client's update", party.id,
                    config.aggregation.kind)
    if party.role == "server":
        return _run_server(cfg, party, transport, params, config, strategy, resume)
    return _run_client(cfg, party, transport, params, config, strategy, resume)


def _run_server(cfg: JobConfig, party: PartySpec, transport: Transport, params: HorizontalJobParams,
                config: FLConfig, strategy, resume: bool) -> dict:
    regression = params.model.task == "regression"

    def on_round(rec: RoundRecord, _vec) -> None:
        if regression and rec.test_metrics:
            r2 = rec.test_metrics["r2"]
            emit_progress("rounds", rec.round, params.rounds, f"R² {r2:.4f}", {"train loss": rec.train_loss,
                                                                               "test R²": r2})
            return
        eps = {"ε": rec.privacy["epsilon"]} if rec.privacy else {}
        emit_progress("rounds", rec.round, params.rounds,
                      (f"accuracy {rec.test_accuracy:.4f}" if rec.test_n else f"loss {rec.train_loss:.4f}")
                      + (f", ε {eps['ε']:.3g}" if eps else ""),
                      {"train loss": rec.train_loss, **({"test accuracy": rec.test_accuracy} if rec.test_n else {}),
                       **eps})

    clients = [p.id for p in cfg.clients]
    prep = _preprocess_server(cfg, party, transport, params, config)
    server = HorizontalServer(transport, clients, params.model, strategy, config, on_round=on_round,
                              **role_lifecycle(cfg, party, transport, resume))
    history = server.run()
    out_dir = cfg.output_dir(party.id)
    arrays = bundle_arrays(params, server.global_vec)
    out_dir.mkdir(parents=True, exist_ok=True)
    npz = out_dir / "global_model.npz"
    np.savez(npz, **arrays)
    final = _record_json(history[-1]) if history else {}
    if params.strategy == "ifca":  # every cluster model (the global one is the most chosen cluster)
        blank = build_model(params.model, seed=params.seed)
        np.savez(out_dir / "cluster_models.npz", **{f"cluster{j}/{k}": v for j, vec in enumerate(strategy.clusters)
                                                    for k, v in named_arrays(blank, vec).items()})
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "strategy": params.strategy,
                                          "rounds": [_record_json(r) for r in history], "final": final})
    acc = [r.test_accuracy for r in history]
    plot = None
    r2 = [r.test_metrics.get("r2", float("nan")) for r in history]
    if regression and any(math.isfinite(v) for v in r2):
        plot = plot_curves(out_dir / "r2.png", {"R² over the clients' local test rows": r2},
                           title=f"{params.strategy}, job {cfg.job.id}", xlabel="round", ylabel="R²")
    elif any(math.isfinite(a) for a in acc):
        plot = plot_curves(out_dir / "accuracy.png", {"clients' local test accuracy": acc,
                                                      "worst client": [r.worst_client_accuracy for r in history]},
                           title=f"{params.strategy}, job {cfg.job.id}", xlabel="round", ylabel="accuracy")
    _save_bundle(cfg, party, params, arrays, final, prep, privacy=final.get("privacy"), layout=server.layout.digest())
    log.info("%s: done: %d rounds, final %s; model %s; plot %s", party.id, len(history),
             (f"R² {r2[-1]:.4f}" if regression else f"accuracy {history[-1].test_accuracy:.4f}") if history else "-",
             npz, plot)
    return final


def _final_metrics(cfg: JobConfig, party: PartySpec, params: HorizontalJobParams, client: HorizontalClient,
                   X_test: np.ndarray, y_test: np.ndarray, rows: np.ndarray) -> dict:
    """The task's metrics of the last global model on this client's local test rows (numbers ``rows`` of
    its data file), ``predictions.csv`` and the plots (:func:`secureflhv.data.metrics.task_metrics`); ``{}``
    without test rows. The model is the one :func:`secureflhv.load_model` rebuilds from the bundle
    (IFCA / FedPer clients: their global part)."""
    import pandas as pd
    import torch

    if not len(y_test):
        return {}
    # a user model: this client's own (its local batch-norm state under FedBN), with the global tensors loaded
    model = copy.deepcopy(client.model) if isinstance(params.model, UserModelSpec) else build_model(params.model)
    set_flat(model, client.global_vec)
    model.train(False)  # inference mode
    with torch.no_grad():
        if isinstance(X_test, DatasetRows):
            device = model_device(model)
            out = torch.cat([model(input_batch(X_test, s, s + 256).to(device)).cpu()
                             for s in range(0, len(y_test), 256)])
        else:
            out = model(torch.from_numpy(np.asarray(X_test, np.float32)))
    if params.model.task == "regression":
        scores, task = out[:, 0].double().numpy(), "regression"
    else:
        p = torch.softmax(out.double(), dim=1).numpy()  # float64: rows sum to 1 for log loss
        scores, task = (p[:, 1], "binary") if p.shape[1] == 2 else (p, "multiclass")
    metrics = task_metrics(y_test, scores, task)
    cols = {"row": rows, "label": y_test}
    if scores.ndim == 2:
        cols.update({f"p{c}": scores[:, c] for c in range(scores.shape[1])})
    else:
        cols["value" if task == "regression" else "probability"] = scores
    pd.DataFrame(cols).to_csv(cfg.output_dir(party.id) / "predictions.csv", index=False, float_format="%.17g")
    save_task_plots(cfg.output_dir(party.id), y_test, scores, task,
                    f"{params.strategy}, job {cfg.job.id}, {party.id} local test rows")
    return {"task": task, "test": metrics}


def _client_privacy(client: HorizontalClient, rounds_seen: int) -> dict | None:
    """A client's own bounds on the released model's privacy. Client-level (``params.dp``): every round it received
    counted as released (an upper bound: a refused round releases nothing), so it need not trust the server's
    figure. Record-level (``params.record_dp``): its DP-SGD accountant over every step it trained, under
    ``record_level`` (or alone without ``params.dp``)."""
    config, record = client.config, client.record_privacy
    if config.dp is None or not rounds_seen:
        return record
    acc = config.dp.accountant_for()
    for _ in range(rounds_seen):
        acc.step()
    out = {**acc.record(config.dp.delta), **config.dp.describe(), "bound": "at most: every round received counted"}
    return out if record is None else {**out, "record_level": record}


def _record_dp_progress(params: HorizontalJobParams):
    """With DP-SGD, a client's progress line per round carries its own ε (the job page's curve); None otherwise."""
    if params.record_dp is None or params.record_dp.placement != "local":
        return None  # distributed: the server's ε is the job's, on its progress line

    def on_round(h: dict) -> None:
        eps = h.get("record_epsilon")
        emit_progress("rounds", h["round"], params.rounds, "" if eps is None else f"record-level ε {eps:.3g}",
                      {} if eps is None else {"record ε": eps})
    return on_round


def _run_client(cfg: JobConfig, party: PartySpec, transport: Transport, params: HorizontalJobParams,
                config: FLConfig, strategy, resume: bool) -> dict:
    X, y = load_client_data(cfg, party, params)
    split = local_split(len(y), params.test_fraction, params.seed, party.id)
    train, test = split.train, split.test
    X, prep = _preprocess_client(cfg, party, transport, params, config, X, train)
    log.info("%s: %d rows (%d train, %d local test) of shape %s from %s", party.id, len(y), len(train), len(test),
             list(X.shape[1:]), party.data.factory or cfg.resolve(party.data.path))
    strategy.loop = user_code.make_loop(cfg, party, params)
    device = user_code.resolve_device(params.device)
    try:
        client = HorizontalClient(transport, cfg.server.id, take(X, train), y[train], take(X, test), y[test],
                                  params.model, strategy, config, device=device, on_round=_record_dp_progress(params),
                                  **role_lifecycle(cfg, party, transport, resume))
    except ValueError as exc:
        raise JobConfigError(f"{cfg.where(party, 'data')}: {exc}") from None
    history = client.run()
    final = {}
    if client.global_vec is not None:  # the last global model the server sent: every client can score with it
        _save_bundle(cfg, party, params, bundle_arrays(params, client.global_vec, client.model),
                     _finite(history[-1]) if history else {}, prep, privacy=_client_privacy(client, len(history)),
                     layout=client.layout.digest())
        final = _final_metrics(cfg, party, params, client, take(X, test), y[test], test)
    write_json(cfg.output_dir(party.id) / "metrics.json",
               {"job_id": cfg.job.id, "party_id": party.id, "n_train": len(train), "n_test": len(test),
                "rounds": _finite(history), "final": final})
    return history[-1] if history else {}
