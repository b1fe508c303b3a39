"""Vertical logistic regression as a job: load, align by PSI, split, train, predict, save.

Every party runs :func:`run_job` with its own role. Data parties first run the shared steps of
:mod:`secureflhv.runtime.vertical_common` (load, PSI, split, standardise); the server (arbiter mode's
Paillier key holder) holds no data and takes part only in training. Then training
(:mod:`secureflhv.vertical.lr`) and federated prediction of the training and test rows: the hosts send
partial scores, the guest computes probabilities, AUC and accuracy.

Artifacts (:mod:`secureflhv.runtime.artifacts`): every party's ``model.json``; at the guest also
``metrics.json``, ``predictions.csv``, ``split.json`` and ``loss.png``.
"""
from __future__ import annotations

from pydantic import ConfigDict

from ..transport import Transport
from ..vertical.lr import VerticalLRArbiter, VerticalLRConfig, VerticalLRGuest, VerticalLRHost
from .artifacts import save_model
from .config import JobConfig, JobConfigError, PartySpec
from .launcher import emit_progress
from .vertical_common import (SPLIT_FIELDS, SplitParams, classification_metrics, load_and_align, log_summary,
                              save_guest_reports, validate_params)


class VerticalLRJobParams(VerticalLRConfig, SplitParams):
    """The job file's ``params`` for ``algorithm: vertical_lr``: :class:`VerticalLRConfig` plus the split.

    ``insecure_test_key`` is not set here: it follows ``security.insecure_test_keys``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


def job_params(cfg: JobConfig) -> VerticalLRJobParams:
    """Validate ``params`` of a vertical LR job. Raises JobConfigError naming ``params.<field>``."""
    params = validate_params(VerticalLRJobParams, cfg)
    if params.mode == "arbiter" and cfg.server is None:
        raise JobConfigError("params.mode: 'arbiter' needs a party with role: server (the key holder)")
    if params.mode == "two_party" and cfg.server is not None:
        raise JobConfigError("params.mode: 'two_party' runs without a server; remove it or use mode: arbiter")
    return params


def run_job(cfg: JobConfig, spec: PartySpec, transport: Transport) -> dict:
    """Run this party's role of a vertical LR job; return the guest's metrics (others: ``{}``).

    Raises JobConfigError for bad params or data, TransportError when a peer fails or goes silent.
    """
    params = job_params(cfg)
    out_dir = cfg.output_dir(spec.id)
    guest_id, host_ids = cfg.guest.id, [h.id for h in cfg.hosts]
    arbiter_id = cfg.server.id if params.mode == "arbiter" else None
    config = VerticalLRConfig(**params.model_dump(exclude=SPLIT_FIELDS))

    def save(role: str, model: dict, meta: dict) -> None:
        save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role=role, algorithm="vertical_lr",
                   model=model, metadata=meta)

    if spec.role == "server":
        VerticalLRArbiter(transport, guest_id, host_ids, config).fit()
        save("server", {}, {"params": params.model_dump(mode="json")})
        return {}

    data = load_and_align(cfg, spec, transport, params)
    X, train, test = data.X, data.train, data.test
    if spec.role == "host":
        host = VerticalLRHost(transport, guest_id, host_ids, X[train], config, arbiter_id)
        host.fit()
        host.serve_predictions(X)  # the guest asks for training and test rows by index
        save("host", {"weights": dict(zip(data.feature_names, host.weights))}, data.meta)
        return {}

    y = data.y
    guest = VerticalLRGuest(transport, host_ids, X[train], y[train], config, arbiter_id,
                            on_epoch=lambda e, loss: emit_progress("epochs", e + 1, params.epochs, f"loss {loss:.5f}"))
    result = guest.fit()
    metrics = {"train": classification_metrics(y[train], guest.predict_proba(X, rows=train))}
    p_test = guest.predict_proba(X, rows=test) if len(test) else None
    if p_test is not None:
        metrics["test"] = classification_metrics(y[test], p_test)
    guest.end_prediction()
    history = {"loss": result.losses, "epoch_seconds": result.epoch_seconds, "stopped_early": result.stopped_early}
    plot = save_guest_reports(out_dir, cfg, data, metrics, history, p_test, "vertical LR")
    save("guest", {"weights": dict(zip(data.feature_names, guest.weights)), "intercept": guest.intercept},
         {**data.meta, "metrics": metrics})
    log_summary(spec.id, metrics, result.losses, plot)
    return metrics
