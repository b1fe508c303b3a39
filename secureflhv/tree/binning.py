"""Quantile binning: cut points per feature and the integer bin of every value.

Convention (XGBoost's ``hist``): a feature with cuts c_0 < c_1 < ... < c_{k-1} has k + 1 bins;
``bin(x) = #{j : c_j <= x}``; the split "bin <= b" sends x left exactly when ``x < c_b`` (XGBoost's
``split_condition``). Values are compared in float32 and cuts are float32 numbers (stored in float64),
so a model exported to XGBoost (which reads features as float32) routes every row the same way.
Missing values are not supported (NaN raises ValueError).

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


def _f32(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError("features contain NaN or infinite values (missing values are not supported)")
    return a.astype(np.float32)


def quantile_cuts(x, max_bin: int) -> np.ndarray:
    """Cuts (float64 holding float32 values, increasing, at most max_bin - 1) of one column (n,)."""
    v = np.sort(_f32(x))
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


def apply_bins(X, cuts: list[np.ndarray]) -> np.ndarray:
    """Bin indices uint8 (n, d) (uint16 if some feature has > 255 cuts)."""
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != len(cuts):
        raise ValueError(f"X: expected (rows, {len(cuts)}) features, got shape {X.shape}")
    X32 = _f32(X)
    dtype = np.uint8 if max((len(c) for c in cuts), default=0) < 255 else np.uint16
    out = np.empty(X.shape, dtype=dtype)
    for j, c in enumerate(cuts):
        out[:, j] = np.searchsorted(np.asarray(c, dtype=np.float32), X32[:, j], side="right")
    return out


def goes_left(x, threshold: float) -> np.ndarray:
    """Bool mask: x < threshold in float32 (the routing rule of every split)."""
    return _f32(x) < np.float32(threshold)


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
