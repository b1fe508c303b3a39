"""The job registry: every algorithm a job file can name, in one place.

A :class:`~secureflhv.runtime.job.spec.JobSpec` (:mod:`secureflhv.runtime.job.spec`) is the one
description of an algorithm: family, ``params`` model, ``run``, how its bundles are scored (a federated
``predict`` protocol, or a ``local_model``), its task rule. This module registers the built-in
algorithms in :data:`JOBS`; config validation, ``secureflhv validate / party / run``, the prediction
job, :func:`secureflhv.load_model` and the table in ``docs/architecture.md`` (:func:`registry_table`)
read them from there.

Adding an algorithm = one module under ``secureflhv/runtime/algorithms/`` (a params model and a ``run``
function; see ``docs/architecture.md``) + one :func:`register_job` (a built-in: one loader below, in
``_LOADERS``).
"""
from __future__ import annotations

from pydantic import BaseModel

from ..store.loaded_model import torch_scorer, torch_task, tree_scorer, tree_task
from .job_file import JobConfig
from .spec import FAMILY_RULES, JOBS, JobSpec, job_spec, register_job, unregister_job

__all__ = ["FAMILY_RULES", "JOBS", "JobSpec", "job_params", "job_spec", "register_job", "registry_table",
           "unregister_job"]  # and BUILTINS, through __getattr__

# Each built-in is built by a loader that imports its job module when the entry is first read (JobTable): a
# vertical party process then never imports torch, which the horizontal modules need (about 3 s of start-up).


def _vertical_lr() -> JobSpec:
    from ..algorithms import predict, vertical_lr
    return JobSpec("vertical_lr", "vertical", "logistic regression, Paillier-encrypted gradients (Hardy et al. 2017)",
                   vertical_lr.VerticalLRJobParams, vertical_lr.run, vertical_lr.check, predict=predict.vertical_lr)


def _vertical_nn() -> JobSpec:
    from ..algorithms import predict, vertical_nn
    return JobSpec("vertical_nn", "vertical", "split neural network, Paillier interactive layer (Zhang et al. 2020)",
                   vertical_nn.VerticalNNJobParams, vertical_nn.run, vertical_nn.check, predict=predict.vertical_nn)


def _secureboost_vertical() -> JobSpec:
    from ..algorithms import predict, secureboost_vertical
    return JobSpec("secureboost_vertical", "vertical", "SecureBoost histogram GBDT, Paillier (Cheng et al. 2021)",
                   secureboost_vertical.SecureBoostJobParams, secureboost_vertical.run,
                   predict=predict.secureboost_vertical, task=tree_task)


def _horizontal() -> JobSpec:
    from ..algorithms import horizontal_fl
    return JobSpec("horizontal", "horizontal", "FedAvg / FedProx / SCAFFOLD / FedNova (+ contribution "
                   "normalisation), IFCA, FedPer over secure aggregation",
                   horizontal_fl.HorizontalJobParams, horizontal_fl.run, horizontal_fl.check,
                   local_model=torch_scorer, task=torch_task, data_factories=True)


def _secureboost_horizontal() -> JobSpec:
    from ..algorithms import secureboost_horizontal
    return JobSpec("secureboost_horizontal", "horizontal", "histogram GBDT, histograms through secure aggregation",
                   secureboost_horizontal.HorizontalSecureBoostJobParams, secureboost_horizontal.run,
                   secureboost_horizontal.check, local_model=tree_scorer, task=tree_task)


def _multiconfederated() -> JobSpec:
    from ..algorithms import multiconfederated
    return JobSpec("multiconfederated", "peer", "MultiConfederated learning, decentralised, no server "
                   "(Duchesne et al. 2024)", multiconfederated.MultiConfederatedJobParams, multiconfederated.run,
                   multiconfederated.check, roles=multiconfederated.roles, local_model=torch_scorer, task=torch_task)


