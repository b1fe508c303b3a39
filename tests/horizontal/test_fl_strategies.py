"""Strategy maths: two FL rounds of a softmax-regression model (no hidden layer) against a plain numpy
re-implementation of NIID-Bench's update rules (SGD with momentum and weight decay as torch defines
it, FedProx's proximal gradient, SCAFFOLD's corrected steps and control variates, FedNova's a_i)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fl_harness import run_fl  # noqa: E402

from secureflhv.horizontal.models import ModelSpec, build_model, get_flat  # noqa: E402
from secureflhv.horizontal.strategies import LocalTrainConfig, batch_rng, fednova_a  # noqa: E402

D, K = 4, 3
LOCAL = LocalTrainConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.5, weight_decay=1e-3)
MU = 0.3
SEED = 11


def data():
    rng = np.random.default_rng(5)
    shards = []
    for n in (20, 33, 13):  # unequal sizes, so FedNova differs from FedAvg
        y = rng.integers(0, K, n)
        X = (rng.normal(0, 1, (n, D)) + y[:, None] * 0.7).astype(np.float32)
        shards.append((X, y))
    return shards


def softmax_grad(W, b, X, y):
    z = X @ W.T + b
    z -= z.max(1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    g = p / len(y)
    return g.T @ X, g.sum(0)


def ref_local(w, X, y, client_id, rnd, *, mu=0.0, corr=None):
    """numpy SGD (torch semantics) from flat w = [W (K*D), b (K)]; returns (new w, steps)."""
    cfg = LOCAL
    w = w.astype(np.float64).copy()
    w_anchor = w.copy()
    buf = None
    rng = batch_rng(SEED, rnd, client_id)
    steps = 0
    X = X.astype(np.float64)
    for _ in range(cfg.epochs):
        perm = rng.permutation(len(y))
        for s in range(0, len(y), cfg.batch_size):
            idx = perm[s:s + cfg.batch_size]
            W, b = w[:K * D].reshape(K, D), w[K * D:]
            gW, gb = softmax_grad(W, b, X[idx], y[idx])
            g = np.concatenate([gW.ravel(), gb]) + mu * (w - w_anchor) + cfg.weight_decay * w
            buf = g if buf is None else cfg.momentum * buf + g
            w = w - cfg.lr * buf
            if corr is not None:
                w = w - cfg.lr * corr
            steps += 1
    return w, steps


def reference(strategy, shards, w0, rounds=2):
    ids = [f"c{i}" for i in range(len(shards))]
    n = np.array([len(y) for _, y in shards], float)
    p = n / n.sum()
    w = w0.astype(np.float64)
    c = np.zeros_like(w)
    c_i = [np.zeros_like(w) for _ in shards]
    for rnd in range(1, rounds + 1):
        outs = []
        for i, (X, y) in enumerate(shards):
            if strategy == "scaffold":
                wi, tau = ref_local(w, X, y, ids[i], rnd, corr=c - c_i[i])
            else:
                wi, tau = ref_local(w, X, y, ids[i], rnd, mu=MU if strategy == "fedprox" else 0.0)
            outs.append((wi, tau))
        if strategy == "fednova":
            a = np.array([fednova_a(t, LOCAL.momentum) for _, t in outs])
            d = [(w - wi) / ai for (wi, _), ai in zip(outs, a)]
            w = w - (p @ a) * sum(pi * di for pi, di in zip(p, d))
        else:
            new_w = sum(pi * wi for pi, (wi, _) in zip(p, outs))
            if strategy == "scaffold":
                deltas = []
                for i, (wi, tau) in enumerate(outs):
                    c_new = c_i[i] - c + (w - wi) / (tau * LOCAL.lr)
                    deltas.append(c_new - c_i[i])
                    c_i[i] = c_new
                c = c + sum(deltas) / len(deltas)
            w = new_w
    return w


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "scaffold", "fednova"])
def test_two_rounds_match_numpy_reference(strategy):
    spec = ModelSpec(name="mlp", n_features=D, n_classes=K, hidden=())
    shards = data()
    w0 = get_flat(build_model(spec, seed=SEED))
    server, _, errors = run_fl(shards, None, spec, strategy, "plain", rounds=2, seed=SEED, local=LOCAL, mu=MU)
    assert not errors
    expected = reference(strategy, shards, w0)
    assert np.abs(server.global_vec - w0).max() > 1e-2  # the model moved
    np.testing.assert_allclose(server.global_vec, expected, atol=2e-5, rtol=1e-4)


def test_strategies_differ_where_they_should():
    """The reference itself distinguishes the rules (so the test above can fail for a wrong rule)."""
    spec = ModelSpec(name="mlp", n_features=D, n_classes=K, hidden=())
    w0 = get_flat(build_model(spec, seed=SEED))
    refs = {s: reference(s, data(), w0) for s in ("fedavg", "fedprox", "scaffold", "fednova")}
    for a in refs:
        for b in refs:
            if a < b:
                assert np.abs(refs[a] - refs[b]).max() > 1e-4, (a, b)


def test_fednova_a_matches_momentum_series():
    # a_i = sum_{t<tau} sum_{j<=t} rho^j (the accumulated momentum coefficients)
    for rho in (0.0, 0.5, 0.9):
        for tau in (1, 7, 30):
            series = sum(sum(rho ** j for j in range(t + 1)) for t in range(tau))
            assert fednova_a(tau, rho) == pytest.approx(series)
