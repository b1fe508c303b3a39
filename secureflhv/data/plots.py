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