def _feature_binning() -> JobSpec:
    from ..algorithms import feature_binning
    return JobSpec("feature_binning", "vertical", "federated binning with WOE / IV and selection by IV, Paillier "
                   "(FATE's hetero feature binning)", feature_binning.FeatureBinningJobParams, feature_binning.run,
                   feature_binning.check, trains=False)


def _feature_selection() -> JobSpec:
    from ..algorithms import feature_selection, predict
    return JobSpec("feature_selection", "vertical", "feature selection by a fitted vertical LR's |w|·std or "
                   "SecureBoost's total gain", feature_selection.FeatureSelectionJobParams, feature_selection.run,
                   predict.check, roles=predict.roles, trains=False)


def _vertical_statistics() -> JobSpec:
    from ..algorithms import vertical_statistics
    return JobSpec("vertical_statistics", "vertical", "cross-party Pearson correlation under Paillier / OU, and "
                   "each party's column statistics", vertical_statistics.VerticalStatisticsJobParams,
                   vertical_statistics.run, vertical_statistics.check, trains=False)


def _scorecard() -> JobSpec:
    from ..algorithms import predict, scorecard
    return JobSpec("scorecard", "vertical", "credit scorecard (PDO points per bin) from a WOE vertical LR, and the "
                   "scores of the job's rows", scorecard.ScorecardJobParams, scorecard.run, predict.check,
                   roles=predict.roles, trains=False)


def _predict() -> JobSpec:
    from ..algorithms import predict
    # every party meets every other, as in a vertical job; the roles follow the trained model
    return JobSpec("predict", "vertical", "score new rows with the model bundles of a trained job (see docs)",
                   predict.PredictJobParams, predict.run, predict.check, roles=predict.roles, trains=False)


_LOADERS = {"vertical_lr": _vertical_lr, "vertical_nn": _vertical_nn, "secureboost_vertical": _secureboost_vertical,
            "horizontal": _horizontal, "secureboost_horizontal": _secureboost_horizontal,
            "multiconfederated": _multiconfederated, "feature_binning": _feature_binning,
            "feature_selection": _feature_selection, "vertical_statistics": _vertical_statistics,
            "scorecard": _scorecard, "predict": _predict}
for _name, _load in _LOADERS.items():
    JOBS.add_loader(_name, _load)  # a re-import (importlib.reload) keeps the table as it is


def __getattr__(name: str):
    """``BUILTINS``: the built-in specs in registration order (reading it imports every job module)."""
    if name == "BUILTINS":
        return tuple(JOBS[n] for n in _LOADERS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def job_params(cfg: JobConfig) -> BaseModel:
    """The validated ``params`` of a job (see :meth:`JobSpec.validate`)."""
    return job_spec(cfg.job.algorithm).validate(cfg)


def _family(spec: JobSpec) -> str:
    if spec.family == "peer":
        return "peer (no server)"
    return f"{spec.family} (own role rule)" if spec.roles is not None else spec.family


def _prediction(spec: JobSpec) -> str:
    if spec.scores_locally:
        return "local: `load_model`; `predict` job, each party its own rows"
    if spec.predict is not None:
        return "`predict` job (federated)"
    return "-"


def _module_path(module: str) -> str:
    return module.replace(".", "/").removeprefix("secureflhv/") + ".py"


def registry_table(specs=None) -> str:
    """The registry as a markdown table (the one in ``docs/architecture.md``, "The job registry"): one row
    per algorithm of ``specs`` (default: every registered one, in registration order) with its family,
    what it trains (``summary``), how its bundles are scored, and its job module."""
    rows = ["| `job.algorithm` | family | what it trains | prediction | job module |",
            "|---|---|---|---|---|"]
    for spec in (JOBS.values() if specs is None else specs):
        rows.append(f"| `{spec.name}` | {_family(spec)} | {spec.summary} | {_prediction(spec)} | "
                    f"`{_module_path(spec.module)}` |")
    return "\n".join(rows) + "\n"
