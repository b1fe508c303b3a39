"""Scorecard points from a scikit-learn LR on WOE columns add up to the model's scaled logit, per party too."""
from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from secureflhv.data.scorecard_points import points_table, score_from_logit, score_rows, scorecard_points, scaling

PDO, BASE, ODDS = 20.0, 600.0, 50.0
FACTOR = PDO / math.log(2)
OFFSET = BASE - FACTOR * math.log(ODDS)


@pytest.fixture(scope="module")
def model():
    """4 binned features (bins drawn with different risk), WOE computed here, LR fitted on the WOE columns."""
    rng = np.random.default_rng(11)
    n = 3000
    n_bins = {"a": 4, "b": 3, "c": 5, "d": 2}
    bins = {f: rng.integers(0, k, n).astype(np.int64) for f, k in n_bins.items()}
    eff = {f: rng.normal(0, 0.8, k) for f, k in n_bins.items()}
    logit = -1.0 + sum(eff[f][bins[f]] for f in n_bins)
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    E, N = y.sum(), n - y.sum()
    woe = {}
    for f, k in n_bins.items():
        ev = np.array([y[bins[f] == b].sum() for b in range(k)])
        ne = np.array([(bins[f] == b).sum() for b in range(k)]) - ev
        woe[f] = np.log((ev / E) / (ne / N))  # events = y=1: higher WOE = riskier bin
    X = np.column_stack([woe[f][bins[f]] for f in n_bins])
    lr = LogisticRegression(C=1e6, max_iter=1000).fit(X, y)
    weights = dict(zip(n_bins, lr.coef_[0].tolist()))
    return dict(bins=bins, woe=woe, weights=weights, b0=float(lr.intercept_[0]), lr=lr, X=X, y=y)


def _score(m, features, intercept, **kw):
    w = {f: m["weights"][f] for f in features}
    base, pts = scorecard_points(w, intercept, {f: m["woe"][f] for f in features}, pdo=PDO, base_score=BASE,
                                 base_odds=ODDS, **kw)
    return base, pts, score_rows({f: m["bins"][f] for f in features}, pts)


def test_total_equals_scaled_decision_function(model):
    base, pts, partial = _score(model, list(model["weights"]), model["b0"])
    expected = OFFSET - FACTOR * model["lr"].decision_function(model["X"])
    assert base == pytest.approx(OFFSET - FACTOR * model["b0"], abs=1e-12)
    assert np.max(np.abs(base + partial - expected)) < 1e-9
    assert np.allclose(score_from_logit(model["lr"].decision_function(model["X"])), expected, atol=1e-9)
    assert scaling(PDO, BASE, ODDS) == pytest.approx((FACTOR, OFFSET), abs=1e-12)
    # WOE sign convention: weights come out positive, so the riskiest bin of each feature gets the fewest points
    for f, w in model["weights"].items():
        assert w > 0 and np.argmax(model["woe"][f]) == np.argmin(pts[f])


def test_pdo_doubles_odds(model):
    base, _, partial = _score(model, list(model["weights"]), model["b0"])
    s = base + partial
    p = model["lr"].predict_proba(model["X"])[:, 1]
    good_bad = (1 - p) / p
    # score = base_score + PDO * log2(good:bad / base_odds): +PDO points doubles good:bad, halves bad:good
    assert np.max(np.abs(s - (BASE + PDO * np.log2(good_bad / ODDS)))) < 1e-6
    i, j = int(np.argmax(s)), int(np.argmin(s))
    assert (p[j] / (1 - p[j])) / (p[i] / (1 - p[i])) == pytest.approx(2 ** ((s[i] - s[j]) / PDO), rel=1e-9)


