"""Split NN under every vertical partition (PSI-aligned rows), held-out quality vs the centralised model."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from secureflhv.data import load_sklearn, vertical_split
from secureflhv.transport import InProcessNetwork
from secureflhv.vertical.psi import align_ids_guest, align_ids_host
from secureflhv.vertical.split_nn import CentralisedSplitNN, SplitNNConfig, SplitNNGuest, SplitNNHost

CFG = dict(key_bits=512, insecure_test_key=True, host_bottom=[6, 3], guest_bottom=[6, 3], interactive_units=3,
           epochs=2, batch_size=96, learning_rate=0.03, interactive_lr=0.1, seed=4, init_seed=1)

SCENARIOS = {
    "even": dict(n_hosts=1, scheme="even"),
    "random-2hosts": dict(n_hosts=2, scheme="random"),
    "explicit": dict(n_hosts=1, scheme="explicit", columns=[list(range(0, 30, 3)), [c for c in range(30) if c % 3]]),
    "overlap": dict(n_hosts=1, scheme="overlap", shared_fraction=0.2),
    "sample-overlap-psi": dict(n_hosts=1, scheme="random", sample_overlap=0.8),
}


def _federated(ds, vp, cfg):
    """PSI, split and split-NN training at every party in threads over one in-process network."""
    H = len(vp.parties) - 1
    host_ids = [f"host-{i}" for i in range(1, H + 1)]
    net = InProcessNetwork("snn-part", ["guest"] + host_ids, deadline=60)
    out, errors = {}, {}

    def prepare(i, pid):
        data = vp.party_data(ds, i)
        t = net.transport(pid)
        if pid == "guest":
            psi = align_ids_guest(t, list(data.ids), host_ids, workers=1)
        else:
            psi = align_ids_host(t, list(data.ids), "guest", workers=1)
        X = data.X[psi.rows]
        perm = np.random.default_rng(11).permutation(len(psi))  # same split at every party (agreed order)
        test, train = np.sort(perm[: len(psi) // 4]), np.sort(perm[len(psi) // 4:])
        mu, sd = X[train].mean(0), X[train].std(0) + 1e-12
        X = (X - mu) / sd
        y = data.y[psi.rows] if pid == "guest" else None
        return t, psi, X, y, train, test

    def run(i, pid):
        try:
            t, psi, X, y, train, test = prepare(i, pid)
            out[pid] = dict(ids=psi.ids, X=X, y=y, train=train, test=test)
            if pid == "guest":
                g = SplitNNGuest(t, host_ids, X[train], y[train], cfg)
                g.fit()
                out["proba"] = g.predict_proba(X, rows=test)
                g.end_prediction()
            else:
                h = SplitNNHost(t, "guest", host_ids, X[train], cfg)
                h.fit()
                h.serve_predictions(X)
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
def test_every_vertical_partition_trains_like_centralised(name):
    ds = load_sklearn("breast_cancer")
    vp = vertical_split(ds, seed=3, **SCENARIOS[name])
    cfg = SplitNNConfig(**CFG)
    out, host_ids = _federated(ds, vp, cfg)
    g = out["guest"]
    assert all(out[h]["ids"] == g["ids"] for h in host_ids)  # PSI: one agreed row order
    common = set(vp.ids[0].tolist())
    for ids in vp.ids[1:]:
        common &= set(ids.tolist())
    assert set(g["ids"]) == common
    train, test, y = g["train"], g["test"], g["y"]
    central = CentralisedSplitNN.create(cfg, g["X"].shape[1], [out[h]["X"].shape[1] for h in host_ids], 2,
                                        seed=cfg.init_seed)
    central.fit(g["X"][train], [out[h]["X"][train] for h in host_ids], y[train])
    p_central = central.predict_proba(g["X"][test], [out[h]["X"][test] for h in host_ids])
    auc_fed, auc_central = roc_auc_score(y[test], out["proba"]), roc_auc_score(y[test], p_central)
    print(f"{name}: held-out AUC federated {auc_fed:.4f} centralised {auc_central:.4f} ({len(test)} rows)")
    assert auc_fed > 0.95, auc_fed
    assert abs(auc_fed - auc_central) < 0.005, (auc_fed, auc_central)
    # same initialisation, data and batches: the federated model is the centralised one
    np.testing.assert_allclose(out["proba"], p_central, atol=1e-6)
