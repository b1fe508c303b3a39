"""FedPer (personal head local, base through secure aggregation): secagg equals plain_quantised bit for
bit, the server's head never moves (no head information reaches it), each client evaluates its own head
on its own split, and on two conflicting tasks the worst client does far better than under FedAvg."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fl_harness import run_fl  # noqa: E402
from test_ifca import two_tasks  # noqa: E402

from secureflhv.horizontal.fedper import FedPer, personal_mask  # noqa: E402
from secureflhv.horizontal.models import ModelSpec, build_model, evaluate, set_flat  # noqa: E402
from secureflhv.horizontal.strategy_registry import make_strategy  # noqa: E402
from secureflhv.horizontal.strategies import LocalTrainConfig  # noqa: E402

SPEC = ModelSpec(name="mlp", n_features=4, n_classes=2, hidden=(16,))
LOCAL = LocalTrainConfig(epochs=2, batch_size=16, lr=0.2)


def test_mask_covers_the_last_linear_layers():
    model = build_model(SPEC)
    mask = personal_mask(model, 1)
    assert mask.sum() == 16 * 2 + 2 and mask[-34:].all() and not mask[:-34].any()
    deeper = personal_mask(build_model(ModelSpec(name="mlp", n_features=4, n_classes=2, hidden=(8, 4))), 2)
    assert deeper.sum() == (8 * 4 + 4) + (4 * 2 + 2) and not deeper[:4 * 8 + 8].any()
    with pytest.raises(ValueError, match="no shared base"):
        personal_mask(model, 2)
    with pytest.raises(ValueError, match="linear layers"):
        personal_mask(model, 3)
    assert make_strategy("fedper", personal_layers=1).personal_layers == 1
    with pytest.raises(ValueError):
        FedPer(0)


def test_secagg_equals_plain_quantised_and_the_head_stays_local():
    shards = two_tasks(n=48, seed=2)
    tests = two_tasks(n=40, seed=7)
    runs = {}
    for kind in ("secagg", "plain_quantised"):
        server, clients, errors = run_fl(shards, None, SPEC, "fedper", kind, rounds=2, seed=4, local=LOCAL)
        assert not errors, errors
        runs[kind] = (server, clients)
    (sec, sec_clients), (pq, pq_clients) = runs["secagg"], runs["plain_quantised"]
    assert np.array_equal(sec.global_vec, pq.global_vec)
    mask = personal_mask(build_model(SPEC), 1)
    init = sec.initial[0]
    assert np.array_equal(sec.global_vec[mask], init[mask])          # the server's head never moved ...
    assert not np.array_equal(sec.global_vec[~mask], init[~mask])    # ... the base did
    heads = [c.strategy.head for c in sec_clients]
    assert not np.array_equal(heads[0], heads[1])                    # personal heads differ
    # each client evaluates the global base with its own head on its own data
    for c, (X, y) in zip(sec_clients, tests):
        vec = c.strategy.eval_vector(c.model, sec.global_vec, {}, X, y)
        assert np.array_equal(vec[mask], c.strategy.head) and np.array_equal(vec[~mask], sec.global_vec[~mask])


def test_worst_client_beats_fedavg_on_conflicting_tasks():
    shards = two_tasks(n=96, seed=1)
    test_sets = two_tasks(n=60, seed=11)
    worst = {}
    for strategy in ("fedavg", "fedper"):
        # each client's local test split comes from its own task (run_fl gives every client the same test
        # rows, so evaluate here on each client's own split, as the FL client does)
        server, clients, errors = run_fl(shards, None, SPEC, strategy, "secagg", rounds=6, seed=2, local=LOCAL)
        assert not errors, errors
        model = build_model(SPEC)
        accs = []
        for c, (X, y) in zip(clients, test_sets):
            set_flat(model, c.strategy.eval_vector(c.model, server.global_vec, {}, c.X_train, c.y_train))
            accs.append(evaluate(model, X, y)["accuracy"])
        worst[strategy] = min(accs)
    assert worst["fedper"] > 0.85 and worst["fedper"] > worst["fedavg"] + 0.2, worst


def test_server_reports_each_client_and_the_worst():
    shards = two_tasks(n=48, seed=3)
    tests = two_tasks(n=30, seed=5)
    import fl_harness
    from secureflhv.horizontal.fl import HorizontalClient

    class OwnTest(HorizontalClient):  # each client's local test split from its own task
        def __init__(self, transport, server_id, X, y, Xt, yt, *a, **kw):
            i = int(transport.party_id[1:])
            super().__init__(transport, server_id, X, y, *tests[i], *a, **kw)

    orig = fl_harness.HorizontalClient
    fl_harness.HorizontalClient = OwnTest
    try:
        server, clients, errors = run_fl(shards, None, SPEC, "fedper", "secagg", rounds=2, seed=2, local=LOCAL)
    finally:
        fl_harness.HorizontalClient = orig
    assert not errors, errors
    rec = server.history[-1]
    assert sorted(rec.client_accuracy) == ["c0", "c1", "c2", "c3"]
    assert rec.worst_client_accuracy == min(rec.client_accuracy.values())
    for c in clients:  # the server's per-client figure is the client's own evaluation
        assert rec.client_accuracy[c.party_id] == pytest.approx(c.history[-1]["test_accuracy"])
