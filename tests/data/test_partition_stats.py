"""Statistics (sizes, histograms, EMD / JS / Hellinger) and the PNG picture."""
import io
import math

import numpy as np
import pytest
from rich.console import Console

from secureflhv.data import (divergences, partition, partition_stats, plot_label_distribution, print_stats,
                             stats_markdown)


def test_divergences_hand_computed():
    q = np.array([0.5, 0.5])
    d = divergences(np.array([[1.0, 0.0], [0.5, 0.5]]), q)
    np.testing.assert_allclose(d["emd"], [1.0, 0.0])
    # JS(base 2) of (1,0) vs (.5,.5): m = (.75,.25); 0.5*log2(1/.75) + 0.5*(.5log2(.5/.75)+.5log2(.5/.25))
    js = 0.5 * math.log2(1 / 0.75) + 0.5 * (0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(0.5 / 0.25))
    np.testing.assert_allclose(d["js"], [js, 0.0], atol=1e-12)
    hel = math.sqrt(0.5 * ((1 - math.sqrt(0.5)) ** 2 + 0.5))
    np.testing.assert_allclose(d["hellinger"], [hel, 0.0], atol=1e-12)
    disjoint = divergences(np.array([[1.0, 0.0]]), np.array([0.0, 1.0]))
    np.testing.assert_allclose([disjoint["emd"][0], disjoint["js"][0], disjoint["hellinger"][0]], [2, 1, 1])


def test_stats_counts_and_weighted_means():
    y = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    idx = [np.array([0, 1, 2]), np.array([3, 4, 5, 6, 7])]
    st = partition_stats(y, idx)
    np.testing.assert_array_equal(st.counts, [[3, 0, 0], [0, 3, 2]])
    np.testing.assert_array_equal(st.sizes, [3, 5])
    np.testing.assert_allclose(st.global_dist, [3 / 8, 3 / 8, 2 / 8])
    emd0 = abs(1 - 3 / 8) + 3 / 8 + 2 / 8
    emd1 = 3 / 8 + abs(3 / 5 - 3 / 8) + abs(2 / 5 - 2 / 8)
    np.testing.assert_allclose(st.per_party["emd"], [emd0, emd1])
    assert st.mean["emd"] == pytest.approx((emd0 + emd1) / 2)
    assert st.weighted_mean["emd"] == pytest.approx((3 * emd0 + 5 * emd1) / 8)


def test_iid_has_small_divergence_dirichlet_large():
    y = np.random.default_rng(0).integers(0, 10, 20000)
    iid = partition_stats(y, partition("iid", y, 10, 0).indices)
    skew = partition_stats(y, partition("label_dirichlet", y, 10, 0, beta=0.1).indices)
    for m in ("emd", "js", "hellinger"):
        assert iid.mean[m] < 0.1 < skew.mean[m]


def test_table_markdown_and_png(tmp_path):
    y = np.random.default_rng(1).integers(0, 4, 400)
    st = partition_stats(y, partition("label_quantity", y, 4, 0, k=2).indices,
                         label_names=["a", "b", "c", "d"], title="demo")
    buf = io.StringIO()
    print_stats(st, Console(file=buf, width=200))
    out = buf.getvalue()
    assert "EMD" in out and "Hellinger" in out and "size-weighted" in out and "0=a" in out
    md = stats_markdown(st)
    assert md.splitlines()[0].startswith("| party | rows | a | b | c | d | EMD")
    assert len(md.splitlines()) == 2 + 4 + 2
    png = plot_label_distribution(st, tmp_path / "x.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    with pytest.raises(ValueError, match="kind"):
        plot_label_distribution(st, tmp_path / "y.png", kind="pie")
