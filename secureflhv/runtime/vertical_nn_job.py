"""Vertical split neural network as a job: load data, align ids by PSI, split, train, predict, save.

Every party (guest and hosts; no server) runs :func:`run_job` with its own role:

1. load its table (``parties[i].data``);
2. PSI (:mod:`secureflhv.vertical.psi`): the ids common to every party, one agreed order;
3. train/test split of the aligned rows from ``params.split_seed`` (same rows everywhere); each party
   standardises its own columns with its own training-row statistics (optional);
4. training (:mod:`secureflhv.vertical.split_nn`) with a checkpoint per epoch in
   ``out/<party>/checkpoints/``, then federated prediction of the training and test rows;
5. artifacts: every party's ``model.json`` (and its last checkpoint); at the guest ``metrics.json``,
   ``predictions.csv``, ``split.json`` and ``loss.png``.

Labels at the guest must be integers 0..C-1 (C = 2: binary with AUC; C > 2: multi-class accuracy).
"""
from __future__ import annotations

import numpy as np
from pydantic import ConfigDict

from ..transport import Transport
from ..vertical.split_nn import SplitNNConfig, SplitNNGuest, SplitNNHost
from .artifacts import save_model
from .config import JobConfig, JobConfigError, PartySpec
from .launcher import emit_progress
from .vertical_common import (SPLIT_FIELDS, SplitParams, classification_metrics, load_and_align, log_summary,
                              save_guest_reports, validate_params)


class VerticalNNJobParams(SplitNNConfig, SplitParams):
    """The job file's ``params`` for ``algorithm: vertical_nn``: :class:`SplitNNConfig` plus the split.

    ``insecure_test_key`` is not set here: it follows ``security.insecure_test_keys``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


def job_params(cfg: JobConfig) -> VerticalNNJobParams:
    """Validate ``params`` of a vertical NN job. Raises JobConfigError naming ``params.<field>``."""
    params = validate_params(VerticalNNJobParams, cfg)
    if cfg.server is not None:
        raise JobConfigError("parties: vertical_nn runs between guest and hosts only; remove the server party")
    return params


def run_job(cfg: JobConfig, spec: PartySpec, transport: Transport) -> dict:
    """Run this party's role of a vertical NN job; return the guest's metrics (hosts: ``{}``).

    Raises JobConfigError for bad params or data, TransportError when a peer fails or goes silent.
    """
    params = job_params(cfg)
    if spec.role == "server":
        raise JobConfigError(f"parties[{spec.id}].role: vertical_nn has no server role")
    out_dir = cfg.output_dir(spec.id)
    guest_id, host_ids = cfg.guest.id, [h.id for h in cfg.hosts]
    config = SplitNNConfig(**params.model_dump(exclude=SPLIT_FIELDS))
    data = load_and_align(cfg, spec, transport, params)
    X, train, test = data.X, data.train, data.test
    ckpt_dir = out_dir / "checkpoints"

    def save(role: str, model: dict, meta: dict) -> None:
        save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role=role, algorithm="vertical_nn",
                   model=model, metadata=meta)

    if spec.role == "host":
        host = SplitNNHost(transport, guest_id, host_ids, X[train], config, checkpoint_dir=ckpt_dir)
        res = host.fit()
        host.serve_predictions(X)
        save("host", {"state": host.state_arrays()}, {**data.meta, "checkpoints": res.checkpoints})
        return {}

    if not np.all(np.equal(np.mod(data.y, 1), 0)) or np.min(data.y) < 0:
        raise JobConfigError(f"parties[{spec.id}].data.label_column: labels must be integers 0..C-1")
    y = data.y.astype(np.int64)
    guest = SplitNNGuest(transport, host_ids, X[train], y[train], config, checkpoint_dir=ckpt_dir)
    guest.on_epoch = lambda epoch, loss: emit_progress("epochs", epoch + 1, params.epochs, f"loss {loss:.5f}")
    result = guest.fit()
    metrics = {"train": classification_metrics(y[train], guest.predict_proba(X, rows=train))}
    p_test = guest.predict_proba(X, rows=test) if len(test) else None
    if p_test is not None:
        metrics["test"] = classification_metrics(y[test], p_test)
    guest.end_prediction()
    history = {"loss": result.losses, "epoch_seconds": result.epoch_seconds}
    data.y = y
    plot = save_guest_reports(out_dir, cfg, data, metrics, history, p_test, "vertical NN",
                              n_classes=guest.n_classes)
    save("guest", {"state": guest.state_arrays(), "n_classes": guest.n_classes},
         {**data.meta, "metrics": metrics, "checkpoints": result.checkpoints})
    log_summary(spec.id, metrics, result.losses, plot)
    return metrics
