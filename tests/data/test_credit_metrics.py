"""KS and lift/gain tables equal hand-computed deciles, and the exact KS equals sklearn's and scipy's."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ks_2samp
from sklearn.metrics import roc_curve

from secureflhv.data.credit_metrics import ks_table, ks_value, lift_gain_table, plot_ks, plot_lift_gain
from secureflhv.data.metrics import ks_statistic


def _data(n=1000, seed=0, decimals=None):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(np.int64)
    score = 1 / (1 + np.exp(-(rng.normal(size=n) + 1.2 * y - 1)))
    if decimals is not None:
        score = np.round(score, decimals)
    return y, score


def test_ks_value_equals_sklearn_and_scipy():
    for seed, decimals in [(0, None), (1, 2), (2, 1)]:  # continuous, then heavily tied scores
        y, s = _data(seed=seed, decimals=decimals)
        ks = ks_value(y, s)
        assert ks == pytest.approx(ks_statistic(y, s), abs=1e-12)
        assert ks == pytest.approx(ks_2samp(s[y == 1], s[y == 0]).statistic, abs=1e-12)
        assert ks_table(y, s).attrs["ks"] == ks
    y, s = _data(seed=3)
    assert ks_value(y.astype(float), s) == ks_value(y.astype(bool), s) == ks_value(y, s)
    # a score ranking events lower: KS is the absolute distance, ks_statistic's signed max misses it
    assert ks_value(y, -s) == pytest.approx(ks_2samp(s[y == 1], s[y == 0]).statistic, abs=1e-12)


def test_deciles_equal_hand_loop_without_ties():
    y, s = _data(n=1000, seed=4)
    assert len(np.unique(s)) == 1000
    tab, lg = ks_table(y, s), lift_gain_table(y, s)
    order = sorted(range(1000), key=lambda i: -s[i])
    E, N = y.sum(), 1000 - y.sum()
    ce = cn = 0
    for k in range(10):
        rows = order[100 * k:100 * (k + 1)]
        ev = int(sum(y[i] for i in rows))
        ce, cn = ce + ev, cn + 100 - ev
        r = tab.iloc[k]
        assert (r["group"], r["n"], r["events"], r["non_events"]) == (k + 1, 100, ev, 100 - ev)
        assert r["min_score"] == min(s[i] for i in rows) and r["max_score"] == max(s[i] for i in rows)
        assert r["event_rate"] == pytest.approx(ev / 100, abs=1e-15)
        assert r["cum_event_share"] == pytest.approx(ce / E, abs=1e-15)
        assert r["cum_nonevent_share"] == pytest.approx(cn / N, abs=1e-15)
        assert r["ks"] == pytest.approx(abs(ce / E - cn / N), abs=1e-15)
        g = lg.iloc[k]
        assert g["lift"] == pytest.approx((ev / 100) / (E / 1000), rel=1e-12)
        assert g["cum_lift"] == pytest.approx((ce / (100 * (k + 1))) / (E / 1000), rel=1e-12)
        assert g["gain"] == pytest.approx(ce / E, abs=1e-15)
        assert g["cum_row_share"] == pytest.approx((k + 1) / 10, abs=1e-15)
    assert tab.attrs["ks_table_max"] == tab["ks"].max() <= tab.attrs["ks"] + 1e-15


def _cuts_moved_past_ties(s_desc, G):
    """Independent twin of the tie rule: nominal cuts ceil(k n / G), each moved to the end of the run of
    equal scores it falls in; duplicate cuts collapse (empty groups dropped)."""
    n = len(s_desc)
    cuts = []
    for k in range(1, G):
        c = -(-k * n // G)
        while 0 < c < n and s_desc[c - 1] == s_desc[c]:
            c += 1
        if 0 < c < n and c not in cuts:
            cuts.append(c)
    return [0, *cuts, n]


@pytest.mark.parametrize("decimals,G", [(1, 10), (2, 10), (1, 7), (2, 33)])
def test_ties_stay_in_one_group(decimals, G):
    y, s = _data(n=997, seed=5, decimals=decimals)
    tab = ks_table(y, s, G)
    order = np.argsort(-s, kind="stable")
    sd, yd = s[order], y[order]
    edges = _cuts_moved_past_ties(list(sd), G)
    assert len(tab) == len(edges) - 1 <= G
    for k, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        assert tab["n"].iloc[k] == b - a and tab["events"].iloc[k] == yd[a:b].sum()
    # no score value spans two groups: each group's min is above the next group's max
    assert np.all(tab["min_score"].to_numpy()[:-1] > tab["max_score"].to_numpy()[1:])
    assert tab["n"].sum() == len(y) and tab["events"].sum() == y.sum()
    assert tab["cum_event_share"].iloc[-1] == 1 and tab["cum_nonevent_share"].iloc[-1] == 1


def test_gain_equals_roc_tpr_at_group_edges_and_fine_table_reaches_ks():
    y, s = _data(n=800, seed=6, decimals=2)
    lg = lift_gain_table(y, s, 10)
    fpr, tpr, thr = roc_curve(y, s)
    for _, r in lg.iterrows():  # TPR at threshold t = share of events with score >= t
        i = int(np.flatnonzero(thr == r["min_score"])[0])
        assert r["gain"] == pytest.approx(tpr[i], abs=1e-15)
    assert lg["cum_lift"].iloc[-1] == pytest.approx(1.0) and lg["gain"].iloc[-1] == pytest.approx(1.0)
    assert np.average(lg["lift"], weights=lg["n"]) == pytest.approx(1.0, abs=1e-12)
    fine = ks_table(y, s, len(y))  # one group per distinct score: the table max is the exact KS
    assert len(fine) == len(np.unique(s))
    assert fine.attrs["ks_table_max"] == pytest.approx(ks_statistic(y, s), abs=1e-12)


def test_errors():
    y, s = _data(n=50, seed=7)
    with pytest.raises(ValueError, match="length"):
        ks_table(y[:-1], s)
    with pytest.raises(ValueError, match="binary"):
        ks_table(np.where(y == 1, 2, 0), s)
    bad = s.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        lift_gain_table(y, bad)
    for g in (1, 51, 2.5):
        with pytest.raises(ValueError, match="n_groups"):
            ks_table(y, s, g)
    with pytest.raises(ValueError, match="single class"):
        ks_value(np.zeros(50, int), s)
    assert len(ks_table(y, s, 50)) == 50 and len(ks_table(y, s, 2)) == 2  # the bounds are allowed


def test_plots_write_pngs(tmp_path):
    import matplotlib.image

    y, s = _data(n=300, seed=8)
    p1 = plot_ks(y, s, tmp_path / "a" / "ks.png", title="KS test")
    p2 = plot_lift_gain(y, s, tmp_path / "lift.png", n_groups=5)
    for p in (p1, p2):
        assert p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        h, w, _ = matplotlib.image.imread(p).shape
        assert h > 100 and w > 100
