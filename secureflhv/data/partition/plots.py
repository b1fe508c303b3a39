"""Pictures of a partition's label distribution (PNG via matplotlib's Agg canvas).

Uses ``matplotlib.figure.Figure`` with ``FigureCanvasAgg`` directly, so it never touches pyplot's
global backend state and works on headless machines.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .stats import PartitionStats


def plot_label_distribution(stats: PartitionStats, path, *, kind: str = "both", dpi: int = 120) -> Path:
    """Save a PNG of per-party label distribution.

    kind: ``heatmap`` (parties x labels, colour = share of the party's rows, counts annotated when
    the grid is small), ``bar`` (stacked bars of row counts per party, one colour per label), or
    ``both`` (side by side). Returns the path written. Raises ValueError for an unknown kind.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if kind not in ("heatmap", "bar", "both"):
        raise ValueError(f"kind must be 'heatmap', 'bar' or 'both', got {kind!r}")
    counts = stats.counts.astype(np.float64)
    P, K = counts.shape
    names = stats.class_labels()
    panels = ["heatmap", "bar"] if kind == "both" else [kind]
    fig = Figure(figsize=(6.0 * len(panels) + 1.0, max(3.5, 0.32 * P + 1.8)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        if panel == "heatmap":
            share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
            im = ax.imshow(share, aspect="auto", cmap="viridis", vmin=0, vmax=max(share.max(), 1e-9))
            ax.set_xticks(range(K), names, rotation=45, ha="right", fontsize=8)
            ax.set_yticks(range(P), [str(i) for i in range(P)], fontsize=8)
            ax.set_xlabel("label")
            ax.set_ylabel("party")
            ax.set_title("share of party's rows per label")
            if P * K <= 200:
                for i in range(P):
                    for k in range(K):
                        if counts[i, k]:
                            ax.text(k, i, str(int(counts[i, k])), ha="center", va="center", fontsize=6,
                                    color="white" if share[i, k] < 0.5 * share.max() else "black")
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        else:
            cmap = __import__("matplotlib").colormaps["tab20" if K > 10 else "tab10"]
            left = np.zeros(P)
            for k in range(K):
                ax.barh(range(P), counts[:, k], left=left, color=cmap(k % cmap.N), label=names[k])
                left += counts[:, k]
            ax.invert_yaxis()
            ax.set_yticks(range(P), [str(i) for i in range(P)], fontsize=8)
            ax.set_xlabel("rows")
            ax.set_ylabel("party")
            ax.set_title("rows per party, stacked by label")
            if K <= 20:
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=2 if K > 10 else 1)
    if stats.title:
        fig.suptitle(stats.title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def _figure(figsize):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def plot_confusion_matrix(y: np.ndarray, pred: np.ndarray, n_classes: int, path, *, title: str = "",
                          dpi: int = 110) -> Path:
    """Save the confusion matrix of class ids ``pred`` against labels ``y`` (both int, (n,)) as a PNG:
    rows = true class, columns = predicted class, colour = share of the true class's rows, counts
    annotated (up to 20 classes). Returns the path written."""
    from sklearn.metrics import confusion_matrix

    labels = np.arange(int(n_classes))
    cm = confusion_matrix(np.asarray(y, np.int64), np.asarray(pred, np.int64), labels=labels)
    share = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)
    K = len(labels)
    fig = _figure((max(4.0, 0.5 * K + 2.5), max(3.5, 0.5 * K + 2.0)))
    ax = fig.subplots()
    im = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(K), [str(k) for k in labels], fontsize=8)
    ax.set_yticks(range(K), [str(k) for k in labels], fontsize=8)
    ax.set(xlabel="predicted class", ylabel="true class",
           title=f"{title + ': ' if title else ''}confusion matrix (accuracy {np.trace(cm) / max(cm.sum(), 1):.4f})")
    if K <= 20:
        for i in range(K):
            for j in range(K):
                ax.text(j, i, str(int(cm[i, j])), ha="center", va="center", fontsize=7,
                        color="white" if share[i, j] > 0.5 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def plot_predicted_vs_true(y: np.ndarray, pred: np.ndarray, path, *, title: str = "", dpi: int = 110) -> Path:
    """Save a scatter of regression predictions against the true values (both float, (n,)) with the
    identity line and RMSE / R² in the title, as a PNG. Returns the path written."""
    from sklearn.metrics import mean_squared_error, r2_score

    y, pred = np.asarray(y, np.float64), np.asarray(pred, np.float64)
    fig = _figure((4.8, 4.5))
    ax = fig.subplots()
    ax.scatter(y, pred, s=10, alpha=0.6)
    if len(y):
        lo, hi = float(min(y.min(), pred.min())), float(max(y.max(), pred.max()))
        ax.plot([lo, hi], [lo, hi], ls=":", c="grey", label="predicted = true")
        ax.legend(loc="upper left")
        stats = f"RMSE {np.sqrt(mean_squared_error(y, pred)):.4g}, R² {r2_score(y, pred):.4f}" if len(y) > 1 else ""
    else:
        stats = "no rows"
    ax.set(xlabel="true value", ylabel="predicted value", title=f"{title + ': ' if title else ''}{stats}")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
