"""The complete grid: every horizontal strategy (the FedAvg family, contribution normalisation, IFCA,
FedPer; MultiConfederated learning, decentralised, at the end) × every horizontal partition of secureflhv.data (NIID-Bench's settings: #C=1/2/3, Dir(0.5) and
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
import mc_harness  # noqa: E402
from fl_harness import run_fl  # noqa: E402

from secureflhv.data import available_schemes, make_fcube, partition  # noqa: E402
from secureflhv.horizontal.models import ModelSpec, build_model, get_flat  # noqa: E402
from secureflhv.horizontal.mc_peer import TAG_UPDATE  # noqa: E402
from secureflhv.horizontal.strategies import LocalTrainConfig, batch_rng, local_sgd  # noqa: E402
from secureflhv.proto import messages_pb2  # noqa: E402
from secureflhv.transport.inprocess import InProcessTransport  # noqa: E402

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
    data = [(rng.normal(0, 1, (16, 256)).astype(np.float32), rng.integers(0, 3, 16)) for _ in range(3)]
    runs = {}
    for kind in ("secagg", "plain_quantised"):
        server, _, errors = run_fl(data, None, spec, "fedavg", kind, rounds=1, seed=3,
                                   local=LocalTrainConfig(epochs=1, batch_size=16, lr=0.05))
        assert not errors, errors
        runs[kind] = server
    sec = runs["secagg"]
    assert np.array_equal(sec.global_vec, runs["plain_quantised"].global_vec)
    assert np.all(np.isfinite(sec.global_vec)) and not np.array_equal(sec.global_vec, sec.initial[0])


# MultiConfederated learning has no server and no secure aggregation (peers see each other's models), so
# the secagg-equals-plaintext property above does not apply to it. Its place in the grid: under every
# partition, each peer's models after a round are exactly the divergence-filtered, sample-weighted mean of
# its own and the accepted peers' models as they went over the wire.
class _Recording(InProcessTransport):
    sent: dict = {}

    def send(self, receiver, tag, payload, round=0, timeout=None):
        if tag == TAG_UPDATE:
            type(self).sent[self.party_id] = messages_pb2.Bundle.FromString(payload.SerializeToString())
        super().send(receiver, tag, payload, round, timeout)


@pytest.mark.parametrize("scheme, params", PARTITIONS,
                         ids=[f"{s}-{'-'.join(f'{k}{v}' for k, v in p.items())}".rstrip("-") for s, p in PARTITIONS])
def test_multiconfederated_aggregates_the_filtered_weighted_mean(scheme, params):
    data = shards(scheme, params)
    test_rows = 1
    _Recording.sent = {}
    cfg = mc_harness.config(rounds=1, local=LOCAL, fork_margin=1.0, merge_tolerance=0.0)
    peers, errors, _ = mc_harness.run_peers([(X, y) for X, y in data], cfg, test_rows=test_rows, spec=SPEC,
                                            transport_of=lambda net, pid: _Recording(net, pid))
    assert not errors, errors
    sent = {pid: ({k[len("model/"):]: np.frombuffer(t.data, "<f4") for k, t in b.tensors.items()}, b.scalars["n"])
            for pid, b in _Recording.sent.items()}
    assert {pid: n for pid, (_, n) in sent.items()} == {p.party_id: len(y) - test_rows
                                                      for p, (_, y) in zip(peers, data)}
    for p in peers:
        rec = p.history[0]
        own, n_own = sent[p.party_id]
        for m in rec.trained:
            others = [q for q in sorted(sent) if q != p.party_id and m in sent[q][0]]
            d = np.array([np.linalg.norm(sent[q][0][m].astype(np.float64) - own[m]) / np.linalg.norm(own[m].astype(
                np.float64)) for q in others])
            accepted = [q for q, k in zip(others, d <= np.median(d) + cfg.tolerance * np.std(d)) if k]
            assert rec.accepted[m] == accepted
            w = np.array([n_own] + [sent[q][1] for q in accepted])
            stack = np.stack([own[m]] + [sent[q][0][m] for q in accepted]).astype(np.float64)
            np.testing.assert_allclose(p.pool[m], (w[:, None] * stack).sum(0) / w.sum(), rtol=0, atol=1e-7)
        assert np.all(np.isfinite(np.concatenate(list(p.pool.values()))))
