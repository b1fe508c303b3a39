"""Reading big CSV / Parquet tables in row batches (pyarrow datasets), and quantile bin edges from a sketch.

For a party whose table does not fit in memory: :func:`iter_row_batches` yields pandas frames of at most
``batch_rows`` rows (peak memory set by ``batch_rows``, not by the table), and :func:`sketch_cuts` finds
per-column quantile bin edges in two passes over the batches with a fixed-size histogram sketch
(``sketch_bins`` equal cells between each column's min and max; the edges are exact to one cell),
in the manner of the weighted quantile sketch of XGBoost (Chen & Guestrin, KDD 2016, sec. 3.3).
Memory: O(batch_rows x columns + sketch_bins x columns).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np


def _dataset(path):
    import pyarrow.dataset as pads

    path = Path(path)
    suffix = path.suffix.lower() if path.is_file() else ""
    fmt = "csv" if suffix in (".csv", ".txt") else "parquet"
    return pads.dataset(str(path), format=fmt)


def iter_row_batches(path, batch_rows: int = 65_536, columns: list[str] | None = None) -> Iterator:
    """pandas DataFrames of at most ``batch_rows`` rows of the table at ``path``, in file order.

    ``path``: a ``.csv`` file, a Parquet file, or a folder of Parquet files. Raises ValueError for
    ``batch_rows < 1`` and for a column the table lacks (naming it).
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    ds = _dataset(path)
    if columns is not None:
        missing = [c for c in columns if c not in ds.schema.names]
        if missing:
            raise ValueError(f"{path}: no column(s) {missing}; columns: {ds.schema.names}")
    for batch in ds.to_batches(columns=columns, batch_size=batch_rows):
        if batch.num_rows:
            yield batch.to_pandas()


def sketch_cuts(path, columns: list[str], max_bin: int, *, sketch_bins: int = 2048,
                batch_rows: int = 65_536) -> dict[str, np.ndarray]:
    """Per column, up to ``max_bin - 1`` ascending inner bin edges at equal-count quantiles.

    Two passes over :func:`iter_row_batches` (min/max, then counts per sketch cell); missing values
    (NaN) are ignored. Edges are sketch-cell boundaries, so each quantile is within one cell
    (``(max - min) / sketch_bins``) of the exact one. A constant or empty column gets no edges.
    """
    lo = {c: np.inf for c in columns}
    hi = {c: -np.inf for c in columns}
    for frame in iter_row_batches(path, batch_rows, columns):
        for c in columns:
            v = frame[c].to_numpy(np.float64)
            if np.isfinite(v).any():
                lo[c], hi[c] = min(lo[c], np.nanmin(v)), max(hi[c], np.nanmax(v))
    counts = {c: np.zeros(sketch_bins, dtype=np.int64) for c in columns}
    for frame in iter_row_batches(path, batch_rows, columns):
        for c in columns:
            if not hi[c] > lo[c]:
                continue
            v = frame[c].to_numpy(np.float64)
            v = v[np.isfinite(v)]
            cell = np.minimum(((v - lo[c]) / (hi[c] - lo[c]) * sketch_bins).astype(np.int64), sketch_bins - 1)
            counts[c] += np.bincount(cell, minlength=sketch_bins)
    cuts = {}
    for c in columns:
        total = counts[c].sum()
        if not hi[c] > lo[c] or total == 0:
            cuts[c] = np.empty(0)
            continue
        cum = np.cumsum(counts[c])
        targets = total * np.arange(1, max_bin) / max_bin
        cells = np.unique(np.searchsorted(cum, targets, side="left"))
        cells = cells[cells < sketch_bins - 1]
        cuts[c] = lo[c] + (cells + 1) * (hi[c] - lo[c]) / sketch_bins
    return cuts
