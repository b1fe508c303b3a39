"""Vertical SecureBoost as a job (``algorithm: secureboost_vertical``): prepare data, train, predict, save.

Guest and hosts run the shared preparation (:func:`secureflhv.runtime.job.data_prep.prepare_vertical`: load,
PSI, the same seeded train/validation/test split at every party; no standardisation, trees do not need
it), then training (:mod:`secureflhv.tree.vertical`; the guest holds the Paillier key, so a server in the
job file takes no part) and federated prediction of all aligned rows. The guest writes ``metrics.json``
(train/test AUC, accuracy or RMSE) and ``predictions.csv`` (held-out rows). Guest and hosts write a model
bundle (:mod:`secureflhv.runtime.store.model_bundle`): the guest's trees ``model.json`` (host splits as
record ids), a host's private split table ``split_table.json``
(record id -> [feature index, bin, threshold, default_left]; an infinite threshold as "inf" / "-inf"),
for the prediction job.

Checkpoints (:mod:`secureflhv.runtime.store.checkpoint`): guest and hosts save their state after each boosting
round (step = rounds done); with ``--resume`` they agree on a step (:mod:`secureflhv.runtime.store.resume`) and
continue after it, ending with the uninterrupted run's trees (given ``shuffle_seed``).
"""
from __future__ import annotations

import logging
from typing import ClassVar

import numpy as np
from pydantic import ConfigDict

from ...crypto.homomorphic.key_prefetch import prefetch_keypair
from ...data.stream import batched_quantile_cuts, row_batches
from ...transport import Transport
from ...tree.model import json_number, model_to_dict
from ...tree.params import SecureBoostParams, transform
from ...tree.vertical import SecureBoostGuest, SecureBoostHost
from ..store.artifacts import write_json
from ..job.data_prep import ValidationSplitParams, ChainedInputParams, prepare_vertical
from ..job.job_file import JobConfig, PartySpec
from ..store.model_bundle import save_job_bundle
from ..observe.reports import evaluate_split, objective_metrics, objective_task, save_task_plots
from ..store.resume import role_lifecycle

log = logging.getLogger("secureflhv.job")


class SecureBoostSplitParams(SecureBoostParams, ValidationSplitParams):
    """SecureBoost's parameters plus the split (with validation rows), as both SecureBoost jobs take them
    (missing cells accepted: the trees learn a default direction for them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    accepts_missing_values: ClassVar[bool] = True


class SecureBoostJobParams(SecureBoostSplitParams, ChainedInputParams):
    """``params``: :class:`secureflhv.tree.params.SecureBoostParams` plus the split (with validation rows)
    and the chaining after a binning job (``woe_from``).

    ``insecure_test_key`` follows ``security.insecure_test_keys``. Empty numeric cells are accepted
    (``accepts_missing_values``): the trees learn a default direction for missing values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


def tree_params(params: SecureBoostParams) -> SecureBoostParams:
    """The algorithm's own parameters, without the job's split fields."""
    return SecureBoostParams(**params.model_dump(include=set(SecureBoostParams.model_fields)))


def _save_test_predictions(out_dir, data, pred: np.ndarray) -> None:
    """``predictions.csv`` of the held-out rows: id, label, probability (binary) / p0.. / value."""
    import pandas as pd

    rows = data.split.test
    if not len(rows):
        return
    cols = {"id": data.ids[rows], "label": data.y[rows]}
    p = pred[rows]
    if p.ndim == 2:
        cols.update({f"p{c}": p[:, c] for c in range(p.shape[1])})
    else:
        cols["value" if data.meta["params"].get("objective") == "regression" else "probability"] = p
    pd.DataFrame(cols).to_csv(out_dir / "predictions.csv", index=False, float_format="%.17g")


def _data_parties(cfg: JobConfig, party: PartySpec) -> list[str]:
    """The parties that agree on a checkpoint with ``party``: guest and hosts (a server takes no part)."""
    return [p.id for p in cfg.parties if p.id != party.id and p.role in ("guest", "host")]


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: SecureBoostJobParams, *,
        resume: bool = False) -> dict:
    """Run this party's role; returns the guest's metrics (empty dict elsewhere)."""
    if party.role == "server":
        log.info("%s: vertical SecureBoost needs no server (the guest holds the key); nothing to do", party.id)
        return {}
    out_dir = cfg.output_dir(party.id)
    algo = tree_params(params)
    # the guest's key is generated while PSI and the split run (OU at 2048 bits: 0.3-5 s)
    keys = prefetch_keypair(algo.he_scheme, algo.key_bits, algo.insecure_test_key) if party.role == "guest" else None
    data = prepare_vertical(cfg, party, transport, params, validation_fraction=params.validation_fraction)
    X = np.asarray(data.X, dtype=np.float64)  # no copy of an aligned float64 table (a big party: GBs)
    X_val = data.split.validation(X)
    cuts = None
    if data.batch_rows:  # a big table: the same quantile cuts, found in row batches (bounded memory)
        cuts = batched_quantile_cuts(row_batches(X, data.train, data.batch_rows), X.shape[1], algo.max_bin)
    if party.role == "host":
        host = SecureBoostHost(transport, cfg.guest.id, X[data.train], algo, X_val=X_val, cuts=cuts,
                               **role_lifecycle(cfg, party, transport, resume, _data_parties(cfg, party)))
        host.fit()
        host.serve_predictions(X)
        records = [[j, b, json_number(thr), dl] for j, b, thr, dl in host.records]
        save_job_bundle(cfg, party, files={"split_table.json": records},
                        feature_names=data.feature_names, config=algo.model_dump(mode="json"), public_key=host.pub)
        return {}
    y = data.y
    guest = SecureBoostGuest(transport, [h.id for h in cfg.hosts], X[data.train], y[data.train], algo,
                             X_val=X_val, y_val=data.split.validation(y), cuts=cuts, keypair=keys,
                             **role_lifecycle(cfg, party, transport, resume, _data_parties(cfg, party)))
    res = guest.fit()
    pred = transform(guest.predict_margin(X), algo)
    guest.end_prediction()
    metrics, _ = evaluate_split(y, data.split, lambda rows: pred[rows],
                                lambda y_, p_: objective_metrics(y_, p_, algo.objective))
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "metrics": metrics, "tree_seconds": res.tree_seconds,
                                          "stopped_early": res.stopped_early, "val_losses": res.model.val_losses})
    task = objective_task(algo.objective)
    save_job_bundle(cfg, party, files={"model.json": model_to_dict(res.model)}, feature_names=data.feature_names,
                    config=algo.model_dump(mode="json"), metrics=metrics, public_key=guest.pub, task=task)
    _save_test_predictions(out_dir, data, pred)
    if len(data.split.test):
        rows = data.split.test
        save_task_plots(out_dir, y[rows], pred[rows], task, f"SecureBoost, job {cfg.job.id}, test rows")
    log.info("%s: %d trees, metrics %s", party.id, len(res.model.trees), metrics.get("test", metrics["train"]))
    return metrics
