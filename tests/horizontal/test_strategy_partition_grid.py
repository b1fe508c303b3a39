"""The complete grid: every horizontal strategy (the FedAvg family, contribution normalisation on each of
FedAvg, FedProx, SCAFFOLD and FedNova, IFCA, FedPer; MultiConfederated learning, decentralised, at the end) ×
every horizontal partition of secureflhv.data (NIID-Bench's settings: #C=1/2/3, Dir(0.5) and Dir(0.1), ...)
through secure aggregation gives bit for bit the model of plaintext aggregation of the same quantised updates
(``plain_quantised``, same seed), round after round over two rounds, with SCAFFOLD's control variates (the
server's c and every client's c_i), IFCA's cluster models, FedPer's heads and the contribution factors equal
too. Tiny MLP, in-process transport.

Data: FCUBE points (4 classes by quadrant) for the schemes that split by label, size or features; Palmer
Penguins for the two that need a real column: ``feature_natural`` by island (its natural id: one island per
party, and Torgersen has only Adelie penguins, Biscoe Adelie and Gentoo, Dream Adelie and Chinstrap) and
``temporal`` by study year (one year per party).
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

from secureflhv.data import available_schemes, load_penguins, make_fcube, partition  # noqa: E402
from secureflhv.horizontal.models import ModelSpec, build_model, get_flat  # noqa: E402
from secureflhv.horizontal.mc_peer import TAG_UPDATE  # noqa: E402
from secureflhv.horizontal.strategies import LocalTrainConfig, batch_rng, local_sgd  # noqa: E402
from secureflhv.proto import messages_pb2  # noqa: E402
from secureflhv.transport.inprocess import InProcessTransport  # noqa: E402

N_PARTIES = 4
ROUNDS = 2
SPEC = ModelSpec(name="mlp", n_features=3, n_classes=4, hidden=(8,))
PENGUIN_SPEC = ModelSpec(name="mlp", n_features=6, n_classes=3, hidden=(8,))
PENGUIN_SCHEMES = {"feature_natural": 3, "temporal": 3}  # scheme -> parties: 3 islands, 3 years
LOCAL = LocalTrainConfig(epochs=1, batch_size=32, lr=0.1, momentum=0.5)
T = 0.5  # contribution normalisation's temperature
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
PARTITION_IDS = [f"{s}-{'-'.join(f'{k}{v}' for k, v in p.items())}".rstrip("-") for s, p in PARTITIONS]
CCN = {"fl_kw": {"contribution_temperature": T}}
STRATEGIES = [  # (id, strategy name, run_fl keyword arguments)
    ("fedavg", "fedavg", {}),
    ("fedprox", "fedprox", {}),
    ("scaffold", "scaffold", {}),
    ("fednova", "fednova", {}),
    # contribution normalisation (Kundalwal et al. 2024) on every base strategy of the FedAvg family
    ("fedavg+contribution", "fedavg", CCN),
    ("fedprox+contribution", "fedprox", CCN),
    ("scaffold+contribution", "scaffold", CCN),
    ("fednova+contribution", "fednova", CCN),
    ("ifca", "ifca", {"strategy_kw": {"clusters": 2}}),
    ("fedper", "fedper", {}),
]
_SHARDS: dict = {}
_RUNS: dict = {}


def penguin_rows():
    """Palmer Penguins with its real natural id (island) and time (year), as the grid uses it: the 333
    complete rows (the MLP takes no NaN; the 11 rows missing a measurement or the sex are dropped), 100
    random rows of each year (so that ``temporal``'s equal-size cuts fall on the year boundaries: one year
    per party), features standardised."""
    ds = load_penguins()
    ds = ds.subset(np.flatnonzero(~np.isnan(ds.X).any(axis=1)))
    rng = np.random.default_rng(2)
    ds = ds.subset(np.sort(np.concatenate([rng.choice(np.flatnonzero(ds.times == year), 100, replace=False)
                                           for year in (2007, 2008, 2009)])))
    ds.X = (ds.X - ds.X.mean(0)) / ds.X.std(0)
    return ds


def fcube_rows():
    """480 FCUBE points (3 features, in the cube) with 4 classes by quadrant."""
    train, _ = make_fcube(seed=1)
    rng = np.random.default_rng(2)
    ds = train.subset(np.sort(rng.choice(len(train), 480, replace=False)))
    ds.y = (2 * (ds.X[:, 0] > 0) + (ds.X[:, 1] > 0)).astype(np.int64)
    return ds


def split(scheme: str, params: dict):
    """The rows of ``scheme`` and its partition (penguins for the natural id and time, else FCUBE)."""
    ds = penguin_rows() if scheme in PENGUIN_SCHEMES else fcube_rows()
    return ds, partition(scheme, ds, PENGUIN_SCHEMES.get(scheme, N_PARTIES), seed=3, **params)


def shards(scheme: str, params: dict):
    """([(X float32, y int64)] per party, model spec) of ``scheme``."""
    key = (scheme, tuple(sorted(params.items())))
    if key not in _SHARDS:
        ds, part = split(scheme, params)
        out = []
        for i in range(part.n_parties):
            sd = part.party_data(ds, i)
            out.append((sd.X.astype(np.float32), sd.y.astype(np.int64)))
        assert all(len(y) > 0 for _, y in out)
        _SHARDS[key] = (out, PENGUIN_SPEC if scheme in PENGUIN_SCHEMES else SPEC)
    return _SHARDS[key]


def run(label: str, scheme: str, params: dict, kind: str):
    """One run of a grid row (cached): (server, clients, [(global model, server's SCAFFOLD c or None)] per round)."""
    key = (label, scheme, tuple(sorted(params.items())), kind)
    if key not in _RUNS:
        (strategy, kw), = [(s, k) for lab, s, k in STRATEGIES if lab == label]
        data, spec = shards(scheme, params)
        holder, trace = {}, []

        def on_round(_record, vec):
            c = getattr(holder["server"].strategy, "c_global", None)
            trace.append((vec.copy(), None if c is None else c.copy()))

        server, clients, errors = run_fl(data, None, spec, strategy, kind, rounds=ROUNDS, seed=7, local=LOCAL,
                                         on_round=on_round, prepare=lambda s, _c: holder.update(server=s), **kw)
        assert not errors, errors
        _RUNS[key] = (server, clients, trace)
    return _RUNS[key]


def paper_factors(Z: np.ndarray, temperature: float) -> np.ndarray:
    """Contribution normalisation's Λ in the clear (Kundalwal et al. 2024, eqs. 3–8): softmax over the
    clients of (Σ_p cos(z_q, z_p)) / T, from every client's mean latent z."""
    U = Z / np.linalg.norm(Z, axis=1, keepdims=True)
    s = (U @ U.T).sum(axis=1)
    return np.exp(s / temperature) / np.exp(s / temperature).sum()


def test_every_scheme_is_in_the_grid():
    assert {s for s, _ in PARTITIONS} == set(available_schemes())


def test_the_natural_id_and_time_cells_are_really_non_iid():
    """The penguin cells are what their names say: feature_natural gives each party one island, and the
    parties' species mixes differ (Torgersen: Adelie only); temporal gives each party one year."""
    ds, part = split("feature_natural", {})
    mixes = {}
    for i in range(part.n_parties):
        sd = part.party_data(ds, i)
        (island,) = set(sd.groups)
        mixes[island] = np.bincount(sd.y, minlength=3) / len(sd.y)
    assert set(mixes) == {"Biscoe", "Dream", "Torgersen"}
    assert {k: tuple(np.flatnonzero(v)) for k, v in mixes.items()} == {"Torgersen": (0,), "Biscoe": (0, 2),
                                                                        "Dream": (0, 1)}
    tv = [0.5 * np.abs(mixes[a] - mixes[b]).sum() for a, b in (("Biscoe", "Dream"), ("Biscoe", "Torgersen"),
                                                                 ("Dream", "Torgersen"))]
    assert min(tv) > 0.4  # total variation between any two parties' label mixes (an IID split: < 0.2)
    iid = partition("iid", ds, 3, seed=3)
    assert max(0.5 * np.abs(np.bincount(iid.party_data(ds, i).y, minlength=3) / iid.sizes[i] -
                            np.bincount(ds.y, minlength=3) / len(ds)).sum() for i in range(3)) < 0.2
    ds, part = split("temporal", {})
    assert [set(part.party_data(ds, i).times) for i in range(3)] == [{2007}, {2008}, {2009}]


@pytest.mark.parametrize("scheme, params", PARTITIONS, ids=PARTITION_IDS)
@pytest.mark.parametrize("label, strategy, kw", STRATEGIES, ids=[s[0] for s in STRATEGIES])
def test_secagg_equals_plaintext_aggregation_of_the_same_quantised_updates(label, strategy, kw, scheme, params):
    (sec, sec_clients, sec_trace), (pq, pq_clients, pq_trace) = (run(label, scheme, params, kind)
                                                                for kind in ("secagg", "plain_quantised"))
    ids = [c.party_id for c in sec_clients]
    assert len(sec.history) == len(pq.history) == ROUNDS
    assert all(h.survivors == ids for h in sec.history)
    for (v_sec, c_sec), (v_pq, c_pq) in zip(sec_trace, pq_trace):  # round by round
        assert np.array_equal(v_sec, v_pq)
        assert (c_sec is None and c_pq is None) or np.array_equal(c_sec, c_pq)
    assert np.array_equal(sec.global_vec, pq.global_vec)
    assert np.all(np.isfinite(sec.global_vec))
    assert not np.array_equal(sec_trace[0][0], sec.initial[0]) and not np.array_equal(sec_trace[1][0], sec_trace[0][0])
    assert all(r["k_bits"] > 0 for h in sec.history for r in h.aggregation.values())
    if strategy == "scaffold":
        check_control_variates(sec, sec_clients, pq, pq_clients, sec_trace)
    if strategy == "ifca":
        assert all(np.array_equal(a, b) for a, b in zip(sec.strategy.clusters, pq.strategy.clusters))
    if strategy == "fedper":
        assert all(np.array_equal(a.strategy.head, b.strategy.head) for a, b in zip(sec_clients, pq_clients))
    if "fl_kw" in kw:
        check_contribution(label, strategy, scheme, params, sec, sec_clients, pq_clients)


def check_control_variates(sec, sec_clients, pq, pq_clients, sec_trace):
    """SCAFFOLD: the server's c (every round, above, and at the end) and every client's c_i are equal bit
    for bit; they moved (c changes from round to round, the c_i differ); and with every client in every
    round and control weight 1, c is the clients' mean c_i up to the quantisation of the control deltas."""
    assert np.array_equal(sec.strategy.c_global, pq.strategy.c_global)
    for a, b in zip(sec_clients, pq_clients):
        assert a.strategy.c_local is not None and np.array_equal(a.strategy.c_local, b.strategy.c_local)
    c1, c2 = sec_trace[0][1], sec_trace[1][1]
    assert np.any(c1 != 0) and not np.array_equal(c1, c2) and np.array_equal(c2, sec.strategy.c_global)
    locals_ = np.stack([c.strategy.c_local.astype(np.float64) for c in sec_clients])
    assert not np.array_equal(locals_[0], locals_[1])
    agg = sec.history[-1].aggregation["control"]
    assert all(h.aggregation["control"]["n_clipped"] == 0 for h in sec.history)
    # each round's mean of the rounded deltas is off by less than one rounding unit 1/scale (+ float32 storage)
    np.testing.assert_allclose(sec.strategy.c_global, locals_.mean(0), rtol=0, atol=ROUNDS / agg["scale"] + 1e-6)


def check_contribution(label, strategy, scheme, params, sec, sec_clients, pq_clients):
    """Contribution normalisation: every round normalised; each client's factor equal under both kinds,
    every round; the last round's factors are the paper's formula of the clients' latents, computed here in
    the clear; and they changed the model (the base strategy's run, same seed, differs)."""
    assert all(h.contribution["status"] == "ok" and h.contribution["n"] == len(sec_clients) for h in sec.history)
    for a, b in zip(sec_clients, pq_clients):
        assert [h["contribution_factor"] for h in a.history] == [h["contribution_factor"] for h in b.history]
    lam = np.array([c.contrib.factor for c in sec_clients])
    np.testing.assert_allclose(lam, paper_factors(np.stack([c.contrib.z for c in sec_clients]), T), rtol=1e-5)
    base, _, _ = run(strategy, scheme, params, "plain_quantised")
    assert not np.array_equal(base.global_vec, sec.global_vec)


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


@pytest.mark.parametrize("scheme, params", PARTITIONS, ids=PARTITION_IDS)
def test_multiconfederated_aggregates_the_filtered_weighted_mean(scheme, params):
    data, spec = shards(scheme, params)
    test_rows = 1
    _Recording.sent = {}
    cfg = mc_harness.config(rounds=1, local=LOCAL, fork_margin=1.0, merge_tolerance=0.0)
    peers, errors, _ = mc_harness.run_peers([(X, y) for X, y in data], cfg, test_rows=test_rows, spec=spec,
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
