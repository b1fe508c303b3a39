"""Horizontal FL with a regression head (one output, MSE): every FedAvg-family strategy gives through
secure aggregation bit-for-bit the model of plaintext aggregation of the same quantised updates, stays
within quantisation error of float aggregation, and the server's pooled RMSE / MAE / R² equal
scikit-learn's on the pooled test rows. Data: scikit-learn's diabetes set, split over 3 clients."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fl_harness import run_fl  # noqa: E402

from secureflhv.data import load_dataset  # noqa: E402
from secureflhv.horizontal.models import ModelSpec, build_model, predict, set_flat  # noqa: E402
from secureflhv.horizontal.strategies import STRATEGIES, LocalTrainConfig  # noqa: E402

SPEC = ModelSpec(name="mlp", task="regression", n_features=10, hidden=(8,), target_mean=150.0, target_std=75.0)
LOCAL = LocalTrainConfig(epochs=2, batch_size=16, lr=0.05, momentum=0.5)


def diabetes_shards():
    ds = load_dataset("diabetes")
    X = (ds.X * np.sqrt(len(ds.X))).astype(np.float32)  # sklearn scales each column to unit norm: back to unit variance
    order = np.random.default_rng(0).permutation(len(X))
    parts = np.array_split(order[:360], 3)
    test = order[360:]
    return [(X[p], ds.y[p]) for p in parts], (X[test], ds.y[test])


def test_spec_validation_names_the_field():
    with pytest.raises(ValidationError, match="n_classes: task 'regression' has one output"):
        ModelSpec(name="mlp", task="regression", n_features=3, n_classes=2)
    with pytest.raises(ValidationError, match="n_classes: required"):
        ModelSpec(name="mlp", n_features=3)
    with pytest.raises(ValidationError, match="task"):
        ModelSpec(name="mlp", task="ranking", n_features=3, n_classes=2)
    model = build_model(SPEC, seed=0)
    assert model.net[-1].out_features == 1


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_regression_secagg_equals_plain_quantised(strategy):
    shards, test = diabetes_shards()
    runs = {}
    for kind in ("secagg", "plain_quantised", "plain"):
        server, clients, errors = run_fl(shards, test, SPEC, strategy, kind, rounds=2, seed=4, local=LOCAL,
                                         agg_kw={"clip": 4.0})
        assert not errors, errors
        runs[kind] = (server, clients)
    (sec, sec_clients), (pq, _), (plain, _) = runs["secagg"], runs["plain_quantised"], runs["plain"]
    assert np.array_equal(sec.global_vec, pq.global_vec)
    assert not np.array_equal(sec.global_vec, plain.global_vec)  # quantisation happened ...
    np.testing.assert_allclose(sec.global_vec, plain.global_vec, atol=2e-3)  # ... and is small
    for rec in sec.history:
        assert rec.aggregation["model"]["n_clipped"] == 0
        assert rec.survivors == ["c0", "c1", "c2"]
    # the pooled metrics from the clients' sums equal scikit-learn's on every client's test rows
    model = build_model(SPEC)
    set_flat(model, sec.global_vec)
    pred = predict(model, test[0])
    assert pred.dtype == np.float64 and pred.shape == (len(test[1]),)
    y = np.concatenate([test[1]] * 3)
    p = np.concatenate([pred] * 3)
    tm = sec.history[-1].test_metrics
    assert tm["n"] == len(y)
    assert tm["rmse"] == pytest.approx(np.sqrt(mean_squared_error(y, p)), rel=1e-9)
    assert tm["mae"] == pytest.approx(mean_absolute_error(y, p), rel=1e-9)
    assert tm["r2"] == pytest.approx(r2_score(y, p), rel=1e-9)
    assert sec_clients[0].history[-1]["test_mse"] == pytest.approx(mean_squared_error(test[1], pred), rel=1e-5)


@pytest.mark.parametrize("change", [
    {"test_abs_sum": None},                        # a regression key missing
    {"test_y2_sum": float("inf")},                 # not finite
    {"test_abs_sum": -1.0},                        # a sum of absolute values below 0
    {"test_correct": 3.0},                         # a regression head has no correct count
])
def test_server_rejects_bad_regression_metrics(change):
    """A client's fl.metrics that do not fit a regression head are rejected (logged; the client counts as
    silent and is marked dead), an honest client's are taken and pooled."""
    from secureflhv.horizontal.fl import TAG_METRICS, FLConfig, HorizontalServer, pooled_regression
    from secureflhv.horizontal.strategies import make_strategy
    from secureflhv.proto import messages_pb2
    from secureflhv.transport.inprocess import InProcessNetwork

    net = InProcessNetwork("fl-metrics", ["server", "c0", "c1"], deadline=5)
    server = HorizontalServer(net.transport("server"), ["c0", "c1"], SPEC, make_strategy("fedavg"),
                              FLConfig(rounds=1, round_timeout_s=1.0))
    honest = {"trained": 0.0, "test_correct": 0.0, "test_n": 4.0, "test_loss_sum": 8.0, "test_abs_sum": 4.0,
              "test_y_sum": 600.0, "test_y2_sum": 90008.0}
    bad = {k: v for k, v in {**honest, **change}.items() if v is not None}
    net.transport("c0").send("server", TAG_METRICS, messages_pb2.Scalars(values=bad), round=1)
    net.transport("c1").send("server", TAG_METRICS, messages_pb2.Scalars(values=honest), round=1)
    got = server._collect_metrics(1, ["c0", "c1"])
    assert set(got) == {"c1"} and got["c1"] == honest and server.dead == {"c0"}
    pooled = pooled_regression([honest, {**honest, "test_y_sum": 400.0, "test_y2_sum": 40008.0}])
    assert pooled["n"] == 8 and pooled["rmse"] == pytest.approx(np.sqrt(16 / 8)) and pooled["mae"] == 1.0
    assert pooled["r2"] == pytest.approx(1 - 16 / (130016 - 1000 ** 2 / 8))
