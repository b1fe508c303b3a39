"""Binning rules and the host's encrypted-histogram kernels (checked against plaintext on real keys)."""
from __future__ import annotations

import numpy as np
import pytest

from secureflhv.crypto.homomorphic import paillier as pl
from secureflhv.crypto.homomorphic import paillier_hist as vh
from secureflhv.tree.binning import (Binner, apply_bins, cuts_from_grid_counts, fit_cuts, goes_left, grid,
                                     grid_counts, missing_bin, quantile_cuts)
from secureflhv.tree.params import precision_bits_for, quantise
from secureflhv.crypto.homomorphic.backend import compressed_packing, gh_packing


def test_quantile_cuts_and_bin_rule():
    rng = np.random.default_rng(0)
    x = rng.normal(size=5000)
    cuts = quantile_cuts(x, 32)
    assert len(cuts) == 31 and np.all(np.diff(cuts) > 0)
    b = apply_bins(x[:, None], [cuts])[:, 0]
    counts = np.bincount(b, minlength=32)
    assert counts.min() > 0.8 * 5000 / 32 and counts.max() < 1.2 * 5000 / 32  # quantiles: near-equal bins
    for k in (0, 10, 30):  # "bin <= k" is exactly "x < cuts[k]" (float32), the XGBoost split rule
        np.testing.assert_array_equal(b <= k, goes_left(x, cuts[k]))
    few = np.array([3.0, 1.0, 2.0, 2.0, 1.0])
    np.testing.assert_array_equal(quantile_cuts(few, 32), [2.0, 3.0])  # one bin per distinct value
    assert len(quantile_cuts(np.ones(10), 8)) == 0
    # missing values: cuts come from the present values; NaN is binned only when asked for
    np.testing.assert_array_equal(fit_cuts(np.array([[1.0], [np.nan], [2.0]]), 8)[0], [2.0])
    with pytest.raises(ValueError, match="NaN"):
        apply_bins(np.array([[1.0], [np.nan]]), [np.array([2.0])])
    with pytest.raises(ValueError, match="infinite"):
        fit_cuts(np.array([[1.0], [np.inf]]), 8)


