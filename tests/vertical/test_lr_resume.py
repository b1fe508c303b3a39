"""Vertical LR resumed from any epoch's checkpoint ends exactly where the uninterrupted run ends.

In-process (the process-level SIGKILL test is tests/runtime/test_resume_vertical.py): every role
records its checkpoint states; new roles built with ``resume=`` the states of epoch k
(all parties the same k) must give the same weights, intercept, losses and kept epoch, bit for bit,
with a fresh Paillier key. Covers both modes, several hosts, momentum and early stopping.
"""
from __future__ import annotations

import numpy as np
import pytest

from vlr_harness import run_vertical_lr  # puts tests/ on the path too
from lifecycle_helpers import recorder
from secureflhv.vertical.lr import VerticalLRConfig


def _data():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 5))
    y = (X @ rng.normal(size=5) + 0.3 * rng.normal(size=60) > 0).astype(int)
    return X[:, :2], y, [X[:, 2:4], X[:, 4:]]


def _train(cfg: VerticalLRConfig, resume: dict | None = None):
    Xg, y, Xh = _data()
    # run_vertical_lr's party ids: guest, host-1, host-2 and, in arbiter mode, the arbiter "server"
    saved = {p: {} for p in ["guest", "host-1", "host-2"] + (["server"] if cfg.mode == "arbiter" else [])}
    results, errors, _, _ = run_vertical_lr(Xg, y, Xh, cfg, deadline=30, job_id="vlr-resume",
                                            callbacks={p: [recorder(s)] for p, s in saved.items()}, resume=resume)
    assert not errors, errors
    return results, saved


def _same(a, b):
    assert np.array_equal(a["guest"].weights, b["guest"].weights)
    assert a["guest"].intercept == b["guest"].intercept
    assert a["guest"].losses == b["guest"].losses and a["guest"].best_epoch == b["guest"].best_epoch
    assert a["guest"].stopped_early == b["guest"].stopped_early
    for h in ("host-1", "host-2"):
        assert np.array_equal(a[h].weights, b[h].weights) and a[h].best_epoch == b[h].best_epoch


@pytest.mark.parametrize("mode", ["arbiter", "two_party"])
def test_resume_from_every_epoch_equals_uninterrupted(mode):
    cfg = VerticalLRConfig(mode=mode, epochs=6, batch_size=16, learning_rate=0.3, momentum=0.7, l2=0.01, seed=2,
                           early_stopping_rounds=2, min_delta=0.02, key_bits=512, insecure_test_key=True)
    full, saved = _train(cfg)
    done = full["guest"].epochs
    assert done >= 3 and set(saved["guest"]) == set(range(1, done + 1))
    for k in range(1, done + 1):  # k == done: resume after the last (possibly stopping) epoch
        resumed, later = _train(cfg, {p: saved[p][k] for p in saved})
        _same(resumed, full)
        assert set(later["guest"]) == set(range(k + 1, done + 1))  # only the epochs it ran


def test_checkpoint_of_another_shape_is_refused():
    cfg = VerticalLRConfig(mode="two_party", epochs=2, batch_size=30, key_bits=512, insecure_test_key=True)
    _, saved = _train(cfg)
    bad = {p: steps[1] for p, steps in saved.items()}
    arrays, state = bad["guest"]
    bad["guest"] = ({**arrays, "w": np.zeros(7), "v": np.zeros(7)}, state)  # another number of features
    with pytest.raises(AssertionError, match="does not fit"):
        _train(cfg, bad)
