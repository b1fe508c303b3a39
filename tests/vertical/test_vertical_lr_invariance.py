"""Non-IID invariance of vertical LR (Zhu et al. 4.1.2; README, non-IID claims):
whatever the feature split and protocol mode, the federated weights equal an independent centralised
plaintext implementation of the same Taylor-approximated LR with the same batches and seed."""
import numpy as np
import pytest

from vlr_harness import reference_taylor_lr, run_vertical_lr

KEY = {"key_bits": 512, "insecure_test_key": True}


def _data(seed=3, n=57, d=7):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 2.0, size=d) + rng.normal(size=d)
    logits = X @ rng.normal(size=d) + 0.3
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-logits))).astype(int)
    return X, y


def _check(X, y, guest_cols, host_cols, cfg):
    results, errors, _, _ = run_vertical_lr(X[:, guest_cols], y, [X[:, c] for c in host_cols], cfg)
    assert not errors, errors
    w_ref, b_ref, losses_ref = reference_taylor_lr(X, y, **cfg)
    fed = np.zeros(X.shape[1])
    fed[guest_cols] = results["guest"].weights
    for i, cols in enumerate(host_cols):
        fed[cols] = results[f"host-{i + 1}"].weights
    scale = np.max(np.abs(w_ref))
    assert scale > 1e-3  # the model actually moved
    np.testing.assert_allclose(fed, w_ref, rtol=1e-6, atol=1e-6 * scale)
    assert results["guest"].intercept == pytest.approx(b_ref, rel=1e-6, abs=1e-6 * scale)
    assert results["guest"].epochs == len(losses_ref)
    np.testing.assert_allclose(results["guest"].losses, losses_ref, rtol=1e-6)
    for pid, res in results.items():  # every party stopped at the same epoch
        assert res.epochs == len(losses_ref), pid
    return results, losses_ref


@pytest.mark.parametrize("mode", ["arbiter", "two_party"])
def test_random_split_two_parties(mode):
    X, y = _data()
    perm = np.random.default_rng(11).permutation(X.shape[1])
    cfg = dict(KEY, mode=mode, epochs=3, batch_size=16, learning_rate=0.3, l2=0.01, seed=5,
               lr_schedule="inverse_time", lr_decay=0.5, early_stopping_rounds=None)
    _check(X, y, sorted(perm[:3]), [sorted(perm[3:])], cfg)


@pytest.mark.parametrize("mode", ["arbiter", "two_party"])
def test_given_column_lists_full_batch_step_schedule(mode):
    X, y = _data(seed=4)
    cfg = dict(KEY, mode=mode, epochs=4, batch_size=None, learning_rate=0.5, l2=0.0, seed=1,
               lr_schedule="step", lr_decay=0.5, lr_step_epochs=2, early_stopping_rounds=None)
    _check(X, y, [0, 5, 6], [[1, 2, 3, 4]], cfg)


@pytest.mark.parametrize("mode", ["arbiter", "two_party"])
def test_three_parties_with_early_stopping(mode):
    X, y = _data(seed=5, n=48, d=6)
    # a large min_delta makes early stopping fire after a few epochs, in the reference as in the federation
    cfg = dict(KEY, mode=mode, epochs=12, batch_size=20, learning_rate=0.2, l2=0.05, seed=9,
               early_stopping_rounds=2, min_delta=0.02)
    results, losses_ref = _check(X, y, [4, 1], [[0, 3], [5, 2]], cfg)
    assert len(losses_ref) < 12 and results["guest"].stopped_early


@pytest.mark.parametrize("mode", ["arbiter", "two_party"])
def test_momentum_cosine_keeps_the_lowest_loss_epoch(mode):
    X, y = _data(seed=6, n=50, d=6)
    # a large step with momentum overshoots, so the lowest loss is not at the last epoch
    cfg = dict(KEY, mode=mode, epochs=5, batch_size=25, learning_rate=1.0, momentum=0.9, lr_schedule="cosine",
               l2=0.01, seed=2, early_stopping_rounds=None, restore_best=True)
    results, losses_ref = _check(X, y, [0, 4], [[1, 2, 3, 5]], cfg)
    best = int(np.argmin(losses_ref))
    assert best < len(losses_ref) - 1
    assert all(res.best_epoch == best for pid, res in results.items() if pid != "server")


@pytest.mark.parametrize("mode", ["arbiter", "two_party"])
def test_okamoto_uchiyama_equals_the_centralised_model(mode):
    """he_scheme: ou runs the same protocol (statistical masks instead of Paillier's one-time pads) and
    must give the same model; three parties so cross terms and several hosts' gradients go through OU."""
    pytest.importorskip("heu", reason="sf-heu is a linux dependency of the OU scheme")
    X, y = _data(seed=7, n=45, d=6)
    cfg = dict(key_bits=1024, insecure_test_key=True, he_scheme="ou", mode=mode, epochs=3, batch_size=15,
               learning_rate=0.4, l2=0.02, seed=3, early_stopping_rounds=None)
    _check(X, y, [2, 5], [[0, 3], [1, 4]], cfg)


@pytest.mark.parametrize("mode", ["arbiter", "two_party"])
def test_a_column_held_by_both_parties_is_two_features_as_in_the_joined_table(mode):
    """Overlapping columns (issue 39): guest and host both hold column 2 (in a job file both may even give
    it the same name: each party's feature names are its own, and bundles and reports name them per party).
    The federation treats the two copies as two features, exactly as the centralised model on the joined
    table holding both copies does (with l2 > 0 that model is unique: the copies share the weight)."""
    X, y = _data(seed=8, n=50, d=6)
    joined = np.column_stack([X[:, [0, 1, 2]], X[:, [2, 3, 4, 5]]])  # the guest's columns, then the host's
    cfg = dict(KEY, mode=mode, epochs=3, batch_size=25, learning_rate=0.4, l2=0.05, seed=4,
               early_stopping_rounds=None)
    results, _ = _check(joined, y, [0, 1, 2], [[3, 4, 5, 6]], cfg)
    assert results["guest"].weights[2] == pytest.approx(results["host-1"].weights[0], rel=1e-6)