def test_virtual_columns_are_both_default_directions():
    """Every prefix "virtual bin <= b" of a NaN column's two virtual columns is the split the Binner maps
    it to: present values x < threshold go left, missing ones go left exactly when default_left."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, 3))
    X[rng.random(400) < 0.3, 0] = np.nan
    X[:, 2] = np.nan
    X[5, 2] = 1.0                                     # nearly all missing
    binner = Binner.fit(X, 8)
    assert binner.columns == [(0, False), (0, True), (1, False), (2, False), (2, True)]
    real = apply_bins(X, binner.cuts, allow_nan=True)
    assert np.array_equal(real == missing_bin(real.dtype), np.isnan(X))
    vb = binner.virtual_bins(X)
    assert vb.shape == (400, 5) and all(vb[:, v].max() < binner.n_bins[v] for v in range(5))
    seen = set()
    for v in range(binner.n_virtual):
        for b in range(binner.n_bins[v] - 1):
            j, bin_, thr, dl = binner.split(v, b)
            left = vb[:, v] <= b
            np.testing.assert_array_equal(left, goes_left(X[:, j], thr, dl))
            np.testing.assert_array_equal(left[np.isnan(X[:, j])], dl)
            seen.add((j, dl, bin_))
    assert (0, True, -1) in seen and (0, False, len(binner.cuts[0])) in seen  # missing-only splits
    with pytest.raises(ValueError, match="infinite"):
        Binner.fit(np.array([[np.inf]]), 8)


def test_grid_cuts_are_additive_over_clients():
    rng = np.random.default_rng(1)
    parts = [rng.exponential(size=n) for n in (300, 1000, 50)]
    lo, hi = min(p.min() for p in parts), max(p.max() for p in parts)
    g = grid(lo, hi, 512)
    summed = sum(grid_counts(p, g) for p in parts)
    pooled = np.concatenate(parts)
    np.testing.assert_array_equal(summed, grid_counts(pooled, g))
    cuts = cuts_from_grid_counts(summed, g, 16)
    assert 8 <= len(cuts) <= 15 and np.all(np.diff(cuts) > 0)
    frac = np.array([np.mean(pooled < c) for c in cuts])
    assert np.all(np.diff(frac) > 0) and frac[0] < 0.15 and frac[-1] > 0.85


def test_encrypted_histograms_subtraction_cumulative_and_compression_on_real_keys():
    pub, priv = pl.generate_keypair(512, insecure_test_key=True)
    rng = np.random.default_rng(2)
    n, d, nb = 60, 3, 5
    g, h = rng.uniform(-1, 1, n), rng.uniform(0, 0.25, n)
    g[:3] = [-1.0, 1.0, 0.0]  # edge values
    p = precision_bits_for(n, 0)
    gq, hq = quantise(g, p), quantise(h, p)
    spec = gh_packing(pub.n_bits, p, 0, n)
    enc = pl.encrypt_packed(pub, np.stack([gq * 2.0 ** -p, hq * 2.0 ** -p], axis=1), spec)
    cts = enc.ciphertexts.tolist()
    bins = rng.integers(0, nb, size=(n, d)).astype(np.uint8)
    rows_parent, rows_child = np.arange(n), np.sort(rng.choice(n, 20, replace=False))
    parent = vh.build_node(cts, rows_parent, bins, [nb] * d, pub.nsquare)
    child = vh.build_node(cts, rows_child, bins, [nb] * d, pub.nsquare)
    sibling = vh.subtract(parent, child, pub.nsquare)
    cum = vh.cumulative(sibling, pub.nsquare)
    rows_sib = np.setdiff1d(rows_parent, rows_child)
    cands = [(j, b) for j in range(d) for b in range(nb - 1) if cum[j][b] is not None]
    cspec, per = compressed_packing(spec, pub.n_bits)
    assert per >= 2
    packed = vh.compress([cum[j][b] for j, b in cands], per, 2 * spec.slot_bits, pub.nsquare)
    arr = np.empty(len(packed), dtype=object)
    arr[:] = packed
    dec = pl.decrypt(priv, pl.EncryptedArray(pub, arr, cspec.exponent, cspec, n)).reshape(-1, 2)[:len(cands)]
    for (j, b), (gl, hl) in zip(cands, dec):
        sel = rows_sib[bins[rows_sib, j] <= b]
        assert gl == gq[sel].sum() * 2.0 ** -p and hl == hq[sel].sum() * 2.0 ** -p


def test_parallel_histograms_by_columns_and_by_rows_equal_inline(monkeypatch):
    """17 features (9 pairs) and 3 features (2 pairs) at 2 workers, cut into pieces of pairs and rows
    (the pair at the cut shared by both tasks): both equal the inline histograms exactly (including
    empty bins)."""
    pub, _ = pl.generate_keypair(512, insecure_test_key=True)
    rng = np.random.default_rng(5)
    n = 80
    cts = pl.encrypt(pub, rng.uniform(-1, 1, n)).ciphertexts.tolist()
    rows = np.sort(rng.choice(n, 60, replace=False))
    cases = []
    for d, nb in ((17, 3), (3, 4)):
        bins = rng.integers(0, nb, size=(n, d)).astype(np.uint8)
        bins[:, 0] = np.minimum(bins[:, 0], nb - 2)  # an empty last bin
        cases.append((bins, [nb] * d, vh.build_node(cts, rows, bins, [nb] * d, pub.nsquare)))
        assert cases[-1][2][0][nb - 1] is None
    monkeypatch.setattr(vh, "PAR_MIN_WORK", 1)
    pl.set_workers(2)
    try:
        for bins, n_bins, inline in cases:
            assert vh.build_node(cts, rows, bins, n_bins, pub.nsquare) == inline
    finally:
        pl.set_workers(None)


def test_work_pieces_cut_pairs_and_rows_into_equal_tasks():
    """Each task gets the same number of row x pair units; only the pair at a cut is shared."""
    for m, d, parts in ((10, 10, 2), (7, 3, 2), (100, 300, 3), (9, 5, 4)):
        tasks = vh.work_pieces(m, d, parts)
        units = -(-d // 2)
        sizes = [sum(r1 - r0 for _, _, r0, r1 in t) for t in tasks]
        assert len(tasks) == parts and max(sizes) - min(sizes) <= 1 and sum(sizes) == m * units
        for lo in range(0, d, 2):  # every pair's rows covered exactly once, in order
            rows = [(r0, r1) for t in tasks for a, b, r0, r1 in t if a == lo]
            assert rows[0][0] == 0 and rows[-1][1] == m and all(x[1] == y[0] for x, y in zip(rows, rows[1:]))
            assert all(b == min(d, lo + 2) for t in tasks for a, b, _, _ in t if a == lo)
    assert vh.work_pieces(10, 10, 2) == [[(0, 2, 0, 10), (2, 4, 0, 10), (4, 6, 0, 5)],
                                         [(4, 6, 5, 10), (6, 8, 0, 10), (8, 10, 0, 10)]]


def test_a_levels_small_nodes_go_to_the_workers_together_and_equal_inline(monkeypatch):
    """build_nodes: one node big enough for the row-split path, four small ones sent as whole nodes to 2
    workers (largest first onto the least loaded task): every node equals its inline histograms."""
    pub, _ = pl.generate_keypair(512, insecure_test_key=True)
    rng = np.random.default_rng(6)
    n, d, nb = 200, 4, 5
    cts = pl.encrypt(pub, rng.uniform(-1, 1, n)).ciphertexts.tolist()
    bins = rng.integers(0, nb, size=(n, d)).astype(np.uint8)
    perm = rng.permutation(n)
    rows_list = [np.sort(perm[a:b]) for a, b in ((0, 100), (100, 130), (130, 150), (150, 190), (190, 195))]
    inline = [vh.build_node(cts, r, bins, [nb] * d, pub.nsquare) for r in rows_list]
    calls = []
    run = vh._ex.run
    monkeypatch.setattr(vh._ex, "run", lambda fn, common, chunks: calls.append((fn, len(chunks))) or
                        run(fn, common, chunks))
    monkeypatch.setattr(vh, "PAR_MIN_WORK", 100 * d)        # only the first node is cut by rows
    monkeypatch.setattr(vh, "PAR_MIN_LEVEL_WORK", 1)
    pl.set_workers(2)
    try:
        assert vh.build_nodes(cts, rows_list, bins, [nb] * d, pub.nsquare) == inline
    finally:
        pl.set_workers(None)
    assert (vh.task_histograms_of_resident_nodes, 4) in calls, calls


def test_row_ciphertexts_are_sent_to_the_workers_once_and_again_after_a_worker_lost_them(monkeypatch):
    """The pool's workers keep a tree's row ciphertexts: a second node of the same list sends row indices
    only; a worker that lost the list (evicted here, as a restarted pool would) is sent it again, and
    every result equals the inline histograms."""
    from secureflhv.compute import pool as par

    pub, _ = pl.generate_keypair(512, insecure_test_key=True)
    rng = np.random.default_rng(7)
    n, d, nb = 120, 6, 4
    cts = pl.encrypt(pub, rng.uniform(-1, 1, n)).ciphertexts.tolist()
    bins = rng.integers(0, nb, size=(n, d)).astype(np.uint8)
    nodes = [np.arange(n), np.sort(rng.choice(n, 70, replace=False))]
    inline = [vh.build_node(cts, r, bins, [nb] * d, pub.nsquare) for r in nodes]
    installs = []
    on_each = par.on_each_worker
    monkeypatch.setattr(par, "on_each_worker", lambda fn, *a: installs.append(a[0]) or on_each(fn, *a))
    monkeypatch.setattr(vh, "PAR_MIN_WORK", 1)
    pl.set_workers(2)
    try:
        assert [vh.build_node(cts, r, bins, [nb] * d, pub.nsquare) for r in nodes] == inline
        assert len(installs) == 1
        for other in (-1, -2):  # two other lists evict this one from every worker (RESIDENT_KEEP = 2)
            on_each(vh._install, other, b"", 1)
        assert vh.build_node(cts, nodes[1], bins, [nb] * d, pub.nsquare) == inline[1]
        assert len(installs) == 2 and installs[1] != installs[0]
    finally:
        pl.set_workers(None)
