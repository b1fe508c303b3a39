"""Vertical SecureBoost resumed from any round's checkpoint ends with exactly the uninterrupted model.

In-process: every role records its checkpoint states; new roles built with ``resume=`` the
states of round k (all parties the same k) must grow the same trees (structure, leaf values, host
records) with a fresh Paillier key. Binary with validation, and multiclass (several trees per round).
"""
from __future__ import annotations


import numpy as np
import pytest

from sb_harness import vertical_run  # puts tests/ on the path too
from lifecycle_helpers import recorder
from secureflhv.tree.model import model_to_dict

KEY = {"key_bits": 512, "insecure_test_key": True, "shuffle_seed": 5}


def _data(n_classes: int):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(80, 4))
    score = X @ np.array([1.0, -1.0, 0.5, 0.8])
    y = (score > 0).astype(int) if n_classes == 2 else np.digitize(score, [-0.7, 0.7])
    X[rng.random(X.shape) < 0.05] = np.nan  # missing values too
    return X, y


def _train(params: dict, resume: dict | None = None, validate: bool = True):
    X, y = _data(params.get("n_classes", 2))
    tr, va = slice(0, 60), slice(60, 80)
    saved = {"guest": {}, "host-1": {}}
    out = vertical_run(X[tr], y[tr], [[0, 1], [2, 3]], params, X_val=X[va] if validate else None,
                       y_val=y[va] if validate else None, deadline=30, backend=None,
                       callbacks={p: [recorder(s)] for p, s in saved.items()}, resume=resume)
    assert not out["errors"], out["errors"]
    return out["result"], out["hosts"][0], saved


@pytest.mark.parametrize("params", [
    dict(KEY, n_trees=5, max_depth=2, early_stopping_rounds=2),
    dict(KEY, objective="multiclass", n_classes=3, n_trees=3, max_depth=2),
], ids=["binary-validation", "multiclass"])
def test_resume_from_every_round_equals_uninterrupted(params):
    full, host, saved = _train(params)
    rounds = sorted(saved["guest"])
    assert rounds == list(range(1, len(rounds) + 1)) and len(rounds) >= 2
    assert set(saved["host-1"]) >= set(rounds)
    for k in rounds:
        resumed, rhost, later = _train(params, {p: saved[p][k] for p in saved})
        assert model_to_dict(resumed.model) == model_to_dict(full.model)
        assert rhost.records == host.records and rhost.keep_trees == host.keep_trees
        assert resumed.stopped_early == full.stopped_early
        assert min(later["guest"], default=k + 1) == k + 1  # it did not redo the rounds before k
