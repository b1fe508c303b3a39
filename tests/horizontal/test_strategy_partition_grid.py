"""The complete grid: every horizontal strategy (the FedAvg family, contribution normalisation, IFCA,
FedPer) × every horizontal partition of secureflhv.data (NIID-Bench's settings: #C=1/2/3, Dir(0.5) and
Dir(0.1), ...) through secure aggregation gives bit for bit the model of plaintext aggregation of the
same quantised updates (``plain_quantised``, same seed). Tiny MLP, one round, in-process transport.
And the simple CNN trains (one local step on tiny images: loss falls, weights change and stay finite)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fl_harness import run_fl  # noqa: E402

from secureflhv.data import available_schemes, make_fcube, partition  # noqa: E402
from secureflhv.horizontal.models import ModelSpec, build_model, get_flat  # noqa: E402
from secureflhv.horizontal.strategies import LocalTrainConfig, batch_rng, local_sgd  # noqa: E402

N_PARTIES = 4
SPEC = ModelSpec(name="mlp", n_features=3, n_classes=4, hidden=(8,))
LOCAL = LocalTrainConfig(epochs=1, batch_size=32, lr=0.1, momentum=0.5)
PARTITIONS = [  # (scheme, params): every scheme, NIID-Bench's label settings each
    ("iid", {}),
    ("label_quantity", {"k": 1}), ("label_quantity", {"k": 2}), ("label_quantity", {"k": 3}),
    ("label_dirichlet", {"beta": 0.5}), ("label_dirichlet", {"beta": 0.1}),
    ("quantity_dirichlet", {"beta": 1.0}),
    ("feature_noise", {"sigma": 0.2}),
    ("feature_synthetic", {}),
    ("feature_natural", {}),
    ("label_noise", {"flip": 0.3}),
    ("temporal", {}),
    ("label_dirichlet+quantity_dirichlet", {"beta": 0.5, "beta_quantity": 1.0}),
    ("label_dirichlet+feature_noise", {"beta": 0.5, "sigma": 0.2}),
]
STRATEGIES = [  # (id, strategy name, run_fl keyword arguments)
    ("fedavg", "fedavg", {}),
    ("fedprox", "fedprox", {}),
    ("scaffold", "scaffold", {}),
    ("fednova", "fednova", {}),
    ("fedavg+contribution", "fedavg", {"fl_kw": {"contribution_temperature": 0.5}}),
    ("ifca", "ifca", {"strategy_kw": {"clusters": 2}}),
    ("fedper", "fedper", {}),
]
_SHARDS: dict = {}


def shards(scheme: str, params: dict):
    """FCUBE points (3 features, in the cube) with 4 classes by quadrant, natural groups and times; split."""
    key = (scheme, tuple(sorted(params.items())))
    if key not in _SHARDS:
        train, _ = make_fcube(seed=1)
        rng = np.random.default_rng(2)
        ds = train.subset(np.sort(rng.choice(len(train), 480, replace=False)))
        ds.y = (2 * (ds.X[:, 0] > 0) + (ds.X[:, 1] > 0)).astype(np.int64)
        ds.groups = rng.integers(0, 12, len(ds))
        ds.times = rng.permutation(len(ds)).astype(float)
        part = partition(scheme, ds, N_PARTIES, seed=3, **params)
        out = []
        for i in range(N_PARTIES):
            sd = part.party_data(ds, i)
            out.append((sd.X.astype(np.float32), sd.y.astype(np.int64)))
        assert all(len(y) > 0 for _, y in out)
        _SHARDS[key] = out
    return _SHARDS[key]


def test_every_scheme_is_in_the_grid():
    assert {s for s, _ in PARTITIONS} == set(available_schemes())


@pytest.mark.parametrize("scheme, params", PARTITIONS,
                         ids=[f"{s}-{'-'.join(f'{k}{v}' for k, v in p.items())}".rstrip("-") for s, p in PARTITIONS])
@pytest.mark.parametrize("label, strategy, kw", STRATEGIES, ids=[s[0] for s in STRATEGIES])
def test_secagg_equals_plaintext_aggregation_of_the_same_quantised_updates(label, strategy, kw, scheme, params):
    data = shards(scheme, params)
    runs = {}
    for kind in ("secagg", "plain_quantised"):
        server, clients, errors = run_fl(data, None, SPEC, strategy, kind, rounds=1, seed=7, local=LOCAL, **kw)
        assert not errors, errors
        runs[kind] = (server, clients)
    (sec, sec_clients), (pq, pq_clients) = runs["secagg"], runs["plain_quantised"]
    assert sec.history[0].survivors == [f"c{i}" for i in range(N_PARTIES)]
    assert np.array_equal(sec.global_vec, pq.global_vec)
    assert np.all(np.isfinite(sec.global_vec)) and not np.array_equal(sec.global_vec, sec.initial[0])
    assert all(r["k_bits"] > 0 for r in sec.history[0].aggregation.values())
    if strategy == "ifca":
        assert all(np.array_equal(a, b) for a, b in zip(sec.strategy.clusters, pq.strategy.clusters))
    if strategy == "fedper":
        assert all(np.array_equal(a.strategy.head, b.strategy.head) for a, b in zip(sec_clients, pq_clients))
    if "fl_kw" in kw:
        assert sec.history[0].contribution["status"] == "ok"
        assert [c.contrib.factor for c in sec_clients] == [c.contrib.factor for c in pq_clients]


def test_the_cnn_trains_one_step_on_tiny_images():
    spec = ModelSpec(name="cnn", n_features=16 * 16, n_classes=3)  # the smallest images two 5×5 convs allow
    model = build_model(spec, seed=0)
    rng = np.random.default_rng(0)
    X = rng.normal(0, 1, (24, 256)).astype(np.float32)
    y = rng.integers(0, 3, 24)
    before_w = get_flat(model)

    def loss():
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(model(torch.from_numpy(X)), torch.from_numpy(y)))

    before = loss()
    steps, _ = local_sgd(model, X, y, LocalTrainConfig(epochs=1, batch_size=24, lr=0.05, weight_decay=0.0),
                         batch_rng(0, 1, "c0"))
    after_w = get_flat(model)
    assert steps == 1
    assert np.all(np.isfinite(after_w)) and not np.array_equal(after_w, before_w)
    assert loss() < before


def test_the_cnn_trains_through_secure_aggregation():
    spec = ModelSpec(name="cnn", n_features=16 * 16, n_classes=3)
    rng = np.random.default_rng(1)
    data = [(rng.normal(0, 1, (16, 256)).astype(np.float32), rng.integers(0, 3, 16)) for _ in range(2)]
    runs = {}
    for kind in ("secagg", "plain_quantised"):
        server, _, errors = run_fl(data, None, spec, "fedavg", kind, rounds=1, seed=3,
                                   local=LocalTrainConfig(epochs=1, batch_size=16, lr=0.05))
        assert not errors, errors
        runs[kind] = server
    sec = runs["secagg"]
    assert np.array_equal(sec.global_vec, runs["plain_quantised"].global_vec)
    assert np.all(np.isfinite(sec.global_vec)) and not np.array_equal(sec.global_vec, sec.initial[0])
