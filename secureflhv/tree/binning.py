"""Quantile binning: cut points per feature and the integer bin of every value.

Convention (XGBoost's ``hist``): a feature with cuts c_0 < c_1 < ... < c_{k-1} has k + 1 bins;
``bin(x) = #{j : c_j <= x}``; the split "bin <= b" sends x left exactly when ``x < c_b`` (XGBoost's
``split_condition``). Values are compared in float32 and cuts are float32 numbers (stored in float64),
so a model exported to XGBoost (which reads features as float32) routes every row the same way.

Missing values (NaN; infinities are still rejected) follow XGBoost's sparsity-aware split finding
(Chen & Guestrin, KDD 2016, Alg. 3): cuts are fitted on the present values only, a NaN gets the
sentinel bin :func:`missing_bin` (the largest value of the bin dtype), and every split carries a
default direction ``default_left`` for missing values. :class:`Binner` turns this into ordinary
cumulative-histogram split finding by giving a column that has NaN in the training rows two *virtual
columns*: (A) the value bins 0..k, then the missing bin k+1 last — prefix "bin <= b" sends missing
rows right (``default_left`` False); (B) the missing bin 0 first, then the value bins shifted by one —
prefix "bin <= b" sends missing rows left (b = 0: only the missing rows go left). Trying every prefix
of both is exactly Alg. 3's two enumerations. A column without NaN in training has only (A): missing
values met at prediction go right, as XGBoost's ``hist`` does (it enumerates the missing-left
direction only where a node has missing values, and its forward pass sets ``default_left`` false).

Two ways to get cuts:

* :func:`quantile_cuts` — exact quantiles of one party's own column (vertical SecureBoost: each party
  bins its own columns, nobody else learns its cuts). With at most ``max_bin`` distinct values every
  distinct value gets its own bin.
* :func:`grid` + :func:`grid_counts` + :func:`cuts_from_grid_counts` — horizontal: a public grid of
  ``sketch_bins`` equal cells over the global range [lo, hi]; each client counts its values per cell,
  the counts are summed by secure aggregation, and the server places cut k at the first cell boundary
  where the global cumulative count reaches k * N / max_bin. Revealed: the global count per grid cell
  (not any client's), and the global range (see :mod:`secureflhv.tree.horizontal`).
"""
from __future__ import annotations

import numpy as np


def _f32(x, allow_nan: bool = False) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if allow_nan:
        if np.isinf(a).any():
            raise ValueError("features contain infinite values")
    elif not np.all(np.isfinite(a)):
        raise ValueError("features contain NaN or infinite values (missing values are not supported here)")
    return a.astype(np.float32)


def missing_bin(dtype) -> int:
    """The bin of a missing value in a bin matrix of ``dtype`` (uint8: 255, uint16: 65535)."""
    return int(np.iinfo(dtype).max)


def quantile_cuts(x, max_bin: int) -> np.ndarray:
    """Cuts (float64 holding float32 values, increasing, at most max_bin - 1) of one column (n,).

    NaN values are ignored (an all-NaN column has no cuts); infinities raise ValueError.
    """
    v = np.sort(_f32(x, allow_nan=True))
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return np.zeros(0)
    u = np.unique(v)
    if len(u) <= max_bin:
        cuts = u[1:]
    else:
        idx = (np.arange(1, max_bin, dtype=np.int64) * len(v)) // max_bin
        cuts = np.unique(v[idx])
        cuts = cuts[cuts > v[0]]
    return cuts.astype(np.float64)


