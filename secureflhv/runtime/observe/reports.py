"""What a job reports after training: quality metrics, the guest's files and closing log line, and every
party's bytes on the wire.

Files (under ``<output_dir>/<party id>/``, see :mod:`secureflhv.runtime.store.artifacts`): ``metrics.json``,
``predictions.csv`` (held-out rows), ``split.json`` (which ids were trained / held out), ``loss.png``,
and the task's plots (:func:`secureflhv.data.metrics.task_plots`: ``roc_ks.png`` / ``confusion.png`` /
``predicted_vs_true.png``).
Every party's ``metrics.json`` gets a ``wire`` key at the end of a successful job (:func:`save_wire_report`).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from ...data.metrics import task_metrics, task_of, task_plots
from ...transport.wire import report as wire_report
from ...transport.wire import totals as wire_totals
from ..store.artifacts import plot_curves, write_json
from ..job.data_prep import PartyData, RowSplit
from ..job.job_file import JobConfig

log = logging.getLogger("secureflhv.job")


def classification_metrics(y: np.ndarray, p: np.ndarray) -> dict:
    """Binary metrics for ``p`` of shape (m,) (P(y=1)), multi-class ones for ``p`` of shape (m, C).

    See :func:`secureflhv.data.metrics.task_metrics` for the list (AUC, KS, precision, recall, confusion
    matrix; accuracy, macro-F1, log loss).
    """
    return task_metrics(y, p, "binary" if p.ndim == 1 else "multiclass")


def objective_task(objective: str) -> str:
    """The metrics task of a tree ``objective``: ``regression``, ``binary`` or ``multiclass``."""
    return objective if objective in ("regression", "binary") else "multiclass"


def objective_metrics(y: np.ndarray, pred: np.ndarray, objective: str) -> dict:
    """Tree metrics for ``objective`` (``regression``, ``binary`` with ``pred`` = P(y=1), or multi-class)."""
    return task_metrics(y, pred, objective_task(objective))


def regression_metrics(y: np.ndarray, pred: np.ndarray) -> dict:
    """RMSE, MAE and R² of predicted values ``pred`` (m,) against float targets ``y``."""
    return task_metrics(np.asarray(y, dtype=np.float64), pred, "regression")


def save_task_plots(out_dir: Path, y: np.ndarray, scores: np.ndarray, task: str, title: str) -> list[Path]:
    """The plots of ``task`` for these rows into ``out_dir`` (:func:`secureflhv.data.metrics.task_plots`);
    a plotting failure is logged, never fatal (the model and metrics are already saved)."""
    try:
        return task_plots(y, scores, task, out_dir, title=title)
    except Exception as exc:  # noqa: BLE001 - matplotlib raises many types; a missing picture must not fail a job
        log.warning("could not draw the %s plots in %s: %s", task, out_dir, exc)
        return []


def evaluate_split(y: np.ndarray, split: RowSplit, predict, metric) -> tuple[dict, np.ndarray | None]:
    """``({"train": ..., "test": ...}, test predictions)``: ``metric(y[rows], predict(rows))`` per part.

    ``predict(rows)`` is called for the training rows first, then the test rows (federated prediction
    sends these requests in this order at every party); no ``test`` entry when the split has none.
    """
    metrics = {"train": metric(y[split.train], predict(split.train))}
    p_test = predict(split.test) if len(split.test) else None
    if p_test is not None:
        metrics["test"] = metric(y[split.test], p_test)
    return metrics, p_test


def save_guest_reports(out_dir: Path, cfg: JobConfig, data: PartyData, metrics: dict, history: dict,
                       p_test: np.ndarray | None, title: str, *, loss_label: str = "training loss",
                       task: str | None = None, **extra) -> Path:
    """Write ``metrics.json``, ``predictions.csv`` (test rows), ``split.json``, ``loss.png`` and the
    task's plots of the test rows (:func:`save_task_plots`); return the loss plot.

    ``loss_label`` names the plotted loss on the y axis (which loss, on which rows, how averaged).
    ``task``: ``binary`` / ``multiclass`` / ``regression``; None: binary for (m,) scores, multi-class
    for (m, C).
    """
    task = task or (task_of(p_test) if p_test is not None else None)
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "task": task, "metrics": metrics,
                                          "history": history, "psi_common_ids": len(data.ids), **extra})
    if p_test is not None and len(data.test):
        import pandas as pd

        cols = {"id": data.ids[data.test], "label": data.y[data.test]}
        if p_test.ndim == 1:
            cols["value" if task == "regression" else "probability"] = p_test
        else:
            cols.update({f"p{c}": p_test[:, c] for c in range(p_test.shape[1])})
        pd.DataFrame(cols).to_csv(out_dir / "predictions.csv", index=False)
        save_task_plots(out_dir, data.y[data.test], p_test, task, f"{title}, job {cfg.job.id}, test rows")
    write_json(out_dir / "split.json", {"train": data.ids[data.train], "test": data.ids[data.test]})
    return plot_curves(out_dir / "loss.png", {loss_label: history["loss"]}, title=f"{title}, job {cfg.job.id}",
                       ylabel=loss_label)


def log_summary(party_id: str, metrics: dict, losses: list[float], plot: Path) -> None:
    """Log the guest's closing line: epochs, final loss, held-out (else training) accuracy and AUC
    (regression: RMSE and R²)."""
    which = "test" if "test" in metrics else "train"
    s = metrics[which]
    if "r2" in s:
        quality = f"{which} RMSE {s['rmse']:.4f} R² {s['r2']:.4f}"
    else:
        auc = f"{s['auc']:.4f}" if "auc" in s else "n/a"
        quality = f"{which} accuracy {s['accuracy']:.4f} AUC {auc}"
    log.info("%s: done: %d epochs, final loss %.5f, %s; loss curve %s", party_id,
             len(losses), losses[-1] if losses else float("nan"), quality, plot)


def save_wire_report(out_dir: Path, job_id: str, party_id: str, stats: dict) -> Path:
    """Add ``"wire"`` (bytes per peer and tag, and totals; :func:`secureflhv.transport.wire.report`) to the
    party's ``metrics.json``, creating the file (job and party id only) where the job wrote none.

    ``stats``: the transport's ``wire_stats()``. Returns the path of ``metrics.json``.
    """
    path = Path(out_dir) / "metrics.json"
    doc = {"job_id": job_id, "party_id": party_id}
    if path.exists():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            log.warning("%s: %s is not JSON; rewriting it with the wire counts only", party_id, path)
    doc["wire"] = wire_report(stats)
    return write_json(path, doc)


def human_bytes(n: float) -> str:
    """``n`` bytes in decimal units: ``"512 B"``, ``"3.4 kB"``, ``"12.35 MB"``, ``"1.20 GB"``."""
    n = float(n)
    if n < 1e3:
        return f"{n:.0f} B"
    if n < 1e6:
        return f"{n / 1e3:.1f} kB"
    if n < 1e9:
        return f"{n / 1e6:.2f} MB"
    return f"{n / 1e9:.2f} GB"


def wire_line(stats: dict) -> str:
    """One line of totals, e.g. ``sent 1.23 MB (+12.0 kB framing), received 4.56 MB (+20.1 kB framing), 2 peers``.

    Decimal units (MB = 10^6 bytes); payload bytes exact, framing partly estimated (see
    :mod:`secureflhv.transport.wire`).
    """
    t = wire_totals(stats)
    return (f"sent {human_bytes(t['sent'])} (+{human_bytes(t['sent_framing'])} framing), received "
            f"{human_bytes(t['received'])} (+{human_bytes(t['received_framing'])} framing), "
            f"{len(stats)} peer{'s' if len(stats) != 1 else ''}")
