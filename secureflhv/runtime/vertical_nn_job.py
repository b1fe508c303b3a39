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

import logging
import time

import numpy as np
from pydantic import ConfigDict, Field, ValidationError

from ..data import load_table
from ..transport import Transport
from ..vertical.psi import align_ids_guest, align_ids_host
from ..vertical.split_nn import SplitNNConfig, SplitNNGuest, SplitNNHost
from .artifacts import plot_curves, save_model, write_json
from .config import JobConfig, JobConfigError, PartySpec
from .launcher import emit_progress

log = logging.getLogger("secureflhv.job")

_JOB_ONLY = {"test_fraction", "split_seed", "standardize"}


class VerticalNNJobParams(SplitNNConfig):
    """The job file's ``params`` for ``algorithm: vertical_nn``: :class:`SplitNNConfig` plus the split.

    ``insecure_test_key`` is not set here: it follows ``security.insecure_test_keys``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    test_fraction: float = Field(default=0.3, ge=0, lt=1, description="share of aligned rows held out")
    split_seed: int = Field(default=0, ge=0, description="seed of the train/test split of aligned rows")
    standardize: bool = Field(default=True, description="each party standardises its own columns")


def job_params(cfg: JobConfig) -> VerticalNNJobParams:
    """Validate ``params`` of a vertical NN job. Raises JobConfigError naming ``params.<field>``."""
    raw = dict(cfg.params)
    if "insecure_test_key" in raw:
        raise JobConfigError("params.insecure_test_key: set security.insecure_test_keys instead")
    raw["insecure_test_key"] = cfg.security.insecure_test_keys
    try:
        params = VerticalNNJobParams(**raw)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                msg = "unknown parameter (check its spelling)"
            if not where and ":" in msg:  # model-level check: the message starts with the field name
                where, msg = msg.split(":", 1)
                msg = msg.strip()
            lines.append(f"params.{where}: {msg}" if where else f"params: {msg}")
        raise JobConfigError("; ".join(lines)) from None
    if cfg.server is not None:
        raise JobConfigError("parties: vertical_nn runs between guest and hosts only; remove the server party")
    return params


def _split(n: int, params: VerticalNNJobParams) -> tuple[np.ndarray, np.ndarray]:
    perm = np.random.default_rng(params.split_seed).permutation(n)
    n_test = int(round(params.test_fraction * n))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _standardise(X: np.ndarray, train: np.ndarray):
    mean = X[train].mean(axis=0)
    std = X[train].std(axis=0)
    std[std == 0] = 1.0
    return (X - mean) / std, mean, std


def classification_metrics(y: np.ndarray, p: np.ndarray) -> dict:
    """accuracy (+ AUC and log loss for binary ``p`` of shape (m,); multi-class ``p`` is (m, C))."""
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

    if p.ndim == 1:
        out = {"accuracy": float(accuracy_score(y, p >= 0.5)), "n": int(len(y))}
        if len(np.unique(y)) == 2:
            out["auc"] = float(roc_auc_score(y, p))
            out["log_loss"] = float(log_loss(y, np.clip(p, 1e-12, 1 - 1e-12), labels=[0, 1]))
        return out
    return {"accuracy": float(accuracy_score(y, p.argmax(axis=1))), "n": int(len(y))}


def run_job(cfg: JobConfig, spec: PartySpec, transport: Transport) -> dict:
    """Run this party's role of a vertical NN job; return a summary dict (also saved as artifacts).

    Raises JobConfigError for bad params or data, TransportError when a peer fails or goes silent.
    """
    params = job_params(cfg)
    if spec.role == "server":
        raise JobConfigError(f"parties[{spec.id}].role: vertical_nn has no server role")
    out_dir = cfg.output_dir(spec.id)
    guest_id = cfg.guest.id
    host_ids = [h.id for h in cfg.hosts]
    config = SplitNNConfig(**params.model_dump(exclude=_JOB_ONLY))
    meta = {"params": params.model_dump(mode="json")}

    data_spec = spec.data
    path = cfg.resolve(data_spec.path)
    try:
        table = load_table(path, id_column=data_spec.id_column, label_column=data_spec.label_column,
                           feature_columns=data_spec.feature_columns)
    except (OSError, ValueError) as exc:
        raise JobConfigError(f"parties[{spec.id}].data: {exc}") from None
    log.info("%s: loaded %d rows x %d features from %s", spec.id, table.n_rows, table.n_features, path)
    t0 = time.monotonic()
    if spec.role == "guest":
        psi = align_ids_guest(transport, list(table.ids), host_ids)
    else:
        psi = align_ids_host(transport, list(table.ids), guest_id)
    log.info("%s: PSI found %d common ids (own %d) in %.2fs", spec.id, len(psi), table.n_rows,
             time.monotonic() - t0)
    if len(psi) < 2:
        raise ValueError(f"PSI left {len(psi)} common ids: the parties' id columns hardly overlap")
    X = table.X[psi.rows]
    train, test = _split(len(psi), params)
    mean = std = None
    if params.standardize:
        X, mean, std = _standardise(X, train)
    meta.update(feature_names=list(table.feature_names), psi={"common_ids": len(psi), "own_ids": table.n_rows,
                                                             "peer_sizes": psi.peer_sizes},
                standardisation={"mean": mean, "std": std} if mean is not None else None)
    ckpt_dir = out_dir / "checkpoints"

    if spec.role == "host":
        host = SplitNNHost(transport, guest_id, host_ids, X[train], config, checkpoint_dir=ckpt_dir)
        res = host.fit()
        host.serve_predictions(X)
        save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role="host", algorithm="vertical_nn",
                   model={"state": host.state_arrays()},
                   metadata={**meta, "checkpoints": res.checkpoints})
        return {}

    y_raw = table.y[psi.rows]
    if not np.all(np.equal(np.mod(y_raw, 1), 0)) or np.min(y_raw) < 0:
        raise JobConfigError(f"parties[{spec.id}].data.label_column: labels must be integers 0..C-1")
    y = y_raw.astype(np.int64)
    guest = SplitNNGuest(transport, host_ids, X[train], y[train], config, checkpoint_dir=ckpt_dir)
    guest.on_epoch = lambda epoch, loss: emit_progress("epochs", epoch + 1, params.epochs, f"loss {loss:.5f}")
    result = guest.fit()
    metrics = {"train": classification_metrics(y[train], guest.predict_proba(X, rows=train))}
    if len(test):
        p_test = guest.predict_proba(X, rows=test)
        metrics["test"] = classification_metrics(y[test], p_test)
    guest.end_prediction()
    history = {"loss": result.losses, "epoch_seconds": result.epoch_seconds}
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "metrics": metrics, "history": history,
                                          "psi_common_ids": len(psi), "n_classes": guest.n_classes})
    if len(test):
        import pandas as pd

        cols = {"id": np.asarray(psi.ids)[test], "label": y[test]}
        if p_test.ndim == 1:
            cols["probability"] = p_test
        else:
            cols.update({f"p{c}": p_test[:, c] for c in range(p_test.shape[1])})
        pd.DataFrame(cols).to_csv(out_dir / "predictions.csv", index=False)
    write_json(out_dir / "split.json", {"train": np.asarray(psi.ids)[train], "test": np.asarray(psi.ids)[test]})
    plot = plot_curves(out_dir / "loss.png", {"training loss": result.losses}, title=f"vertical NN, job {cfg.job.id}")
    save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role="guest", algorithm="vertical_nn",
               model={"state": guest.state_arrays(), "n_classes": guest.n_classes},
               metadata={**meta, "metrics": metrics, "checkpoints": result.checkpoints})
    summary = metrics.get("test", metrics["train"])
    log.info("%s: done: %d epochs, final loss %.5f, %s accuracy %.4f AUC %s; loss curve %s", spec.id,
             len(result.losses), result.losses[-1], "test" if len(test) else "train", summary["accuracy"],
             f"{summary['auc']:.4f}" if "auc" in summary else "n/a", plot)
    return metrics
