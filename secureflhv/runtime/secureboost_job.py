"""SecureBoost jobs (vertical and horizontal): load data, align, split, train, evaluate, save.

Algorithms ``secureboost_vertical`` (guest + hosts; a server in the job file takes no part) and
``secureboost_horizontal`` (server + clients); their job modules
(:mod:`secureboost_vertical_job`, :mod:`secureboost_horizontal_job`) re-export :func:`job_params` and
:func:`run_job` from here. ``params`` = :class:`secureflhv.tree.params.SecureBoostParams` fields plus
``test_fraction``, ``split_seed``, ``validation_fraction`` (rows of the training part used for early
stopping) and, horizontal only, ``aggregation`` ("secagg" | "plain_quantised" | "plain") and
``feature_ranges`` (public [lo, hi] per feature; then clients do not reveal their min/max).

Vertical steps: PSI (:mod:`secureflhv.vertical.psi`), the same seeded train/validation/test split of
the aligned rows at every party, training, federated prediction of all aligned rows; the guest writes
``metrics.json`` (train/test AUC, accuracy or RMSE) and its ``model.json`` (host splits as record
ids); each host writes its private split table. Horizontal steps: each client splits its own rows;
the server writes ``model.json`` and ``model.xgboost.json`` (loadable by ``xgboost.Booster``); each
client writes ``metrics.json`` on its own test rows.
"""
from __future__ import annotations

import logging
from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field

from ..data import load_table
from ..transport import Transport
from ..tree.model import model_to_dict
from ..tree.params import SecureBoostParams, transform
from .artifacts import save_model, write_json
from .config import JobConfig, JobConfigError, PartySpec, validate_params

log = logging.getLogger("secureflhv.job")


class SecureBoostJobParams(SecureBoostParams):
    """The job file's ``params`` for SecureBoost (``insecure_test_key`` follows security.insecure_test_keys)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    test_fraction: float = Field(default=0.3, ge=0, lt=1)
    split_seed: int = Field(default=0, ge=0)
    validation_fraction: float = Field(default=0.0, ge=0, lt=1,
                                       description="share of training rows held out for early stopping")
    aggregation: Literal["secagg", "plain_quantised", "plain"] = "secagg"
    feature_ranges: list[tuple[float, float]] | None = None


_JOB_ONLY = {"test_fraction", "split_seed", "validation_fraction", "aggregation", "feature_ranges"}


def job_params(cfg: JobConfig) -> SecureBoostJobParams:
    """Validate ``params``. Raises JobConfigError naming ``params.<field>``."""
    return validate_params(SecureBoostJobParams, cfg)


def _split(n: int, params: SecureBoostJobParams):
    perm = np.random.default_rng(params.split_seed).permutation(n)
    n_test = int(round(params.test_fraction * n))
    test, rest = np.sort(perm[:n_test]), perm[n_test:]
    n_val = int(round(params.validation_fraction * len(rest)))
    return np.sort(rest[n_val:]), np.sort(rest[:n_val]), test


def _metrics(y, pred, params: SecureBoostParams) -> dict:
    from sklearn.metrics import accuracy_score, roc_auc_score

    out = {"n": int(len(y))}
    if params.objective == "regression":
        out["rmse"] = float(np.sqrt(np.mean((pred - y) ** 2)))
    elif params.objective == "binary":
        out["accuracy"] = float(accuracy_score(y, pred >= 0.5))
        if len(np.unique(y)) == 2:
            out["auc"] = float(roc_auc_score(y, pred))
    else:
        out["accuracy"] = float(accuracy_score(y, np.argmax(pred, axis=1)))
    return out


def _load(cfg: JobConfig, spec: PartySpec):
    d = spec.data
    try:
        return load_table(cfg.resolve(d.path), id_column=d.id_column, label_column=d.label_column,
                          feature_columns=d.feature_columns)
    except (OSError, ValueError) as exc:
        raise JobConfigError(f"parties[{spec.id}].data: {exc}") from None


def run_job(cfg: JobConfig, spec: PartySpec, transport: Transport) -> dict:
    """Run this party's role; returns the guest's / a client's metrics (empty dict elsewhere)."""
    params = job_params(cfg)
    if cfg.job.algorithm.endswith("horizontal"):
        return _run_horizontal(cfg, spec, transport, params)
    return _run_vertical(cfg, spec, transport, params)


