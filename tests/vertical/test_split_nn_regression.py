"""Split NN regression (one output, MSE of the standardised target): federated training steps equal the
independent centralised torch twin's (:mod:`snn_twin`: same initialisation and seed) to 1e-6, predictions come
back in the target's units, and the job over real guest and host processes (gRPC, mutual TLS) on
scikit-learn's diabetes set, with columns held by both parties, equals the twin on the joined table."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from pydantic import ValidationError
from sklearn.metrics import r2_score

from secureflhv.data import load_dataset
from secureflhv.vertical.split_nn import SplitNNConfig
from snn_harness import make_roles, run_roles
from snn_twin import roles_state, seeded_twin

KEY = {"key_bits": 512, "insecure_test_key": True}
SMALL = dict(KEY, host_bottom=[5, 3], guest_bottom=[4], interactive_units=3, top_hidden=[4], task="regression")


def diabetes(n):
    ds = load_dataset("diabetes")
    X = ds.X * np.sqrt(len(ds.X))  # unit-norm columns back to unit variance
    return X[:n], ds.y[:n]


def test_regression_config_names_the_field():
    with pytest.raises(ValidationError, match="n_classes: task 'regression' has one output"):
        SplitNNConfig(**SMALL, n_classes=3)
    with pytest.raises(ValidationError, match="task"):
        SplitNNConfig(**{**SMALL, "task": "ordinal"})


@pytest.mark.parametrize("optimizer,n_hosts", [("sgd", 1), ("adam", 2)])
def test_regression_steps_equal_centralised_torch(optimizer, n_hosts):
    X, y = diabetes(24)
    cols = np.array_split(np.arange(10), n_hosts + 1)
    Xg, Xhs = X[:, cols[0]], [X[:, c] for c in cols[1:]]
    cfg = SplitNNConfig(**SMALL, epochs=1, batch_size=12, optimizer=optimizer, learning_rate=0.05,
                        interactive_lr=0.1, weight_noise=3.0, seed=5, init_seed=2)
    net, guest, hosts = make_roles(Xg, y, Xhs, cfg)
    assert guest.n_classes is None and guest.top[-1].out_features == 1
    assert guest.target == pytest.approx((y.mean(), y.std()))
    twin = seeded_twin(cfg, guest, hosts, Xg, Xhs, y)
    results, errors = run_roles(guest, hosts, predict_sets=(Xg, Xhs))
    assert not errors, errors
    ref_losses = twin.fit(Xg, Xhs, y)
    assert len(ref_losses) == 2 and ref_losses[0] > 0
    np.testing.assert_allclose(results["guest"].batch_losses, ref_losses, rtol=1e-6, atol=1e-9)
    fed, ref = roles_state(guest, hosts), twin.state()
    for k in ref:
        np.testing.assert_allclose(fed[k], ref[k], rtol=1e-6, atol=1e-8, err_msg=k)
    pred = results["proba"]
    assert pred.shape == (24,)
    np.testing.assert_allclose(pred, twin.predict(Xg, Xhs), rtol=1e-6)
    assert 50 < pred.mean() < 250  # in the target's units, not standardised
    # the saved state carries the target's scale: roles rebuilt from it (a prediction job) predict the same values
    arrays = guest.state_arrays()
    np.testing.assert_allclose(arrays["target"], [y.mean(), y.std()])
    if n_hosts == 1:
        assert _predict_from_state(guest, hosts, Xg, Xhs, cfg) == pytest.approx(pred, rel=1e-9)


def _predict_from_state(guest, hosts, Xg, Xhs, cfg):
    import threading

    from secureflhv.transport import InProcessNetwork
    from secureflhv.vertical.split_nn import SplitNNGuest, SplitNNHost

    ids = [h.party_id for h in hosts]
    net = InProcessNetwork("snn-predict", ["guest"] + ids, deadline=60)
    g2 = SplitNNGuest.from_state(net.transport("guest"), ids, Xg, None, cfg, guest.state_arrays())
    assert g2.target == guest.target
    h2 = [SplitNNHost.from_state(net.transport(h.party_id), "guest", ids, X, cfg, h.state_arrays())
          for h, X in zip(hosts, Xhs)]
    errors = []

    def serve(h, X):
        try:
            h.start_prediction()
            h.serve_predictions(X)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(h, X), daemon=True) for h, X in zip(h2, Xhs)]
    for t in threads:
        t.start()
    g2.start_prediction()
    out = g2.predict_proba(Xg)
    g2.end_prediction()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


@pytest.mark.slow
def test_regression_job_processes_with_overlapping_columns_equals_the_twin(tmp_path):
    """Guest and host processes (gRPC, mutual TLS) on diabetes, a third of the columns held by both parties under
    the same names (each party's columns are its own: a shared column is two inputs, one per bottom model), the
    host holding 90% of the ids (PSI aligns them). The model and the held-out values equal the torch twin's on
    the joined table. Plain SGD: tolerance ``snn_twin.SGD_TOL`` (128 quantisation steps of the interactive
    layer's encoding), on values in the target's units times its standard deviation (the top model
    predicts the standardised target); measured 6e-10 on a parameter, 3.4e-10 std on a value."""
    import pandas as pd

    import secureflhv
    from secureflhv.data import vertical_split, write_vertical_csvs
    from secureflhv.runtime.job.demo import write_vertical_nn_job
    from secureflhv.runtime.store.model_bundle import read_bundle
    from snn_twin import SGD_TOL as TOL, federated_state, job_twin

    params = {"task": "regression", "epochs": 4, "batch_size": 128, "host_bottom": [8, 4], "guest_bottom": [8],
              "interactive_units": 4, "key_bits": 512, "optimizer": "sgd", "learning_rate": 0.1,
              "interactive_lr": 0.2, "test_fraction": 0.25, "split_seed": 3, "seed": 1}
    ds = load_dataset("diabetes")
    vp = vertical_split(ds, 1, "overlap", seed=2, shared_fraction=0.3, sample_overlap=0.9)
    csv = write_vertical_csvs(ds, vp, tmp_path / "data", label_column="label")
    shared = set(vp.column_names[0]) & set(vp.column_names[1])
    assert len(shared) == 3  # the same names at both parties
    job = write_vertical_nn_job(tmp_path, csv["guest"], [csv["host_1"]], params, deadline_s=120,
                                insecure_test_keys=True)
    proc = subprocess.run([sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", "240"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = job.parent / "out"
    test = json.loads((out / "guest" / "metrics.json").read_text())["metrics"]["test"]
    pred = pd.read_csv(out / "guest" / "predictions.csv", dtype={"id": str})
    assert test["n"] == len(pred) > 80
    assert test["r2"] == pytest.approx(r2_score(pred["label"], pred["value"]), rel=1e-9)

    twin, held_out, host_ids = job_twin(job, params, SplitNNConfig)
    ca = job.parent / "certs" / "ca.pem"
    bundles = [read_bundle(out / pid, ca=ca) for pid in ["guest", *host_ids]]
    for b, names in zip(bundles, vp.column_names):
        assert b.feature_names == names  # each party's own columns, shared names included
    fed = federated_state(bundles[0].file("state.safetensors"), [b.file("state.safetensors") for b in bundles[1:]],
                          host_ids)
    ref = twin.state()
    assert fed.keys() == ref.keys()
    v_twin = twin.predict(held_out["Xg"], held_out["Xhs"])
    print(f"federated - twin: parameters {max(float(np.max(np.abs(fed[k] - ref[k]))) for k in ref):.3g}, "
          f"values {np.max(np.abs(pred['value'] - v_twin)):.3g} (target std {twin.target[1]:.3g})")
    for k in ref:
        np.testing.assert_allclose(fed[k], ref[k], rtol=0, atol=TOL, err_msg=k)
    assert pred["id"].tolist() == held_out["ids"]
    np.testing.assert_allclose(pred["value"], v_twin, rtol=0, atol=TOL * twin.target[1])
    assert r2_score(held_out["y"], v_twin) > 0.2  # the twin learns too: predicting the mean scores 0
    assert (out / "guest" / "predicted_vs_true.png").stat().st_size > 1000
    model = secureflhv.load_model(out / "guest", ca=ca)
    assert model.task == "regression" and model.bundle.extra["n_classes"] is None
