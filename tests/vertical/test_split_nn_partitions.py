"""Split NN under every vertical partition of the library (``vertical_split``: even, random, explicit, overlap,
and hosts holding a sample of the ids, aligned by PSI), compared with an independent centralised torch twin
(:mod:`snn_twin`) trained on the joined table: same initial weights (the documented seeding rule, checked
here bit for bit against the parties' initial state), same rows, batches and order. The federated model and
its held-out predictions must equal the twin's up to the fixed-point encoding of the Paillier-protected
interactive layer: ``snn_twin.SGD_TOL``, 128 quantisation steps (its comment gives the error budget).

Plain SGD here (the optimiser's equality with Adam is in test_split_nn.py): Adam divides by the root of the
gradient's running square, so a gradient entry near zero can turn a 1e-10 encoding error into a 1e-6 step
difference; SGD passes encoding errors on linearly, which is what lets the tolerance be a small multiple of
the quantisation step.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from secureflhv.data import load_sklearn, vertical_split
from secureflhv.transport import InProcessNetwork
from secureflhv.vertical.psi import align_ids_guest, align_ids_host
from secureflhv.vertical.split_nn import SplitNNConfig, SplitNNGuest, SplitNNHost
from snn_twin import Q, SGD_TOL as TOL, SplitNNTwin, federated_state

CFG = dict(key_bits=512, insecure_test_key=True, host_bottom=[6, 3], guest_bottom=[6, 3], interactive_units=3,
           epochs=2, batch_size=32, optimizer="sgd", learning_rate=0.3,
           interactive_lr=0.3, seed=4, init_seed=1)

SCENARIOS = {
    "even": dict(n_hosts=1, scheme="even"),
    "random-2hosts": dict(n_hosts=2, scheme="random"),
    "explicit": dict(n_hosts=1, scheme="explicit", columns=[list(range(0, 30, 3)), [c for c in range(30) if c % 3]]),
    "overlap": dict(n_hosts=1, scheme="overlap", shared_fraction=0.2),
    "sample-overlap-psi": dict(n_hosts=1, scheme="random", sample_overlap=0.8),
}


def _split(n: int):
    """The test's train / held-out rows of the aligned table (the same at every party: agreed order)."""
    perm = np.random.default_rng(11).permutation(n)
    return np.sort(perm[n // 4:]), np.sort(perm[: n // 4])


def _standardise(X, train):
    mu, sd = X[train].mean(0), X[train].std(0) + 1e-12
    return (X - mu) / sd


def _federated(ds, vp, cfg):
    """PSI, split and split-NN training at every party in threads over one in-process network; every party's
    arrays before and after training."""
    H = len(vp.parties) - 1
    host_ids = [f"host-{i}" for i in range(1, H + 1)]
    net = InProcessNetwork("snn-part", ["guest"] + host_ids, deadline=60)
    out, errors = {}, {}

    def run(i, pid):
        try:
            data = vp.party_data(ds, i)
            t = net.transport(pid)
            psi = (align_ids_guest(t, list(data.ids), host_ids, workers=1) if pid == "guest"
                   else align_ids_host(t, list(data.ids), "guest", workers=1))
            train, test = _split(len(psi))
            X = _standardise(data.X[psi.rows], train)
            if pid == "guest":
                role = SplitNNGuest(t, host_ids, X[train], data.y[psi.rows][train], cfg)
            else:
                role = SplitNNHost(t, "guest", host_ids, X[train], cfg)
            out[pid] = dict(ids=list(psi.ids), init={k: np.array(v) for k, v in role.state_arrays().items()})
            role.fit()
            if pid == "guest":
                out["proba"] = role.predict_proba(X, rows=test)
                role.end_prediction()
            else:
                role.serve_predictions(X)
            out[pid]["final"] = role.state_arrays()
        except BaseException as exc:  # noqa: BLE001
            errors[pid] = exc

    threads = [threading.Thread(target=run, args=(i, pid), daemon=True)
               for i, pid in enumerate(["guest"] + host_ids)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(240)
    assert not errors, errors
    return out, host_ids


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_vertical_partition_equals_the_torch_twin(name):
    ds = load_sklearn("breast_cancer")
    vp = vertical_split(ds, seed=3, **SCENARIOS[name])
    cfg = SplitNNConfig(**CFG)
    assert 2.0 ** -cfg.dot_precision_bits == Q  # the step the tolerance counts in
    out, host_ids = _federated(ds, vp, cfg)
    ids = out["guest"]["ids"]
    assert all(out[h]["ids"] == ids for h in host_ids)  # PSI: one agreed row order...
    assert set(ids) == set.intersection(*(set(i.tolist()) for i in vp.ids))  # ...of exactly the common ids

    # the twin: the joined table's rows in that order, each party's columns (a shared column twice), own split
    row_of = dict(zip(vp.ids[0].tolist(), vp.rows[0].tolist()))
    rows = np.array([row_of[i] for i in ids])
    train, test = _split(len(rows))
    blocks = [_standardise(ds.X[rows][:, cols], train) for cols in vp.columns]
    y = ds.y[rows]
    twin = SplitNNTwin(cfg, blocks[0].shape[1], [b.shape[1] for b in blocks[1:]], y[train])
    init = federated_state(out["guest"]["init"], [out[h]["init"] for h in host_ids], host_ids)
    start = twin.state()
    assert init.keys() == start.keys()
    for k in start:  # the documented seeding rule gives the parties' initial weights, bit for bit
        np.testing.assert_array_equal(init[k], start[k], err_msg=k)
    twin.fit(blocks[0][train], [b[train] for b in blocks[1:]], y[train])

    fed = federated_state(out["guest"]["final"], [out[h]["final"] for h in host_ids], host_ids)
    ref = twin.state()
    p_twin = twin.predict(blocks[0][test], [b[test] for b in blocks[1:]])
    moved = max(np.max(np.abs(ref[k] - start[k])) for k in ref)
    worst = max(np.max(np.abs(fed[k] - ref[k])) for k in ref)
    print(f"{name}: parameters moved up to {moved:.3g}; federated - twin: parameters {worst:.3g}, "
          f"held-out probabilities {np.max(np.abs(out['proba'] - p_twin)):.3g} (TOL {TOL:.3g})")
    assert moved > 0.3  # training really changed the model
    for k in ref:
        np.testing.assert_allclose(fed[k], ref[k], rtol=0, atol=TOL, err_msg=k)
    np.testing.assert_allclose(out["proba"], p_twin, rtol=0, atol=TOL)
    assert roc_auc_score(y[test], p_twin) > 0.9  # and the configuration learns (the twin's own held-out AUC)
