"""A client that crashes mid-training is dropped from the round by the aggregation layer, the round
completes with the survivors (the same sum as plain_quantised aggregation of the survivors), and the
server stops selecting it; too many crashes fail the round with a clear error."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fl_harness import blobs, run_fl  # noqa: E402

from secureflhv.secagg import AggregationError  # noqa: E402
from secureflhv.horizontal.models import ModelSpec  # noqa: E402
from secureflhv.horizontal.strategies import LocalTrainConfig  # noqa: E402

SPEC = ModelSpec(name="mlp", n_features=6, n_classes=3)
# input_timeout_s: each part of a round waits that long for a crashed client; the live ones train at most a few
# hundred tiny steps before their first message (generous: CI machines are slow)
FAST = {"input_timeout_s": 5.0, "stage_timeout_s": 4.0}


def test_round_completes_with_survivors_after_a_crash():
    shards, test = blobs(60, 4, seed=4)
    runs = {}
    for kind in ("secagg", "plain_quantised"):
        server, clients, errors = run_fl(shards, test, SPEC, "scaffold", kind, rounds=3, seed=2, agg_kw=FAST,
                                         fail={3: 2})
        assert set(errors) == {"c3"} and "simulated crash" in str(errors["c3"])
        runs[kind] = server
    server = runs["secagg"]
    assert [r.round for r in server.history] == [1, 2, 3]
    r1, r2, r3 = server.history
    assert r1.survivors == ["c0", "c1", "c2", "c3"] and r1.dropped == []
    assert r2.selected == ["c0", "c1", "c2", "c3"]
    assert r2.survivors == ["c0", "c1", "c2"] and r2.dropped == ["c3"]
    assert r2.aggregation["model"]["weight"] == 180.0  # 3 survivors x 60 samples
    assert r2.aggregation["control"]["weight"] == 3.0
    assert "c3" in r2.dead and r3.selected == ["c0", "c1", "c2"]
    assert r3.survivors == ["c0", "c1", "c2"]
    assert np.isfinite(r3.test_accuracy) and r3.test_n == 3 * len(test[1])
    # secure aggregation of the survivors == plain sum of the survivors' quantised updates
    assert np.array_equal(server.global_vec, runs["plain_quantised"].global_vec)


def test_fewer_than_threshold_fails_clearly():
    shards, test = blobs(40, 4, seed=5)
    server, _, errors = run_fl(shards, test, SPEC, "fedavg", "secagg", rounds=2, seed=1, agg_kw=FAST,
                               fail={2: 1, 3: 1})
    assert {"server", "c2", "c3"} <= set(errors)  # c0 and c1 then fail too: their server gave up
    assert isinstance(errors["server"], AggregationError)
    msg = str(errors["server"])
    assert "round 1" in msg and "c2" in msg and "c3" in msg and "t=3" in msg
    assert server.history == []


def _silent_in_part(client, fl_round, part="model"):
    """``client`` receives the shares of ``part`` in ``fl_round`` but never sends its masked input: the server
    leaves it out of that sum (U3), the client learns it from the survivor list and goes on to the next part,
    where it is on time."""
    agg = client.agg_clients[part]
    honest = agg.masked_input_collection
    round_id = fl_round * 8 + client.strategy.parts.index(part)

    def silent(rnd):
        if rnd.round_id != round_id:
            return honest(rnd)
        agg._receive_shares(rnd, agg._from_server(rnd.round_id, 2, "shares"))
    agg.masked_input_collection = silent


def test_fednova_refuses_a_round_whose_parts_have_different_survivors():
    """FedNova's step (Σ p_i a_i)·(Σ p_i d_i) needs both sums over one set of clients: c3 missing only the model
    sum would scale the step by Σ_all p a / Σ_survivors p a (13x here). The round is refused: the model stays."""
    shards, test = blobs(400, 4, seed=1)
    shards = [(X[:n], y[:n]) for (X, y), n in zip(shards, (40, 40, 40, 400))]  # a_i from 55 to 910 steps
    spec = ModelSpec(name="mlp", n_features=6, n_classes=3, hidden=(16, 8))
    initial = []
    server, _, errors = run_fl(shards, test, spec, "fednova", "secagg", rounds=1, seed=1,
                               local=LocalTrainConfig(epochs=4, batch_size=16, lr=0.05, momentum=0.9),
                               agg_kw={**FAST, "threshold": 3},
                               prepare=lambda s, cs: (initial.append(s.global_vec.copy()),
                                                      _silent_in_part(cs[3], 1)))
    assert not errors, errors
    rec = server.history[0]
    assert "summed over different clients" in rec.refused
    assert np.array_equal(server.global_vec, initial[0])


def test_scaffold_client_keeps_its_control_variate_when_its_delta_is_dropped():
    """SCAFFOLD (Karimireddy et al. 2020, Alg. 1) pairs the client's c_i ← c_i⁺ with the server's c ← c + ΣΔc_i/|S|,
    which keeps c the mean of the c_i. c3 is left out of round 1's control sum only (its model delta is in):
    it must keep c_i = 0 (the server counted Δc_3 = 0), and c = mean c_i holds after that round and the next.
    (Committing c_3⁺ anyway, as before, leaves c off the mean for good: every later correction c − c_i is biased.)"""
    shards, test = blobs(60, 4, seed=3)
    seen, holder = [], {}

    def on_round(rec, _vec):  # the clients committed their c_i before answering fl.metrics
        seen.append((rec, holder["server"].strategy.c_global.copy(),
                     [c.strategy.c_local.copy() for c in holder["clients"]]))

    def prepare(server, clients):
        holder.update(server=server, clients=clients)
        _silent_in_part(clients[3], 1, "control")

    server, _, errors = run_fl(shards, test, SPEC, "scaffold", "secagg", rounds=2, seed=4, on_round=on_round,
                               agg_kw={**FAST, "threshold": 3}, prepare=prepare)
    assert not errors, errors
    (r1, c1, locals1), (r2, c2, locals2) = seen
    assert not r1.refused and r1.aggregation["model"]["survivors"] == 4 and r1.aggregation["control"]["survivors"] == 3
    assert r2.aggregation["control"]["survivors"] == 4
    assert np.array_equal(locals1[3], np.zeros_like(locals1[3]))  # its Δc_3 was not added: c_3 stays
    assert all(np.abs(c).max() > 1e-3 for c in locals1[:3])      # the others committed theirs
    assert np.abs(locals2[3]).max() > 1e-3                         # round 2 included it
    for c_global, c_locals, rec in ((c1, locals1, r1), (c2, locals2, r2)):
        tol = rec.round * 4 / rec.aggregation["control"]["scale"] + 1e-6  # stochastic rounding of the sums
        np.testing.assert_allclose(c_global, np.mean(c_locals, axis=0), rtol=0, atol=tol)
    assert np.abs(c1).max() > 100 * tol


def test_eval_naming_a_part_the_strategy_lacks_is_rejected():
    """``fl.eval``'s ``text.applied`` may name only the strategy's parts; anything else is a ProtocolError (the
    client keeps waiting for a valid message)."""
    import pytest

    from secureflhv.horizontal.fl import FLConfig, HorizontalClient, applied_parts
    from secureflhv.horizontal.model_wire import model_bundle
    from secureflhv.horizontal.models import build_model, get_flat, param_shapes
    from secureflhv.horizontal.strategy_registry import make_strategy
    from secureflhv.transport.base import ProtocolError
    from secureflhv.transport.inprocess import InProcessNetwork

    net = InProcessNetwork("wire", ["server", "c0"])
    X, y = np.zeros((4, 6), np.float32), np.array([0, 1, 2, 0])
    client = HorizontalClient(net.transport("c0"), "server", X, y, X[:0], y[:0], SPEC, make_strategy("scaffold"),
                              FLConfig(rounds=1))
    model = build_model(SPEC, seed=1)
    b = model_bundle(param_shapes(model), get_flat(model), command="eval", applied="model,control")
    assert applied_parts(client._parse_round(b.SerializeToString())) == {"model", "control"}
    b.text["applied"] = "model,nova"
    with pytest.raises(ProtocolError, match="nova"):
        client._parse_round(b.SerializeToString())