def fit_cuts(X, max_bin: int) -> list[np.ndarray]:
    """:func:`quantile_cuts` of every column of X (n, d)."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"X: expected (rows, features), got shape {X.shape}")
    return [quantile_cuts(X[:, j], max_bin) for j in range(X.shape[1])]


def apply_bins(X, cuts: list[np.ndarray], allow_nan: bool = False) -> np.ndarray:
    """Bin indices uint8 (n, d) (uint16 if some feature has >= 255 cuts).

    With ``allow_nan`` a NaN gets :func:`missing_bin` of the dtype (never a value bin); without it
    NaN raises ValueError. Infinities always raise.
    """
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != len(cuts):
        raise ValueError(f"X: expected (rows, {len(cuts)}) features, got shape {X.shape}")
    X32 = _f32(X, allow_nan)
    dtype = np.uint8 if max((len(c) for c in cuts), default=0) < 255 else np.uint16
    out = np.empty(X.shape, dtype=dtype)
    for j, c in enumerate(cuts):
        out[:, j] = np.searchsorted(np.asarray(c, dtype=np.float32), X32[:, j], side="right")
    if allow_nan:
        out[np.isnan(X32)] = missing_bin(dtype)
    return out


def threshold_of(cuts: np.ndarray, b: int) -> float:
    """The threshold of the split "value bin <= b" of a column with ``cuts``.

    b in [0, len(cuts)): ``cuts[b]``; b = len(cuts) (every present value left, only missing ones can
    go right): +inf; b = -1 (no present value left, only missing ones can go left): -inf.
    """
    if b == len(cuts):
        return float("inf")
    if b == -1:
        return float("-inf")
    return float(cuts[b])


def goes_left(x, threshold: float, default_left: bool = False) -> np.ndarray:
    """Bool mask: x < threshold in float32 (the routing rule of every split); NaN: ``default_left``."""
    x32 = _f32(x, allow_nan=True)
    nan = np.isnan(x32)
    with np.errstate(invalid="ignore"):
        left = x32 < np.float32(threshold)
    return np.where(nan, bool(default_left), left)


class Binner:
    """One party's binning of its own columns: cuts, which columns had NaN in training, virtual columns.

    Virtual columns (see the module docstring), in this order: for each feature j in order, (A) then,
    if feature j had NaN in the training rows, (B). A candidate (virtual column v, virtual bin b) is
    the split :meth:`split` returns; the order of (v, b) is the order (feature, default_left false
    before true, value bin) that every role and the centralised twin use to break ties between equal
    gains (first wins).

    Args:
        cuts: per feature the cuts (see :func:`quantile_cuts`).
        missing: bool (d,) — feature j had NaN in the training rows.
    """

    def __init__(self, cuts: list[np.ndarray], missing):
        self.cuts = [np.asarray(c, dtype=np.float64) for c in cuts]
        self.missing = np.asarray(missing, dtype=bool).reshape(-1)
        if len(self.missing) != len(self.cuts):
            raise ValueError(f"missing: {len(self.missing)} flags for {len(self.cuts)} features")
        self.columns: list[tuple[int, bool]] = []
        for j in range(len(self.cuts)):
            self.columns.append((j, False))
            if self.missing[j]:
                self.columns.append((j, True))
        self.n_bins = [len(self.cuts[j]) + 1 + int(self.missing[j]) for j, _ in self.columns]

    @classmethod
    def fit(cls, X, max_bin: int, cuts: list[np.ndarray] | None = None) -> "Binner":
        """Cuts of X (n, d) (or the given ``cuts``) and its NaN columns. ValueError on infinities."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X: expected (rows, features), got shape {X.shape}")
        _f32(X, allow_nan=True)
        return cls(fit_cuts(X, max_bin) if cuts is None else cuts, np.isnan(X).any(axis=0))

    @property
    def n_virtual(self) -> int:
        """Number of binned columns (the columns of the binned matrix)."""
        return len(self.columns)

    def virtual_bins(self, X) -> np.ndarray:
        """The virtual bin matrix (n, n_virtual) of X (n, d), uint8 or uint16.

        A NaN in a column without NaN in training lands in (A)'s value bin 0 (training rows never
        do that: the matrix is for the training rows, on which histograms are built).
        """
        bins = apply_bins(X, self.cuts, allow_nan=True)
        miss = bins == missing_bin(bins.dtype)
        dtype = np.uint8 if max(self.n_bins, default=0) <= 256 else np.uint16
        out = np.empty((bins.shape[0], self.n_virtual), dtype=dtype)
        for v, (j, left) in enumerate(self.columns):
            col = bins[:, j].astype(np.int64)
            k1 = len(self.cuts[j]) + 1                   # value bins 0..k, k + 1 = len(cuts) + 1 of them
            if left:
                out[:, v] = np.where(miss[:, j], 0, col + 1)
            else:
                out[:, v] = np.where(miss[:, j], k1 if self.missing[j] else 0, col)
        return out

    def split(self, v: int, b: int) -> tuple[int, int, float, bool]:
        """(feature, value bin, threshold, default_left) of candidate "virtual bin <= b" of column v."""
        j, left = self.columns[v]
        vb = b - 1 if left else b
        return j, vb, threshold_of(self.cuts[j], vb), left


# ------------------------------------------------------------------------------ horizontal
def grid(lo: float, hi: float, cells: int) -> np.ndarray:
    """The cells - 1 interior boundaries (float32, non-decreasing) of ``cells`` equal cells over [lo, hi]."""
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi < lo:
        raise ValueError(f"grid range [{lo}, {hi}] is not a finite interval")
    return np.unique((lo + (hi - lo) * np.arange(1, cells) / cells).astype(np.float32))


def grid_counts(x, boundaries: np.ndarray) -> np.ndarray:
    """Counts (float64, len(boundaries) + 1) of the values of x (n,) per grid cell."""
    cell = np.searchsorted(boundaries, _f32(x), side="right")
    return np.bincount(cell, minlength=len(boundaries) + 1).astype(np.float64)


def cuts_from_grid_counts(counts: np.ndarray, boundaries: np.ndarray, max_bin: int) -> np.ndarray:
    """Global cuts from global per-cell counts (deterministic: same counts, same cuts).

    Cut k (k = 1 .. max_bin - 1) is the boundary after the first cell where the cumulative count
    reaches k * N / max_bin; a boundary after the last non-empty cell is dropped (nothing right of it).
    """
    counts = np.asarray(counts, dtype=np.float64)
    cum = np.cumsum(counts)
    total = cum[-1] if len(cum) else 0.0
    nonempty = np.flatnonzero(counts > 0)
    if total <= 0 or len(nonempty) <= 1:
        return np.zeros(0)
    if len(nonempty) <= max_bin:
        cells = nonempty[:-1]
    else:
        targets = np.arange(1, max_bin) * total / max_bin
        cells = np.unique(np.searchsorted(cum, targets, side="left"))
        cells = cells[cells < nonempty[-1]]
    return np.unique(boundaries[cells]).astype(np.float64)
