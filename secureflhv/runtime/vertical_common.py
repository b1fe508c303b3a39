"""What every vertical job does around its algorithm: validate params, load, align by PSI, split, report.

Steps shared by ``vertical_lr`` and ``vertical_nn`` (and identical in order at every data party, so that
each message has its partner):

1. load the party's table (``parties[i].data``);
2. PSI (:mod:`secureflhv.vertical.psi`): guest and hosts learn the ids common to all of them, in one
   agreed order; a server takes no part;
3. train/test split of the aligned rows from ``params.split_seed`` (the same rows at every party);
   each party standardises its own columns with its own training-row statistics (optional);
4. after training, the guest writes ``metrics.json``, ``predictions.csv``, ``split.json``, ``loss.png``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from ..data import load_table
from ..transport import Transport
from ..vertical.psi import align_ids_guest, align_ids_host
from .artifacts import plot_curves, write_json
from .config import JobConfig, JobConfigError, PartySpec, validate_params  # noqa: F401 (re-exported)

log = logging.getLogger("secureflhv.job")


class SplitParams(BaseModel):
    """Job-level parameters of every vertical job (mixed into its params model)."""

    test_fraction: float = Field(default=0.3, ge=0, lt=1, description="share of aligned rows held out")
    split_seed: int = Field(default=0, ge=0, description="seed of the train/test split of aligned rows")
    standardize: bool = Field(default=True, description="each party standardises its own columns")


SPLIT_FIELDS = frozenset(SplitParams.model_fields)


@dataclass
class AlignedData:
    """One data party's rows after PSI: ``X[k]`` (and ``y[k]`` at the guest) belong to id ``ids[k]``.

    ``train`` / ``test`` index the aligned rows; ``meta`` goes into the party's ``model.json``.
    """

    X: np.ndarray
    y: np.ndarray | None
    ids: np.ndarray
    train: np.ndarray
    test: np.ndarray
    feature_names: list[str]
    meta: dict = field(default_factory=dict)


def load_and_align(cfg: JobConfig, spec: PartySpec, transport: Transport, params: SplitParams) -> AlignedData:
    """Steps 1-3 above for a guest or host. Raises JobConfigError for unreadable data."""
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
        psi = align_ids_guest(transport, list(table.ids), [h.id for h in cfg.hosts])
    else:
        psi = align_ids_host(transport, list(table.ids), cfg.guest.id)
    log.info("%s: PSI found %d common ids (own %d) in %.2fs", spec.id, len(psi), table.n_rows,
             time.monotonic() - t0)
    if len(psi) < 2:
        raise ValueError(f"PSI left {len(psi)} common ids (this party has {table.n_rows}, peers "
                         f"{psi.peer_sizes}): check that every party's data.id_column names the same ids, "
                         f"written the same way (e.g. no leading zeros lost, same prefix)")
    X = table.X[psi.rows]
    perm = np.random.default_rng(params.split_seed).permutation(len(psi))
    n_test = int(round(params.test_fraction * len(psi)))
    train, test = np.sort(perm[n_test:]), np.sort(perm[:n_test])
    standardisation = None
    if params.standardize:
        mean, std = X[train].mean(axis=0), X[train].std(axis=0)
        std[std == 0] = 1.0
        X = (X - mean) / std
        standardisation = {"mean": mean, "std": std}
    meta = {"params": params.model_dump(mode="json"), "feature_names": list(table.feature_names),
            "psi": {"common_ids": len(psi), "own_ids": table.n_rows, "peer_sizes": psi.peer_sizes},
            "standardisation": standardisation}
    y = table.y[psi.rows] if spec.role == "guest" else None
    return AlignedData(X, y, np.asarray(psi.ids), train, test, list(table.feature_names), meta)


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


def save_guest_reports(out_dir: Path, cfg: JobConfig, data: AlignedData, metrics: dict, history: dict,
                       p_test: np.ndarray | None, title: str, **extra) -> Path:
    """Write ``metrics.json``, ``predictions.csv`` (test rows), ``split.json`` and ``loss.png``; return the plot."""
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "metrics": metrics, "history": history,
                                          "psi_common_ids": len(data.ids), **extra})
    if p_test is not None and len(data.test):
        import pandas as pd

        cols = {"id": data.ids[data.test], "label": data.y[data.test]}
        if p_test.ndim == 1:
            cols["probability"] = p_test
        else:
            cols.update({f"p{c}": p_test[:, c] for c in range(p_test.shape[1])})
        pd.DataFrame(cols).to_csv(out_dir / "predictions.csv", index=False)
    write_json(out_dir / "split.json", {"train": data.ids[data.train], "test": data.ids[data.test]})
    return plot_curves(out_dir / "loss.png", {"training loss": history["loss"]}, title=f"{title}, job {cfg.job.id}")


def log_summary(party_id: str, metrics: dict, losses: list[float], plot: Path) -> None:
    """Log the guest's closing line: epochs, final loss, held-out (else training) accuracy and AUC."""
    which = "test" if "test" in metrics else "train"
    s = metrics[which]
    log.info("%s: done: %d epochs, final loss %.5f, %s accuracy %.4f AUC %s; loss curve %s", party_id,
             len(losses), losses[-1] if losses else float("nan"), which, s["accuracy"],
             f"{s['auc']:.4f}" if "auc" in s else "n/a", plot)
