"""Split NN regression (one output, MSE of the standardised target): federated training steps equal the
centralised torch twin's (same initialisation and seed) to 1e-6, predictions come back in the target's
units, and the job over real guest and host processes (gRPC, mutual TLS) learns scikit-learn's diabetes
set to an R² well above predicting the mean."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from pydantic import ValidationError
from sklearn.metrics import r2_score

from secureflhv.data import load_dataset
from secureflhv.vertical.split_nn import CentralisedSplitNN, SplitNNConfig
from snn_harness import make_roles, run_roles

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
    central = CentralisedSplitNN.from_roles(guest, hosts)
    results, errors = run_roles(guest, hosts, predict_sets=(Xg, Xhs))
    assert not errors, errors
    ref_losses = central.fit(Xg, Xhs, y)
    assert len(ref_losses) == 2 and ref_losses[0] > 0
    np.testing.assert_allclose(results["guest"].batch_losses, ref_losses, rtol=1e-6, atol=1e-9)
    for k, v in central.top.state_dict().items():
        np.testing.assert_allclose(guest.top.state_dict()[k].numpy(), v.numpy(), rtol=1e-6, atol=1e-8, err_msg=k)
    for i, h in enumerate(hosts):
        np.testing.assert_allclose(guest.V[h.party_id] + h.E, central.W_hosts[i].detach().numpy(), rtol=1e-6,
                                   atol=1e-8)
    pred = results["proba"]
    assert pred.shape == (24,)
    np.testing.assert_allclose(pred, central.predict_proba(Xg, Xhs), rtol=1e-6)
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
def test_regression_job_guest_and_host_processes_on_diabetes(tmp_path):
    import secureflhv
    from secureflhv.runtime.job.demo import write_vertical_nn_job

    params = {"task": "regression", "epochs": 4, "batch_size": 128, "host_bottom": [8, 4], "guest_bottom": [8],
              "interactive_units": 4, "key_bits": 512, "learning_rate": 0.05, "interactive_lr": 0.2,
              "test_fraction": 0.25, "split_seed": 3, "seed": 1}
    job = write_vertical_nn_job(tmp_path, None, None, params, dataset=load_dataset("diabetes"), n_hosts=1,
                                scheme="random", seed=2, deadline_s=120, insecure_test_keys=True)
    proc = subprocess.run([sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", "240"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = job.parent / "out" / "guest"
    test = json.loads((out / "metrics.json").read_text())["metrics"]["test"]
    pred = __import__("pandas").read_csv(out / "predictions.csv")
    assert test["n"] == len(pred) > 80
    assert test["r2"] == pytest.approx(r2_score(pred["label"], pred["value"]), rel=1e-9)
    assert test["r2"] > 0.2, test  # predicting the mean scores 0
    assert (out / "predicted_vs_true.png").stat().st_size > 1000
    model = secureflhv.load_model(out, ca=job.parent / "certs" / "ca.pem")
    assert model.task == "regression" and model.bundle.extra["n_classes"] is None