def test_host_subset_gives_its_share_and_guest_adds_base(model):
    guest, host = ["a", "b"], ["c", "d"]
    g_base, _, g_part = _score(model, guest, model["b0"])
    h_base, h_pts, h_part = _score(model, host, None)
    assert h_base == 0.0
    X, w = model["X"], model["weights"]
    host_logit = X[:, 2] * w["c"] + X[:, 3] * w["d"]
    assert np.max(np.abs(h_part - (-FACTOR * host_logit))) < 1e-9
    expected = OFFSET - FACTOR * model["lr"].decision_function(X)
    assert np.max(np.abs(g_base + g_part + h_part - expected)) < 1e-9
    # distributing: no base points, each party adds offset / n_total per feature, the guest also -factor*b0
    gd_base, gd_pts, gd_part = _score(model, guest, model["b0"], distribute_intercept=True, n_features_total=4)
    hd_base, hd_pts, hd_part = _score(model, host, None, distribute_intercept=True, n_features_total=4)
    assert gd_base == hd_base == 0.0
    assert np.allclose(hd_pts["c"] - h_pts["c"], OFFSET / 4, atol=1e-12)
    assert np.max(np.abs(hd_part - (h_part + 2 * OFFSET / 4))) < 1e-9
    assert np.max(np.abs(gd_part + hd_part - expected)) < 1e-9


def test_rounding_stays_within_half_a_point_per_feature(model):
    feats = list(model["weights"])
    base, pts, part = _score(model, feats, model["b0"], round_points=True)
    exact = OFFSET - FACTOR * model["lr"].decision_function(model["X"])
    assert float(base).is_integer() and all(np.all(p == np.round(p)) for p in pts.values())
    err = np.abs(base + part - exact)
    assert err.max() <= 0.5 * (len(feats) + 1) + 1e-9 and err.max() > 1e-6  # rounding changed something


def test_points_table(model):
    base, pts, _ = _score(model, list(model["weights"]), model["b0"])
    tab = points_table(model["weights"], model["woe"], pts, bin_labels={"d": ["low", "high"]}, base_points=base)
    assert len(tab) == 1 + sum(len(v) for v in model["woe"].values())
    assert tab.iloc[0]["feature"] == "(base)" and tab.iloc[0]["points"] == base
    d = tab[tab["feature"] == "d"]
    assert d["bin_label"].tolist() == ["low", "high"] and np.allclose(d["points"], pts["d"])
    assert np.allclose(d["points"], -FACTOR * d["weight"] * d["woe"], atol=1e-12)


def test_errors(model):
    w, woe = {"a": 0.5}, {"a": np.array([0.1, -0.2])}
    for kw in ({"pdo": 0.0}, {"pdo": -5.0}, {"base_odds": 0.0}, {"base_odds": -1.0}):
        with pytest.raises(ValueError, match="pdo|base_odds"):
            scorecard_points(w, 0.0, woe, **kw)
    with pytest.raises(ValueError, match="no WOE"):
        scorecard_points({"a": 0.5, "b": 1.0}, 0.0, woe)
    with pytest.raises(ValueError, match="no weight"):
        scorecard_points(w, 0.0, {**woe, "z": np.zeros(2)})
    with pytest.raises(ValueError, match="non-finite"):
        scorecard_points(w, 0.0, {"a": np.array([0.1, np.inf])})
    with pytest.raises(ValueError, match="n_features_total"):
        scorecard_points(w, 0.0, woe, distribute_intercept=True)
    _, pts = scorecard_points(w, 0.0, woe)
    with pytest.raises(ValueError, match="outside"):
        score_rows({"a": np.array([0, 2])}, pts)
    with pytest.raises(ValueError, match="outside"):
        score_rows({"a": np.array([-1, 0])}, pts)
    with pytest.raises(ValueError, match="integer"):
        score_rows({"a": np.array([0.0, 1.0])}, pts)
    with pytest.raises(ValueError, match="no points"):
        score_rows({"a": np.array([0, 1]), "b": np.array([0, 0])}, pts)
    assert score_rows({"a": np.array([1, 0, 1])}, pts) == pytest.approx(pts["a"][[1, 0, 1]])
