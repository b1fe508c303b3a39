"""Vertical LR beyond binary (issue 13): multinomial (Taylor softmax) and linear regression equal their
independent centralised numpy twins (vlr_harness) to 1e-6, in arbiter and two-party mode, Paillier and
OU, with one and two hosts; predictions are the twin's softmax / linear values; bad labels and a hostile
class count are rejected."""
import numpy as np
import pytest

from secureflhv.proto import messages_pb2
from secureflhv.transport import ProtocolError
from secureflhv.vertical.lr import VerticalLRConfig, VerticalLRGuest, _check_setup
from secureflhv.transport import InProcessNetwork
from vlr_harness import reference_linear_regression, reference_taylor_softmax, run_vertical_lr

KEY = {"key_bits": 512, "insecure_test_key": True}
OU_KEY = {"key_bits": 1024, "insecure_test_key": True, "he_scheme": "ou"}


def _data(seed, n=42, d=6, k=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 2.0, size=d) + rng.normal(size=d) * 0.5
    y_cls = np.argmax(X @ rng.normal(size=(d, k)) + rng.normal(size=(n, k)), axis=1)
    y_reg = X @ rng.normal(size=d) * 3 + 20 + rng.normal(size=n)
    return X, y_cls, y_reg


def _federated(results, guest_cols, host_cols, shape):
    fed = np.zeros(shape)
    fed[guest_cols] = results["guest"].weights
    for i, cols in enumerate(host_cols):
        fed[cols] = results[f"host-{i + 1}"].weights
    return fed


def _assert_close(fed, ref, b_fed, b_ref, losses_fed, losses_ref):
    scale = np.max(np.abs(ref))
    assert scale > 1e-3  # the model actually moved
    np.testing.assert_allclose(fed, ref, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(b_fed, b_ref, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(losses_fed, losses_ref, rtol=1e-6)


@pytest.mark.parametrize("mode,key,host_cols", [
    ("arbiter", KEY, [[1, 3], [0, 5]]),        # two hosts: the encrypted cross terms of the multinomial loss
    ("two_party", KEY, [[0, 1, 3, 5]]),
    ("arbiter", OU_KEY, [[1, 3], [0, 5]]),
])
def test_multinomial_equals_centralised_taylor_softmax(mode, key, host_cols):
    if key is OU_KEY:
        pytest.importorskip("heu", reason="sf-heu is a linux dependency of the OU scheme")
    X, y, _ = _data(seed=1)
    guest_cols = [2, 4]
    cfg = dict(key, task="multiclass", mode=mode, epochs=3, batch_size=21, learning_rate=0.5, l2=0.01, seed=4,
               early_stopping_rounds=None)
    Xte = X[:7] * 1.3
    results, errors, _, _ = run_vertical_lr(X[:, guest_cols], y, [X[:, c] for c in host_cols], cfg, n_classes=3,
                                            predict_sets=(Xte[:, guest_cols], [Xte[:, c] for c in host_cols]))
    assert not errors, errors
    W_ref, b_ref, losses_ref = reference_taylor_softmax(X, y, 3, **cfg)
    fed = _federated(results, guest_cols, host_cols, (X.shape[1], 3))
    _assert_close(fed, W_ref, results["guest"].intercept, b_ref, results["guest"].losses, losses_ref)
    z = Xte @ W_ref + b_ref
    p_ref = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    assert results["proba"].shape == (7, 3)
    np.testing.assert_allclose(results["proba"], p_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode,key,host_cols", [
    ("arbiter", KEY, [[0, 3], [1, 5]]),
    ("two_party", KEY, [[0, 3], [1, 5]]),
    ("two_party", OU_KEY, [[0, 1, 3, 5]]),
])
def test_linear_regression_equals_centralised_gd(mode, key, host_cols):
    if key is OU_KEY:
        pytest.importorskip("heu", reason="sf-heu is a linux dependency of the OU scheme")
    X, _, y = _data(seed=2)
    guest_cols = [2, 4]
    cfg = dict(key, task="regression", mode=mode, epochs=3, batch_size=14, learning_rate=0.05, momentum=0.5,
               l2=0.01, seed=6, early_stopping_rounds=None)
    Xte = X[:5]
    results, errors, _, _ = run_vertical_lr(X[:, guest_cols], y, [X[:, c] for c in host_cols], cfg,
                                            predict_sets=(Xte[:, guest_cols], [Xte[:, c] for c in host_cols]))
    assert not errors, errors
    w_ref, b_ref, losses_ref = reference_linear_regression(X, y, **cfg)
    fed = _federated(results, guest_cols, host_cols, X.shape[1])
    _assert_close(fed, w_ref, results["guest"].intercept, b_ref, results["guest"].losses, losses_ref)
    assert losses_ref[-1] < losses_ref[0]
    np.testing.assert_allclose(results["proba"], Xte @ w_ref + b_ref, rtol=1e-6)


def test_bad_labels_and_a_hostile_class_count_are_rejected():
    net = InProcessNetwork("j", ["guest", "host-1"])
    cfg = VerticalLRConfig(**KEY, task="multiclass", mode="two_party")
    X = np.zeros((4, 2))
    with pytest.raises(ValueError, match="y: multiclass labels"):
        VerticalLRGuest(net.transport("guest"), ["host-1"], X, [0.5, 1, 2, 0], cfg)
    with pytest.raises(ValueError, match="y: multiclass labels"):
        VerticalLRGuest(net.transport("guest"), ["host-1"], X, [0, 1, 2, 3], cfg, n_classes=3)
    with pytest.raises(ValueError, match="y: labels must be 0/1"):
        VerticalLRGuest(net.transport("guest"), ["host-1"], X, [0, 1, 2, 0], cfg.model_copy(update={"task": "binary"}))
    with pytest.raises(ValueError, match="regression targets must be finite"):
        VerticalLRGuest(net.transport("guest"), ["host-1"], X, [0, 1, np.nan, 0],
                        cfg.model_copy(update={"task": "regression"}))
    setup = messages_pb2.Bundle(scalars={"n_rows": 4, "batch_size": 32.0, "seed": 0.0, "epochs": 20.0},
                                text={"mode": "two_party", "hosts": "host-1", "he_scheme": "paillier",
                                      "task": "multiclass"})
    for k in (1e9, 1.0):  # a class count that would size the host's work, and one the task cannot have
        setup.scalars["n_outputs"] = k
        with pytest.raises(ProtocolError, match="n_outputs"):
            _check_setup(setup, cfg, ["host-1"], 4, "host-1")
    setup.scalars["n_outputs"] = 3.0
    assert _check_setup(setup, cfg, ["host-1"], 4, "host-1")[1].k == 3
    setup.text["task"] = "regression"
    with pytest.raises(ProtocolError, match="'task'"):
        _check_setup(setup, cfg, ["host-1"], 4, "host-1")


def test_job_class_count_comes_from_every_aligned_row_and_needs_class_ids():
    from secureflhv.runtime.job.job_file import JobConfigError
    from secureflhv.runtime.algorithms.vertical_lr import _n_classes

    assert _n_classes(np.array([0, 2, 1, 2]), "multiclass") == 3
    assert _n_classes(np.array([0.5, 2.0]), "regression") is None
    for bad in ([0.5, 1.0], [-1, 0, 1]):
        with pytest.raises(JobConfigError, match="params.task"):
            _n_classes(np.array(bad), "multiclass")
