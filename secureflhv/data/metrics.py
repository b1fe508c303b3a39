"""Quality metrics per task, as every job writes them to ``metrics.json``, and their plots.

Tasks:
- ``binary``: scores are P(y=1), shape (n,). AUC, KS (max |TPR - FPR|, Kolmogorov–Smirnov distance
  between the score distributions of the two classes, as credit scoring reports it), accuracy,
  precision, recall, log loss at threshold 0.5, and the 2x2 confusion matrix [[TN, FP], [FN, TP]].
- ``multiclass``: scores are class probabilities, shape (n, C). Accuracy, macro-F1, log loss.
- ``regression``: scores are predictions, shape (n,). RMSE, MAE, R².
All metrics are computed with scikit-learn's implementations; ``n`` is the row count.

Plots (:func:`task_plots`, PNG through matplotlib's Agg canvas): binary — ROC and KS curves
(``roc_ks.png``), the confusion matrix at 0.5 (``confusion.png``) and, as credit scoring reads them, the
lift and gain by score decile (``lift_gain.png``, with the tables ``ks_table.csv`` and ``lift_gain.csv``,
:mod:`secureflhv.data.credit_metrics`); multi-class — the confusion matrix
(``confusion.png``); regression — predicted against true values (``predicted_vs_true.png``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

TASKS = ("binary", "multiclass", "regression")


def infer_task(y: np.ndarray) -> str:
    """``regression`` for float labels that are not class ids (non-integral, or more than 20 distinct
    values), ``binary`` for two classes, else ``multiclass``."""
    y = np.asarray(y)
    if y.dtype.kind == "f" and (not np.all(y == np.round(y)) or len(np.unique(y)) > 20):
        return "regression"
    return "binary" if len(np.unique(y)) <= 2 else "multiclass"


def task_of(scores: np.ndarray, regression: bool = False) -> str:
    """The task that scores of this shape belong to: ``regression`` when told so, else ``binary`` for
    (n,) probabilities and ``multiclass`` for (n, C)."""
    if regression:
        return "regression"
    return "multiclass" if np.asarray(scores).ndim == 2 else "binary"


def task_plots(y: np.ndarray, scores: np.ndarray, task: str, out_dir, *, title: str = "") -> list[Path]:
    """Write the plots of ``task`` (see the module docstring; binary: also the KS and lift/gain tables) for
    ``scores`` against ``y`` into ``out_dir``; returns the plots written (none for zero rows; no ROC/KS, lift
    or gain when ``y`` has one class; no lift or gain for fewer than 10 rows, one per decile).
    Raises ValueError for an unknown task."""
    from .credit_metrics import ks_table, lift_gain_table, plot_lift_gain
    from .partition.plots import plot_confusion_matrix, plot_predicted_vs_true

    out_dir = Path(out_dir)
    y, scores = np.asarray(y), np.asarray(scores, dtype=np.float64)
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if not len(y):
        return []
    if task == "regression":
        return [plot_predicted_vs_true(y, scores, out_dir / "predicted_vs_true.png", title=title)]
    y = y.astype(np.int64)
    if task == "binary":
        paths = []
        if len(np.unique(y)) == 2:
            paths.append(plot_roc_ks(y, scores, out_dir / "roc_ks.png", title=title))
            if len(y) >= 10:  # deciles
                ks_table(y, scores).to_csv(out_dir / "ks_table.csv", index=False)
                lift_gain_table(y, scores).to_csv(out_dir / "lift_gain.csv", index=False)
                paths.append(plot_lift_gain(y, scores, out_dir / "lift_gain.png", title=title))
        paths.append(plot_confusion_matrix(y, (scores >= 0.5).astype(np.int64), 2, out_dir / "confusion.png",
                                           title=title))
        return paths
    return [plot_confusion_matrix(y, scores.argmax(axis=1), scores.shape[1], out_dir / "confusion.png", title=title)]


def ks_statistic(y: np.ndarray, p: np.ndarray) -> float:
    """Kolmogorov–Smirnov statistic of binary scores: max over thresholds of TPR - FPR."""
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(y, p)
    return float(np.max(tpr - fpr))


def task_metrics(y: np.ndarray, scores: np.ndarray, task: str | None = None) -> dict:
    """Metrics of ``scores`` against labels ``y`` for ``task`` (inferred from ``y`` when None).

    Raises ValueError for an unknown task or scores of the wrong shape. AUC and KS are left out when
    ``y`` holds a single class (they are undefined).
    """
    from sklearn import metrics as M

    y, scores = np.asarray(y), np.asarray(scores, dtype=np.float64)
    task = task or infer_task(y)
    out: dict = {"n": int(len(y))}
    if task == "binary":
        if scores.ndim != 1:
            raise ValueError(f"binary scores must have shape (n,), got {scores.shape}")
        pred = (scores >= 0.5).astype(np.int64)
        y = y.astype(np.int64)
        out.update(accuracy=float(M.accuracy_score(y, pred)),
                   precision=float(M.precision_score(y, pred, zero_division=0)),
                   recall=float(M.recall_score(y, pred, zero_division=0)),
                   log_loss=float(M.log_loss(y, np.clip(scores, 1e-12, 1 - 1e-12), labels=[0, 1])),
                   confusion=M.confusion_matrix(y, pred, labels=[0, 1]).tolist())
        if len(np.unique(y)) == 2:
            out.update(auc=float(M.roc_auc_score(y, scores)), ks=ks_statistic(y, scores))
    elif task == "multiclass":
        if scores.ndim != 2:
            raise ValueError(f"multi-class scores must have shape (n, classes), got {scores.shape}")
        pred = scores.argmax(axis=1)
        probs = np.clip(scores, 1e-15, 1.0)
        out.update(accuracy=float(M.accuracy_score(y, pred)),
                   macro_f1=float(M.f1_score(y, pred, average="macro", labels=np.arange(scores.shape[1]),
                                             zero_division=0)),
                   log_loss=float(M.log_loss(y, probs / probs.sum(axis=1, keepdims=True),
                                             labels=np.arange(scores.shape[1]))))
    elif task == "regression":
        if scores.ndim != 1:
            raise ValueError(f"regression predictions must have shape (n,), got {scores.shape}")
        out.update(rmse=float(np.sqrt(M.mean_squared_error(y, scores))),
                   mae=float(M.mean_absolute_error(y, scores)), r2=float(M.r2_score(y, scores)))
    else:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return out


def plot_roc_ks(y: np.ndarray, p: np.ndarray, path, title: str = "") -> Path:
    """Save the ROC curve and the KS curve (TPR and FPR against the threshold) side by side as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import roc_auc_score, roc_curve

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fpr, tpr, thr = roc_curve(y, p)
    ks_at = int(np.argmax(tpr - fpr))
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 4))
    a.plot(fpr, tpr, label=f"AUC {roc_auc_score(y, p):.4f}")
    a.plot([0, 1], [0, 1], ls=":", c="grey")
    a.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC")
    a.legend(loc="lower right")
    t = np.clip(thr, 0, 1)
    b.plot(t, tpr, label="TPR (class 1)")
    b.plot(t, fpr, label="FPR (class 0)")
    b.vlines(t[ks_at], fpr[ks_at], tpr[ks_at], colors="k", label=f"KS {tpr[ks_at] - fpr[ks_at]:.4f}")
    b.set(xlabel="score threshold", ylabel="share of class at or above threshold", title="KS")
    b.legend(loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
