"""Under every horizontal partition scheme of secureflhv.data, FL through secure aggregation gives
bit-for-bit the model of FL through plain_quantised aggregation (same seed), and stays within
quantisation error of plain float aggregation."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fl_harness import run_fl  # noqa: E402

from secureflhv.data import Dataset, available_schemes, make_fcube, partition  # noqa: E402
from secureflhv.horizontal.models import ModelSpec  # noqa: E402
from secureflhv.horizontal.strategies import STRATEGIES, LocalTrainConfig  # noqa: E402

PARAMS = {"label_quantity": {"k": 1}, "label_dirichlet": {"beta": 0.5}, "quantity_dirichlet": {"beta": 1.0},
          "feature_noise": {"sigma": 0.2}, "label_noise": {"flip": 0.3},
          "label_dirichlet+quantity_dirichlet": {"beta": 0.5, "beta_quantity": 1.0},
          "label_dirichlet+feature_noise": {"beta": 0.5, "sigma": 0.2}}
N_PARTIES = 4
LOCAL = LocalTrainConfig(epochs=1, batch_size=32, lr=0.1, momentum=0.5)


def dataset() -> Dataset:
    train, _ = make_fcube(seed=1)
    rng = np.random.default_rng(2)
    ds = train.subset(np.sort(rng.choice(len(train), 800, replace=False)))
    ds.groups = rng.integers(0, 20, len(ds))
    ds.times = rng.permutation(len(ds)).astype(float)
    return ds


def test_every_scheme_is_covered():
    assert set(available_schemes()) - set(PARAMS) - {"iid", "feature_synthetic", "feature_natural", "temporal"} == set()


@pytest.mark.parametrize("scheme", available_schemes())
def test_secagg_equals_plain_quantised_exactly(scheme):
    ds = dataset()
    part = partition(scheme, ds, N_PARTIES, seed=3, **PARAMS.get(scheme, {}))
    shards = []
    for i in range(N_PARTIES):
        sd = part.party_data(ds, i)
        shards.append((sd.X.astype(np.float32), sd.y.astype(np.int64)))
    assert all(len(y) > 0 for _, y in shards)
    spec = ModelSpec(name="mlp", n_features=3, n_classes=2)
    strategy = STRATEGIES[available_schemes().index(scheme) % len(STRATEGIES)]
    runs = {}
    for kind in ("secagg", "plain_quantised", "plain"):
        server, _, errors = run_fl(shards, shards[0], spec, strategy, kind, rounds=2, seed=9, local=LOCAL)
        assert not errors, errors
        runs[kind] = server
    sec, pq, plain = runs["secagg"], runs["plain_quantised"], runs["plain"]
    assert np.array_equal(sec.global_vec, pq.global_vec)
    for r_sec, r_pq in zip(sec.history, pq.history):
        assert r_sec.survivors == r_pq.survivors == [f"c{i}" for i in range(N_PARTIES)]
        assert r_sec.test_accuracy == r_pq.test_accuracy
        assert r_sec.aggregation["model"]["n_clipped"] == 0
        assert r_sec.aggregation["model"]["k_bits"] > 0
    assert not np.array_equal(sec.global_vec, plain.global_vec)  # quantisation did happen ...
    np.testing.assert_allclose(sec.global_vec, plain.global_vec, atol=2e-3)  # ... and is small
