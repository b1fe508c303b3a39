"""Under every horizontal partition scheme: secagg == plain_quantised exactly, and both ≈ the plain
float sum of weighted shard statistics within the quantisation bound (n / scale per coordinate)."""
import numpy as np
import pytest

from secureflhv.data import Dataset, available_schemes, make_fcube, partition

from secagg_harness import config, run_round

RNG = np.random.default_rng(7)
N_ROWS, N_CLASSES, N_FEAT, P = 3000, 10, 6, 5
Y = RNG.integers(0, N_CLASSES, N_ROWS)
X = np.tanh(RNG.normal(size=(N_ROWS, N_FEAT)) + Y[:, None] / 5)
DS = Dataset(X, Y, [f"f{i}" for i in range(N_FEAT)], groups=RNG.integers(0, 60, N_ROWS),
             times=RNG.normal(size=N_ROWS))
FCUBE, _ = make_fcube(2000, 10, seed=3)
PARAMS = {"label_quantity": {"k": 2}, "label_dirichlet": {"beta": 0.3}, "quantity_dirichlet": {"beta": 0.5},
          "feature_noise": {"sigma": 0.5}, "label_noise": {"flip": 0.3},
          "label_dirichlet+quantity_dirichlet": {"beta": 0.5, "beta_quantity": 0.5},
          "label_dirichlet+feature_noise": {"beta": 0.5, "sigma": 0.3}}


def client_vectors(scheme):
    ds = FCUBE if scheme == "feature_synthetic" else DS
    part = partition(scheme, ds, P, seed=1, **PARAMS.get(scheme, {}))
    ids = [f"silo{i}" for i in range(P)]
    xs, ws = {}, {}
    n_classes = int(ds.y.max()) + 1
    for i, c in enumerate(ids):
        shard = part.party_data(ds, i)
        hist = np.bincount(shard.y.astype(int), minlength=n_classes) / max(len(shard.y), 1)
        means = shard.X.mean(axis=0) if len(shard.y) else np.zeros(ds.X.shape[1])
        xs[c] = np.concatenate([hist, means]).astype(np.float64)
        ws[c] = float(max(len(shard.y), 1))
    return ids, xs, ws


@pytest.mark.parametrize("scheme", available_schemes())
def test_secagg_equals_plain_quantised_under_partition(scheme):
    ids, xs, ws = client_vectors(scheme)
    cfg = config(clip=1.0, precision_bits=20, max_weight=float(N_ROWS))
    sec, errors, *_ = run_round(cfg, ids, xs, ws)
    assert not errors and not isinstance(sec, Exception), sec
    pq, errors, *_ = run_round(config(kind="plain_quantised", clip=1.0, precision_bits=20,
                                      max_weight=float(N_ROWS)), ids, xs, ws)
    assert not errors
    assert np.array_equal(sec.total, pq.total) and sec.weight == pq.weight and sec.n_clipped == pq.n_clipped
    plain = sum(ws[c] * np.clip(xs[c], -1, 1) for c in ids)
    assert np.max(np.abs(sec.total - plain)) <= P / cfg.scale
    assert sec.weight == pytest.approx(sum(ws.values()), abs=P / cfg.scale)
    # the weighted mean of label histograms is the global label distribution of the rows
    d = len(xs[ids[0]])
    n_classes = d - (FCUBE.X.shape[1] if scheme == "feature_synthetic" else N_FEAT)
    assert sec.mean[:n_classes].sum() == pytest.approx(1.0, abs=1e-4)