def _run_vertical(cfg, spec, transport, params) -> dict:
    from ..tree.vertical import SecureBoostGuest, SecureBoostHost
    from ..vertical.psi import align_ids_guest, align_ids_host

    tree_params = SecureBoostParams(**params.model_dump(exclude=_JOB_ONLY))
    out_dir = cfg.output_dir(spec.id)
    if spec.role == "server":
        log.info("%s: vertical SecureBoost needs no server (the guest holds the key); nothing to do", spec.id)
        return {}
    host_ids = [h.id for h in cfg.hosts]
    table = _load(cfg, spec)
    psi = (align_ids_guest(transport, list(table.ids), host_ids) if spec.role == "guest"
           else align_ids_host(transport, list(table.ids), cfg.guest.id))
    X = table.X[psi.rows].astype(np.float64)
    train, val, test = _split(len(psi), params)
    meta = {"params": params.model_dump(mode="json"), "feature_names": list(table.feature_names),
            "psi_common_ids": len(psi)}
    xval = X[val] if len(val) else None
    if spec.role == "host":
        host = SecureBoostHost(transport, cfg.guest.id, X[train], tree_params, X_val=xval)
        host.fit()
        host.serve_predictions(X)
        table_rows = [{"record": i, "feature": table.feature_names[j], "bin": b, "threshold": thr}
                      for i, (j, b, thr) in enumerate(host.records)]
        save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role="host", algorithm=cfg.job.algorithm,
                   model={"split_table": table_rows}, metadata=meta)
        return {}
    y = table.y[psi.rows]
    guest = SecureBoostGuest(transport, host_ids, X[train], y[train], tree_params, X_val=xval,
                             y_val=y[val] if len(val) else None)
    res = guest.fit()
    pred = transform(guest.predict_margin(X), tree_params)
    guest.end_prediction()
    metrics = {"train": _metrics(y[train], pred[train], tree_params)}
    if len(test):
        metrics["test"] = _metrics(y[test], pred[test], tree_params)
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "metrics": metrics, "tree_seconds": res.tree_seconds,
                                          "stopped_early": res.stopped_early, "val_losses": res.model.val_losses})
    save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role="guest", algorithm=cfg.job.algorithm,
               model=model_to_dict(res.model), metadata={**meta, "metrics": metrics})
    log.info("%s: %d trees, metrics %s", spec.id, len(res.model.trees), metrics.get("test", metrics["train"]))
    return metrics


def _run_horizontal(cfg, spec, transport, params) -> dict:
    from ..tree.horizontal import HorizontalSecureBoostClient, HorizontalSecureBoostServer, tree_aggregation_config
    from ..tree.xgb_export import save_xgboost_json

    tree_params = SecureBoostParams(**params.model_dump(exclude=_JOB_ONLY))
    agg = tree_aggregation_config(params.aggregation, stage_timeout_s=cfg.job.deadline_s,
                                  input_timeout_s=cfg.job.deadline_s)
    out_dir = cfg.output_dir(spec.id)
    client_ids = [c.id for c in cfg.clients]
    meta = {"params": params.model_dump(mode="json")}
    if spec.role == "server":
        server = HorizontalSecureBoostServer(transport, client_ids, tree_params, aggregation=agg,
                                             feature_ranges=params.feature_ranges)
        model = server.fit()
        out_dir.mkdir(parents=True, exist_ok=True)
        save_xgboost_json(model, out_dir / "model.xgboost.json")
        save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role="server", algorithm=cfg.job.algorithm,
                   model=model_to_dict(model), metadata={**meta, "tree_seconds": server.tree_seconds})
        return {}
    table = _load(cfg, spec)
    if table.y is None:
        raise JobConfigError(f"parties[{spec.id}].data.label_column: every horizontal client needs labels")
    X, y = table.X.astype(np.float64), table.y
    train, val, test = _split(len(y), params)
    client = HorizontalSecureBoostClient(transport, cfg.server.id, client_ids, X[train], y[train], tree_params,
                                         X_val=X[val] if len(val) else None, y_val=y[val] if len(val) else None,
                                         aggregation=agg, send_ranges=params.feature_ranges is None)
    model = client.fit()
    metrics = {"train": _metrics(y[train], model.predict(X[train]), tree_params)}
    if len(test):
        metrics["test"] = _metrics(y[test], model.predict(X[test]), tree_params)
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "metrics": metrics})
    save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role="client", algorithm=cfg.job.algorithm,
               model=model_to_dict(model), metadata={**meta, "metrics": metrics})
    return metrics
