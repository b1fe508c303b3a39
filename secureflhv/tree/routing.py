"""Split routing on the party's executor: which side of its split each queried row goes.

SecureBoost routes rows in two places: a split's owner partitions the node's training rows
(``bins[rows, v] <= b``) and, in prediction, answers which way the queried rows go
(:func:`~secureflhv.tree.binning.goes_left` on the raw column). On an executor that keeps row shards
(Ray, :mod:`secureflhv.compute.ray_executor`) one batch of such queries runs as one task per shard,
next to the shard of the party's own matrix; only the packed left/right bits come back. On the local
pool (or below ``ROUTE_MIN`` rows) it is the same numpy comparison in this process. Either way the
masks are identical: the rule is :func:`goes_left` / ``<=`` element by element.

Only the party's own columns and the row indices it already knows are involved; nothing here
reaches a peer.
"""
from __future__ import annotations

import numpy as np

from ..compute import executor as _ex
from .binning import _f32, goes_left

ROUTE_MIN = 100_000  # rows per batch below which routing stays a numpy comparison here (it is cheap)


def task_route(binned: bool, X_part: np.ndarray, cols: np.ndarray, thr: np.ndarray,
               dl: np.ndarray) -> tuple[int, np.ndarray]:
    """(k, packed bits) of "goes left" for row i < k of ``X_part`` at split (cols[i], thr[i], dl[i]).

    ``binned``: X holds bin indices and the rule is ``bin <= thr`` (training partitions); else raw
    values and the rule of :func:`goes_left` per row (float32 ``x < thr``, NaN -> ``dl``).
    """
    x = X_part[np.arange(len(cols)), cols]
    if binned:
        left = x <= thr
    else:
        x32 = _f32(x, allow_nan=True)
        with np.errstate(invalid="ignore"):
            left = np.where(np.isnan(x32), dl, x32 < thr.astype(np.float32))
    return len(left), np.packbits(left)


def left_masks(X: np.ndarray, queries: list[tuple[int, float, bool, np.ndarray]], *, binned: bool) -> list[np.ndarray]:
    """Left masks (bool, one per query row) of ``queries`` = [(column, threshold, default_left, rows)].

    ``X``: the party's matrix (n, d): bins (``binned``) or raw features (float, NaN allowed);
    ``rows``: int64 row indices of X. The same result on every executor.
    Raises ValueError on infinite feature values (as :func:`goes_left`).
    """
    sizes = [len(q[3]) for q in queries]
    total = sum(sizes)
    if total and _ex.parallel_chunks(total, ROUTE_MIN) > 1:
        rows = np.concatenate([np.asarray(q[3], dtype=np.int64) for q in queries])
        order = np.argsort(rows, kind="stable")  # the shards want non-decreasing rows
        cols = np.repeat(np.asarray([q[0] for q in queries], dtype=np.int64), sizes)[order]
        thr = np.repeat(np.asarray([q[1] for q in queries], dtype=np.float64), sizes)[order]
        dl = np.repeat(np.asarray([bool(q[2]) for q in queries], dtype=bool), sizes)[order]
        res = _ex.run_sharded(task_route, (bool(binned),), (X,), rows[order], aligned=(cols, thr, dl))
        if res is not None:
            left = np.empty(total, dtype=bool)
            left[order] = np.concatenate([np.unpackbits(bits, count=int(k)).astype(bool) for k, bits in res])
            return np.split(left, np.cumsum(sizes)[:-1])
    return [_local(X, *q, binned=binned) for q in queries]


def _local(X, col, thr, dl, rows, *, binned: bool) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64)
    return X[rows, col] <= thr if binned else goes_left(X[rows, col], thr, dl)
