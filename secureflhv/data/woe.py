"""Feature binning, weight of evidence (WOE) and information value (IV) of one party's columns: local math.

The federated part (the host's per-bin label counts under the guest's key) is
:mod:`secureflhv.vertical.woe_binning`; this module holds what each party computes on its own.

Bins of a column (:class:`ColumnBins`): ``edges`` e_1 < ... < e_{k-1} cut the finite values into k
left-closed bins, bin(x) = #{e : e <= x} (``np.searchsorted(edges, x, side="right")``): bin 0 is
(-inf, e_1), bin b is [e_b, e_{b+1}), bin k-1 is [e_{k-1}, inf). Missing values (NaN) take their own bin,
index k, always present (it may be empty). A column with at most ``n_bins`` distinct values gets one bin
per value (its codes: categorical columns arrive as integer codes, :mod:`secureflhv.data.tabular`).

Methods (:func:`column_edges`):
    ``quantile``: cuts at the column's ``n_bins``-quantiles (``numpy.quantile``, duplicates dropped);
    ``equal_width``: ``n_bins`` bins of equal width between the column's min and max;
    ``monotonic``: ``quantile`` into ``n_bins`` fine bins, then adjacent fine bins merged where their event
        rates break monotonicity (:func:`monotonic_groups`, pool-adjacent-violators by scikit-learn's
        ``IsotonicRegression``, direction by the sign of the rank correlation) and where a bin holds
        fewer than ``min_bin_fraction`` of the rows. The merging needs the labels: for a host's column the
        guest runs it on the per-bin counts and tells the host which cuts to keep.

WOE and IV (Siddiqi, "Credit Risk Scorecards", 2006, ch. 6; the convention of FATE's hetero feature
binning): with E events (y = 1) and N non-events over all rows, per bin b with e_b events and
n_b non-events, WOE_b = ln((e_b / E) / (n_b / N)) and IV = sum_b (e_b / E - n_b / N) * WOE_b. A bin with
no events or no non-events takes ``adjustment`` (default 0.5) added to both counts in that bin's
rates; an empty bin has WOE 0 and adds nothing to IV. A higher WOE means a riskier bin. Multiclass
labels 0..K-1: one-vs-rest, class k the event (:func:`woe_iv` per class).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Method = Literal["quantile", "equal_width", "monotonic"]
METHODS = ("quantile", "equal_width", "monotonic")


@dataclass(frozen=True)
class ColumnBins:
    """The bins of one column: ``edges`` (float64 (k-1,), strictly increasing) cut k value bins; bin k holds
    the missing values. ``n_bins`` = k + 1."""

    name: str
    edges: np.ndarray

    @property
    def n_bins(self) -> int:
        """Value bins plus the missing-value bin."""
        return len(self.edges) + 2

    def index(self, x: np.ndarray) -> np.ndarray:
        """int64 (n,) bin of each value of ``x`` (float64 (n,)); NaN -> the missing bin (``n_bins - 1``)."""
        x = np.asarray(x, dtype=np.float64)
        out = np.searchsorted(self.edges, x, side="right").astype(np.int64)
        out[np.isnan(x)] = len(self.edges) + 1
        return out

    def labels(self) -> list[str]:
        """One label per bin: ``[-inf, 1.5)``, ..., ``missing``."""
        cuts = [-np.inf, *self.edges.tolist(), np.inf]
        return [f"[{a:g}, {b:g})" for a, b in zip(cuts[:-1], cuts[1:])] + ["missing"]

    def merged(self, keep: np.ndarray) -> ColumnBins:
        """These bins with only the cuts ``keep`` (bool (k-1,)) left: adjacent value bins joined."""
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != self.edges.shape:
            raise ValueError(f"{self.name}: {keep.shape[0]} cut flags for {len(self.edges)} cuts")
        return ColumnBins(self.name, self.edges[keep])


def column_edges(x: np.ndarray, method: str, n_bins: int) -> np.ndarray:
    """The cuts of column ``x`` (float64 (n,), NaN = missing) for ``method`` (``monotonic``: its fine
    quantile cuts) and at most ``n_bins`` value bins; float64 (k-1,), strictly increasing, k <= n_bins.

    Raises ValueError for an unknown method or ``n_bins < 2``."""
    if method not in METHODS:
        raise ValueError(f"unknown binning method {method!r}; choose one of {METHODS}")
    if n_bins < 2:
        raise ValueError(f"n_bins must be >= 2, got {n_bins}")
    v = np.asarray(x, dtype=np.float64)
    v = v[~np.isnan(v)]
    distinct = np.unique(v)
    if len(distinct) <= n_bins:  # one bin per value (codes of a categorical column, or few values)
        return distinct[1:]
    if method == "equal_width":
        cuts = np.linspace(distinct[0], distinct[-1], n_bins + 1)[1:-1]
    else:
        cuts = np.quantile(v, np.linspace(0, 1, n_bins + 1)[1:-1])
    cuts = np.unique(cuts)
    return cuts[(cuts > distinct[0]) & (cuts <= distinct[-1])]  # no empty first bin, no cut past the data


def bin_label_counts(index: np.ndarray, y: np.ndarray, n_bins: int, n_classes: int) -> np.ndarray:
    """int64 (n_bins, n_classes): rows of each bin (``index``, int (n,)) and class (``y``, ints 0..K-1)."""
    out = np.zeros((n_bins, n_classes), dtype=np.int64)
    np.add.at(out, (np.asarray(index, dtype=np.int64), np.asarray(y, dtype=np.int64)), 1)
    return out


def woe_iv(events: np.ndarray, non_events: np.ndarray, adjustment: float = 0.5) -> tuple[np.ndarray, float]:
    """WOE per bin (float64 (b,)) and the IV of one column from its per-bin event and non-event counts
    (each (b,), non-negative). See the module docstring for the formula and the adjustment.

    Raises ValueError when there are no events or no non-events at all (the WOE is undefined)."""
    e = np.asarray(events, dtype=np.float64)
    ne = np.asarray(non_events, dtype=np.float64)
    total_e, total_ne = e.sum(), ne.sum()
    if total_e <= 0 or total_ne <= 0:
        raise ValueError("WOE needs both events and non-events among the rows")
    fix = ((e == 0) | (ne == 0)) & (e + ne > 0)
    e_adj, ne_adj = e + adjustment * fix, ne + adjustment * fix
    woe = np.zeros_like(e)
    used = e + ne > 0
    rate_e, rate_ne = e_adj / total_e, ne_adj / total_ne
    woe[used] = np.log(rate_e[used] / rate_ne[used])
    iv = float(np.sum((rate_e - rate_ne)[used] * woe[used]))
    return woe, iv


def monotonic_groups(events: np.ndarray, counts: np.ndarray, min_rows: int = 1) -> np.ndarray:
    """Which cuts between adjacent value bins to keep (bool (b-1,)) so that the merged bins' event rates
    are monotonic (non-decreasing or non-increasing, whichever the bins' rank correlation favours) and
    every merged non-empty bin holds at least ``min_rows`` rows.

    ``events``, ``counts``: per value bin (b,), int (the missing bin excluded). Pool-adjacent-violators:
    scikit-learn's ``IsotonicRegression`` weighted by the bin counts; adjacent bins with equal fitted
    rates merge. Then the smallest bin below ``min_rows`` merges with the neighbour whose rate is
    closer, until none is left below it (or one bin remains).
    """
    from scipy.stats import spearmanr
    from sklearn.isotonic import IsotonicRegression

    events = np.asarray(events, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    b = len(counts)
    if b <= 1:
        return np.zeros(max(0, b - 1), dtype=bool)
    used = counts > 0
    rate = np.divide(events, counts, out=np.zeros(b), where=used)
    pos = np.arange(b, dtype=np.float64)
    increasing = True
    if used.sum() >= 2 and np.ptp(rate[used]) > 0:
        rho = spearmanr(pos[used], rate[used]).statistic
        increasing = not (np.isfinite(rho) and rho < 0)
    fitted = np.zeros(b)
    fitted[used] = IsotonicRegression(increasing=increasing).fit(pos[used], rate[used],
                                                                  sample_weight=counts[used]).predict(pos[used])
    groups: list[list[int]] = []
    last = None
    for i in range(b):  # an empty bin joins the group before it (or the first one)
        if groups and (not used[i] or fitted[i] == last):
            groups[-1].append(i)
        else:
            groups.append([i])
        if used[i]:
            last = fitted[i]
    _merge_small(groups, events, counts, min_rows)
    keep = np.zeros(b - 1, dtype=bool)
    for g in groups[1:]:
        keep[g[0] - 1] = True  # the cut before the group's first bin
    return keep


def _merge_small(groups: list[list[int]], events: np.ndarray, counts: np.ndarray, min_rows: int) -> None:
    """Merge (in place) the smallest group below ``min_rows`` rows into its neighbour of closer event rate."""
    def size(g):
        return counts[g].sum()

    def rate(g):
        return events[g].sum() / max(size(g), 1.0)

    while len(groups) > 1:
        small = min(range(len(groups)), key=lambda i: size(groups[i]))
        if size(groups[small]) >= min_rows:
            return
        if small == 0:
            other = 1
        elif small == len(groups) - 1:
            other = small - 1
        else:
            r = rate(groups[small])
            other = small - 1 if abs(rate(groups[small - 1]) - r) <= abs(rate(groups[small + 1]) - r) else small + 1
        lo, hi = sorted((small, other))
        groups[lo:hi + 1] = [groups[lo] + groups[hi]]


@dataclass(frozen=True)
class WOEEncoder:
    """Keeps the selected columns of a table and encodes each by its bins: the bin's WOE, or (a host
    that was not sent its WOE) the bin index as a number. What a ``feature_binning`` job's bundle holds
    and a vertical job with ``params.woe_from`` applies before its own preprocessing, in training and
    in prediction.

    ``columns``: input column names (the table's, in its order); ``bins``: the kept columns' bins;
    ``woe``: per kept column float64 (n_bins,), or None for bin-index encoding.
    """

    columns: list[str]
    bins: list[ColumnBins]
    woe: list[np.ndarray] | None

    def __post_init__(self):
        missing = [b.name for b in self.bins if b.name not in self.columns]
        if missing:
            raise ValueError(f"binned columns {missing} are not among the table's columns {self.columns}")
        if self.woe is not None and [len(w) for w in self.woe] != [b.n_bins for b in self.bins]:
            raise ValueError("one WOE value per bin of each kept column")

    @property
    def output_names(self) -> list[str]:
        """The encoded columns: ``woe(<name>)`` or ``bin(<name>)``."""
        kind = "bin" if self.woe is None else "woe"
        return [f"{kind}({b.name})" for b in self.bins]

    def transform(self, X: np.ndarray) -> np.ndarray:
        """float64 (n, kept) encoded from X (float64 (n, len(columns)), NaN = missing)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(self.columns):
            raise ValueError(f"expected (n, {len(self.columns)}) rows of columns {self.columns}, got {X.shape}")
        out = np.empty((len(X), len(self.bins)))
        for k, b in enumerate(self.bins):
            idx = b.index(X[:, self.columns.index(b.name)])
            out[:, k] = idx if self.woe is None else self.woe[k][idx]
        return out

    def to_dict(self) -> dict:
        """JSON-ready state (a bundle's ``preprocessing["woe"]``)."""
        return {"columns": list(self.columns), "names": [b.name for b in self.bins],
                "edges": [b.edges.tolist() for b in self.bins],
                "woe": None if self.woe is None else [w.tolist() for w in self.woe]}

    @classmethod
    def from_dict(cls, d: dict) -> WOEEncoder:
        """The encoder of :meth:`to_dict`; ValueError on a malformed state."""
        try:
            bins = [ColumnBins(str(n), np.asarray(e, dtype=np.float64)) for n, e in zip(d["names"], d["edges"],
                                                                                          strict=True)]
            woe = None if d.get("woe") is None else [np.asarray(w, dtype=np.float64) for w in d["woe"]]
            if any(np.any(np.diff(b.edges) <= 0) for b in bins):
                raise ValueError("cuts must increase")
            return cls([str(c) for c in d["columns"]], bins, woe)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed WOE encoder state: {exc}") from None
