"""Partition statistics: sizes, label histograms and divergence from the global label distribution.

Divergences between a party's label distribution p_i and the global distribution q (of all rows
given in ``labels``), per party:

* ``emd``: sum_k |p_i(k) - q(k)|, the L1 "earth mover's distance" of Zhao et al. 2018 ("Federated
  Learning with Non-IID Data", section 3), in [0, 2];
* ``js``: Jensen-Shannon divergence with log base 2, in [0, 1];
* ``hellinger``: sqrt(1/2 * sum_k (sqrt p_i(k) - sqrt q(k))^2), in [0, 1].

Each is summarised as a plain mean over non-empty parties and as a size-weighted mean
(sum_i n_i d_i / sum_i n_i).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METRICS = ("emd", "js", "hellinger")


def _kl2(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(p > 0, p * np.log2(p / q), 0.0)
    return t.sum(axis=-1)


def divergences(p: np.ndarray, q: np.ndarray) -> dict[str, np.ndarray]:
    """EMD (L1), Jensen-Shannon (base 2) and Hellinger between rows of ``p`` (m, K) and ``q`` (K,).
    Rows of p that are all zero (empty parties) give NaN."""
    p = np.atleast_2d(np.asarray(p, dtype=np.float64))
    q = np.asarray(q, dtype=np.float64)
    empty = p.sum(axis=1) == 0
    m = 0.5 * (p + q)
    out = {
        "emd": np.abs(p - q).sum(axis=1),
        "js": np.clip(0.5 * _kl2(p, m) + 0.5 * _kl2(np.broadcast_to(q, p.shape), m), 0.0, 1.0),
        "hellinger": np.sqrt(np.clip(0.5 * ((np.sqrt(p) - np.sqrt(q)) ** 2).sum(axis=1), 0.0, 1.0)),
    }
    for v in out.values():
        v[empty] = np.nan
    return out


@dataclass
class PartitionStats:
    """Statistics of a horizontal partition.

    Attributes:
        classes: (K,) the distinct labels (columns of ``counts``).
        counts: (P, K) int64 rows of each label per party.
        sizes: (P,) int64 rows per party.
        global_dist: (K,) label distribution of all ``labels``.
        per_party: {"emd"|"js"|"hellinger": (P,) float64} divergence of each party (NaN if empty).
        mean, weighted_mean: {metric: float} plain / size-weighted averages over non-empty parties.
        label_names: optional display names for ``classes``.
        title: free text for tables and plots.
    """

    classes: np.ndarray
    counts: np.ndarray
    sizes: np.ndarray
    global_dist: np.ndarray
    per_party: dict
    mean: dict
    weighted_mean: dict
    label_names: list[str] | None = None
    title: str = ""

    @property
    def n_parties(self) -> int:
        """Number of parties (rows of ``counts``)."""
        return self.counts.shape[0]

    def class_labels(self) -> list[str]:
        """The classes as display strings: their ``label_names`` when integer codes have names, else ``str(c)``."""
        if self.label_names is not None and len(self.label_names) > int(np.max(self.classes, initial=0)) \
                and np.issubdtype(self.classes.dtype, np.integer):
            return [self.label_names[int(c)] for c in self.classes]
        return [str(c) for c in self.classes]

    def to_dict(self) -> dict:
        """JSON-ready summary."""
        return {
            "title": self.title,
            "classes": [c.item() if hasattr(c, "item") else c for c in self.classes],
            "sizes": self.sizes.tolist(),
            "counts": self.counts.tolist(),
            "global_dist": self.global_dist.tolist(),
            "per_party": {k: [None if np.isnan(x) else float(x) for x in v] for k, v in self.per_party.items()},
            "mean": self.mean,
            "weighted_mean": self.weighted_mean,
        }


def partition_stats(labels, indices, *, classes=None, label_names=None, title: str = "") -> PartitionStats:
    """Compute :class:`PartitionStats` for shards ``indices`` (list of row-index arrays) of ``labels``.

    ``labels`` is the full label array the indices point into (pass the noisy labels for
    label_noise); ``classes`` fixes the label set/order (default: sorted distinct labels).
    Raises ValueError if an index is out of range or a shard's label is not in ``classes``.
    """
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    classes = np.unique(y) if classes is None else np.asarray(classes)
    code_all = np.searchsorted(classes, y)
    code_all = np.clip(code_all, 0, len(classes) - 1)
    if not np.array_equal(classes[code_all], y):
        raise ValueError("labels contain values outside classes")
    K = len(classes)
    counts = np.zeros((len(indices), K), dtype=np.int64)
    for i, rows in enumerate(indices):
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= y.shape[0]):
            raise ValueError(f"indices of party {i} out of range [0, {y.shape[0]})")
        counts[i] = np.bincount(code_all[rows], minlength=K)
    sizes = counts.sum(axis=1)
    q = np.bincount(code_all, minlength=K) / y.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(sizes[:, None] > 0, counts / np.maximum(sizes[:, None], 1), 0.0)
    per = divergences(p, q)
    ok = sizes > 0
    mean = {k: float(np.mean(v[ok])) if ok.any() else float("nan") for k, v in per.items()}
    wmean = {k: float(np.sum(v[ok] * sizes[ok]) / sizes[ok].sum()) if ok.any() else float("nan")
             for k, v in per.items()}
    return PartitionStats(classes, counts, sizes, q, per, mean, wmean, label_names, title)


# ------------------------------------------------------------------------------------------------
# presentation
# ------------------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return "-" if x is None or np.isnan(x) else f"{x:.3f}"


def stats_rows(stats: PartitionStats, max_classes: int = 12,
               names: bool = True) -> tuple[list[str], list[list[str]]]:
    """Header and rows (strings) shared by the rich and Markdown tables. With more than
    ``max_classes`` labels the per-label columns are replaced by a count of labels present.
    ``names=False`` heads the label columns with the raw label values instead of display names."""
    labels = stats.class_labels() if names else [str(c) for c in stats.classes]
    show = len(labels) <= max_classes
    header = ["party", "rows"] + (labels if show else ["#labels"]) + ["EMD", "JS", "Hellinger"]
    rows = []
    for i in range(stats.n_parties):
        cls = [str(int(c)) for c in stats.counts[i]] if show else [str(int((stats.counts[i] > 0).sum()))]
        rows.append([str(i), str(int(stats.sizes[i]))] + cls +
                    [_fmt(stats.per_party[m][i]) for m in METRICS])
    pad = [""] * (len(labels) if show else 1)
    rows.append(["mean", f"{stats.sizes.mean():.1f}"] + pad + [_fmt(stats.mean[m]) for m in METRICS])
    rows.append(["size-weighted", ""] + pad + [_fmt(stats.weighted_mean[m]) for m in METRICS])
    return header, rows


def stats_table(stats: PartitionStats, max_classes: int = 12):
    """A ``rich.table.Table`` of sizes, per-label counts and divergences (plus mean rows)."""
    from rich.table import Table

    header, rows = stats_rows(stats, max_classes, names=False)
    caption = None
    if stats.label_names is not None and stats.class_labels() != [str(c) for c in stats.classes]:
        caption = "labels: " + ", ".join(f"{c}={n}" for c, n in zip(stats.classes, stats.class_labels()))
    t = Table(title=stats.title or None, caption=caption)
    for j, h in enumerate(header):
        t.add_column(h, justify="left" if j == 0 else "right")
    for r in rows[:-2]:
        t.add_row(*r)
    t.add_section()
    for r in rows[-2:]:
        t.add_row(*r)
    return t


def print_stats(stats: PartitionStats, console=None, max_classes: int = 12) -> None:
    """Print :func:`stats_table` with rich (to ``console`` or stdout)."""
    from rich.console import Console

    if console is None:
        console = Console()
        if not console.is_terminal:  # piped output: do not squeeze the table into 80 columns
            console = Console(width=max(console.width, 160))
    console.print(stats_table(stats, max_classes))


def stats_markdown(stats: PartitionStats, max_classes: int = 12) -> str:
    """The same table as GitHub-flavoured Markdown."""
    header, rows = stats_rows(stats, max_classes)
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(h) for h in header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for r in rows[:-2]:
        lines.append("| " + " | ".join(r) + " |")
    for r in rows[-2:]:
        lines.append("| **" + r[0] + "** | " + " | ".join(r[1:]) + " |")
    return "\n".join(lines) + "\n"
