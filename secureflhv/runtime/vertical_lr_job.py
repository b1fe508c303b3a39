"""Vertical logistic regression as a job: load data, align ids by PSI, split, train, predict, save.

Every party runs :func:`run_job` with its own role. The steps, identical in order at every
party (so that each message has its partner):

1. data parties load their table (``parties[i].data``); the server loads nothing;
2. PSI (:mod:`secureflhv.vertical.psi`): guest and hosts learn the ids common to all of them, in one
   agreed order; the server takes no part;
3. train/test split of the aligned rows from ``params.split_seed`` (same rows at every party); each
   data party standardises its own columns with its own training-row statistics (optional);
4. training (:mod:`secureflhv.vertical.lr`), then federated prediction of the test rows: the hosts send
   partial scores, the guest computes probabilities, AUC and accuracy;
5. artifacts (:mod:`secureflhv.runtime.artifacts`): every party's ``model.json``; at the guest also
   ``metrics.json``, ``predictions.csv`` and ``loss.png``.
"""
from __future__ import annotations

import logging
import time

import numpy as np
from pydantic import ConfigDict, Field, ValidationError

from ..data import load_table
from ..transport import Transport
from ..vertical.lr import VerticalLRArbiter, VerticalLRConfig, VerticalLRGuest, VerticalLRHost
from ..vertical.psi import align_ids_guest, align_ids_host
from .artifacts import plot_curves, save_model, write_json
from .config import JobConfig, JobConfigError, PartySpec
from .launcher import emit_progress

log = logging.getLogger("secureflhv.job")


class VerticalLRJobParams(VerticalLRConfig):
    """The job file's ``params`` for ``algorithm: vertical_lr``: :class:`VerticalLRConfig` plus the split.

    ``insecure_test_key`` is not set here: it follows ``security.insecure_test_keys``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    test_fraction: float = Field(default=0.3, ge=0, lt=1, description="share of aligned rows held out")
    split_seed: int = Field(default=0, ge=0, description="seed of the train/test split of aligned rows")
    standardize: bool = Field(default=True, description="each party standardises its own columns")


def job_params(cfg: JobConfig) -> VerticalLRJobParams:
    """Validate ``params`` of a vertical LR job. Raises JobConfigError naming ``params.<field>``."""
    raw = dict(cfg.params)
    if "insecure_test_key" in raw:
        raise JobConfigError("params.insecure_test_key: set security.insecure_test_keys instead")
    raw["insecure_test_key"] = cfg.security.insecure_test_keys
    try:
        params = VerticalLRJobParams(**raw)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"]) or "params"
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                msg = "unknown parameter (check its spelling)"
            lines.append(f"params.{where}: {msg}" if e["loc"] else f"params: {msg}")
        raise JobConfigError("; ".join(lines)) from None
    if params.mode == "arbiter" and cfg.server is None:
        raise JobConfigError("params.mode: 'arbiter' needs a party with role: server (the key holder)")
    if params.mode == "two_party" and cfg.server is not None:
        raise JobConfigError("params.mode: 'two_party' runs without a server; remove it or use mode: arbiter")
    return params


def _split(n: int, params: VerticalLRJobParams) -> tuple[np.ndarray, np.ndarray]:
    perm = np.random.default_rng(params.split_seed).permutation(n)
    n_test = int(round(params.test_fraction * n))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _standardise(X: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mean = X[train].mean(axis=0)
    std = X[train].std(axis=0)
    std[std == 0] = 1.0
    return (X - mean) / std, mean, std


def _binary_metrics(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

    out = {"accuracy": float(accuracy_score(y, p >= 0.5)), "n": int(len(y))}
    if len(np.unique(y)) == 2:
        out["auc"] = float(roc_auc_score(y, p))
        out["log_loss"] = float(log_loss(y, np.clip(p, 1e-12, 1 - 1e-12)))
    return out


def run_job(cfg: JobConfig, spec: PartySpec, transport: Transport) -> dict:
    """Run this party's role of a vertical LR job; return a summary dict (also saved as artifacts).

    Raises JobConfigError for bad params or data, TransportError when a peer fails or goes silent.
    """
    params = job_params(cfg)
    out_dir = cfg.output_dir(spec.id)
    guest_id = cfg.guest.id
    host_ids = [h.id for h in cfg.hosts]
    arbiter_id = cfg.server.id if params.mode == "arbiter" else None
    config = VerticalLRConfig(**params.model_dump(exclude={"test_fraction", "split_seed", "standardize"}))
    meta = {"params": params.model_dump(mode="json")}

    if spec.role == "server":
        arbiter = VerticalLRArbiter(transport, guest_id, host_ids, config)
        arbiter.fit()
        pub = getattr(arbiter, "public_key", None)
        meta["paillier_key_fingerprint"] = getattr(pub, "fingerprint", b"")
        save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role="server", algorithm="vertical_lr",
                   model={}, metadata=meta)
        return {}

    # ---- data and PSI
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

    if spec.role == "host":
        host = VerticalLRHost(transport, guest_id, host_ids, X[train], config, arbiter_id)
        host.fit()
        host.serve_predictions(X)  # the guest asks for training and test rows by index
        save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role="host", algorithm="vertical_lr",
                   model={"weights": dict(zip(table.feature_names, host.weights))}, metadata=meta)
        return {}

    # ---- guest
    y = table.y[psi.rows]
    guest = VerticalLRGuest(transport, host_ids, X[train], y[train], config, arbiter_id,
                            on_epoch=lambda e, loss: emit_progress("epochs", e + 1, params.epochs, f"loss {loss:.5f}"))
    result = guest.fit()
    metrics = {"train": _binary_metrics(y[train], guest.predict_proba(X, rows=train))}
    if len(test):
        p_test = guest.predict_proba(X, rows=test)
        metrics["test"] = _binary_metrics(y[test], p_test)
    guest.end_prediction()
    history = {"loss": result.losses, "epoch_seconds": result.epoch_seconds, "stopped_early": result.stopped_early}
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "metrics": metrics, "history": history,
                                          "psi_common_ids": len(psi)})
    if len(test):
        import pandas as pd

        pd.DataFrame({"id": np.asarray(psi.ids)[test], "label": y[test], "probability": p_test}).to_csv(
            out_dir / "predictions.csv", index=False)
    write_json(out_dir / "split.json", {"train": np.asarray(psi.ids)[train], "test": np.asarray(psi.ids)[test]})
    plot = plot_curves(out_dir / "loss.png", {"training loss (Taylor)": result.losses},
                       title=f"vertical LR, job {cfg.job.id}")
    save_model(out_dir, job_id=cfg.job.id, party_id=spec.id, role="guest", algorithm="vertical_lr",
               model={"weights": dict(zip(table.feature_names, guest.weights)), "intercept": guest.intercept},
               metadata={**meta, "metrics": metrics})
    summary = metrics.get("test", metrics["train"])
    log.info("%s: done: %d epochs, final loss %.5f, %s AUC %.4f accuracy %.4f; loss curve %s", spec.id,
             len(result.losses), result.losses[-1] if result.losses else float("nan"),
             "test" if len(test) else "train", summary.get("auc", float("nan")), summary["accuracy"], plot)
    return metrics
