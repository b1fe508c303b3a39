"""Horizontal SecureBoost's bin edges from the federated sketch (range sketch of fedstats/statistics.py, then the
trees' grid counts over that range) are within the sketch's stated error of the pooled-data quantiles:
every cut is the upper boundary of the grid cell that holds the pooled order statistic of its target rank
k * N / max_bin, so 0 < cut - quantile <= w = (hi - lo) / sketch_bins."""
from __future__ import annotations

import math

import numpy as np

from secureflhv.fedstats.statistics import StatsSpec, decode_round_a, round_a_vector
from secureflhv.data.loaders import load_dataset
from secureflhv.tree.params import SecureBoostParams

from sb_harness import horizontal_run

MAX_BIN, CELLS = 16, 256


def sketch_ranges(parts, names):
    """The range sketch's (lo, hi) per feature: the pooled round-A vector (as secure aggregation sums it)."""
    spec = StatsSpec(tuple(names), moments=False)
    counts = decode_round_a(sum(round_a_vector(X, spec) for X, _ in parts), spec)
    return list(zip(counts.lo.tolist(), counts.hi.tolist()))


def test_sketch_cuts_are_within_one_grid_cell_of_pooled_quantiles():
    ds = load_dataset("breast_cancer_missing")
    X, y = ds.X[:, :5], ds.y            # 5 columns keep it quick; 20% of cells missing
    order = np.argsort(X[:, 0], kind="stable")   # non-IID by the first column (its NaN rows last)
    parts = [(X[p], y[p]) for p in np.array_split(order, 3)]
    ranges = sketch_ranges(parts, ds.feature_names[:5])
    params = SecureBoostParams(n_trees=1, max_depth=2, max_bin=MAX_BIN, sketch_bins=CELLS)
    run = horizontal_run(parts, params, feature_ranges=ranges)
    assert not run["errors"], run["errors"]
    cuts = run["server_model"].cuts
    checked = 0
    for j, (lo, hi) in enumerate(ranges):
        v = np.sort(X[:, j][~np.isnan(X[:, j])])
        assert lo <= v[0] and v[-1] <= hi                     # the range sketch holds every value
        w = (hi - lo) / CELLS
        tol = w * 1e-3 + 1e-6 * max(abs(lo), abs(hi))          # float32 grid boundaries
        c = np.asarray(cuts[j])
        assert len(c) >= MAX_BIN // 2
        last = v[-1] - w                                       # targets in the last non-empty cell get no cut
        for k in range(1, MAX_BIN):
            q = v[math.ceil(k * len(v) / MAX_BIN) - 1]
            if q < last:
                gap = c - q
                assert np.any((gap > 0) & (gap <= w + tol)), (j, k, q, c)
                checked += 1
        for cut in c:                                          # and every cut belongs to a target quantile
            qs = np.array([v[math.ceil(k * len(v) / MAX_BIN) - 1] for k in range(1, MAX_BIN)])
            assert np.any((cut - qs > 0) & (cut - qs <= w + tol)), (j, cut)
    assert checked >= 5 * (MAX_BIN - 2)
