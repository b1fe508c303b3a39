"""Horizontal FL resume in process from every round's checkpoint (every strategy with cross-round state).

In process, every role records its checkpoint states; new roles built with ``resume=`` the
states of round k finish with the uninterrupted run's global model bit for bit (aggregation rounding is
seeded by (seed, round, client), batches by (seed, round, client)).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fl_harness import blobs, run_fl  # noqa: E402

from secureflhv.horizontal.models import ModelSpec  # noqa: E402
from secureflhv.horizontal.strategy_registry import make_strategy  # noqa: E402
from secureflhv.horizontal.strategies import LocalTrainConfig  # noqa: E402
from secureflhv.transport.lifecycle import Callback  # noqa: E402
from lifecycle_helpers import recorder  # noqa: E402 - tests/ is on the path through fl_harness

SPEC = ModelSpec(name="mlp", n_features=6, n_classes=3, hidden=(8,))
LOCAL = LocalTrainConfig(epochs=1, batch_size=16, lr=0.1, momentum=0.5)
ROUNDS = 3


def _fl(strategy, resume=None, **kw):
    """Run FL in threads; returns (server, clients, {party: {rounds done: (arrays, state)}})."""
    shard_list, test = blobs(40, 3, seed=1, skew=True)
    saved: dict[str, dict] = {p: {} for p in ["server", *(f"c{i}" for i in range(len(shard_list)))]}  # run_fl's ids
    server, clients, errors = run_fl(shard_list, test, SPEC, strategy, "plain_quantised", rounds=ROUNDS, seed=2,
                                     local=LOCAL, callbacks={p: [recorder(s)] for p, s in saved.items()},
                                     resume=resume, **kw)
    assert not errors, errors
    return server, clients, saved


@pytest.mark.parametrize("strategy, kw", [("scaffold", {}), ("fedper", {}), ("ifca", {"strategy_kw": {"clusters": 2}})])
def test_resume_from_every_round_equals_uninterrupted(strategy, kw):
    server, clients, saved = _fl(strategy, **kw)
    assert sorted(saved["server"]) == list(range(1, ROUNDS + 1)) and sorted(saved["c0"]) == list(range(1, ROUNDS + 1))
    held = {"scaffold": ("server", "strategy.c_global"), "fedper": ("c1", "strategy.head"),
            "ifca": ("server", "strategy.cluster1")}[strategy]
    assert held[1] in saved[held[0]][1][0]  # the strategy's own state is in the checkpoint
    for k in range(1, ROUNDS):
        s2, c2, _ = _fl(strategy, resume={p: steps[k] for p, steps in saved.items()}, **kw)
        assert np.array_equal(s2.global_vec, server.global_vec), (strategy, k)
        assert [vars(r)["test_accuracy"] for r in s2.history] == [r.test_accuracy for r in server.history]
        for a, b in zip(c2, clients):
            assert a.history == b.history
            for name, v in b.strategy.state_arrays().items():
                assert np.array_equal(a.strategy.state_arrays()[name], v), (strategy, k, name)


def test_foreign_checkpoint_is_rejected():
    _, _, saved = _fl("scaffold")
    arrays, state = saved["server"][2]
    bad = {"not a scaffold horizontal FL checkpoint": [(arrays, {**state, "strategy": "fedavg"}),
                                                       (arrays, {**state, "rounds_done": ROUNDS + 1}),
                                                       (arrays, {**state, "history": state["history"][:1]})],
           "float32": [({**arrays, "strategy.c_global": np.zeros(5, np.float32)}, state),
                       ({**arrays, "global": arrays["global"].astype(np.float64)}, state)],
           "keeps no state": [({**arrays, "strategy.head": arrays["global"]}, state)],
           "malformed round history": [(arrays, {**state, "history": [{"round": 1}, {"x": 2}]})]}
    for match, cases in bad.items():
        for case in cases:
            server, _, errors = run_fl(*blobs(40, 3, seed=1), SPEC, "scaffold", "plain_quantised", rounds=ROUNDS,
                                       seed=2, local=LOCAL, deadline=5,
                                       resume={"server": case})
            assert isinstance(errors.get("server"), ValueError) and re.search(match, str(errors["server"])), errors
    assert make_strategy("fedavg").state_arrays() == {}


class _Order(Callback):
    """Records every hook a role fires, in order."""

    def __init__(self, seen: list):
        self.seen = seen

    def before_training(self, role):
        self.seen.append("before_training")

    def after_training(self, role):
        self.seen.append("after_training")

    def before_step(self, step):
        self.seen.append(("before", step))

    def after_step(self, step, state):
        self.seen.append(("after", step))
        return False


def test_every_hook_fires_in_order_and_a_resumed_run_starts_at_its_next_step():
    """The role lifecycle's contract on a real role (server and client): before_training, then
    before_step(k) / after_step(k) for k = 1..rounds, then after_training; resumed after round 1, the
    hooks start at step 2."""
    shard_list, test = blobs(40, 3, seed=1, skew=True)
    parties = ["server", *(f"c{i}" for i in range(len(shard_list)))]  # run_fl's ids
    seen: dict = {p: [] for p in parties}
    saved: dict = {p: {} for p in parties}
    run_fl(shard_list, test, SPEC, "fedavg", "plain_quantised", rounds=ROUNDS, seed=2, local=LOCAL,
           callbacks={p: [_Order(seen[p]), recorder(saved[p])] for p in parties})
    steps = [x for k in range(1, ROUNDS + 1) for x in (("before", k), ("after", k))]
    for p in parties:
        assert seen[p] == ["before_training", *steps, "after_training"], p
    resumed: dict = {p: [] for p in parties}
    run_fl(shard_list, test, SPEC, "fedavg", "plain_quantised", rounds=ROUNDS, seed=2, local=LOCAL,
           callbacks={p: [_Order(resumed[p])] for p in parties}, resume={p: saved[p][1] for p in parties})
    for p in parties:
        assert resumed[p] == ["before_training", *steps[2:], "after_training"], p
