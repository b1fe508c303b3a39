"""SecureBoost on breast cancer, both layouts, in one process (parties as threads, in-process transport).

1. Vertical: a guest (labels + 10 columns) and two hosts (10 columns each), 2048-bit Paillier;
   federated prediction of the held-out rows; test AUC.
2. Horizontal: a server and three clients (label-skewed rows), histograms summed by secure
   aggregation; the model is exported to XGBoost JSON and served by ``xgboost.Booster``.

For real deployments run each party in its own process with ``secureflhv party`` (gRPC + mutual TLS);
see ``secureflhv/runtime/secureboost_job.py``.

    .venv/bin/python examples/secureboost.py [--out DIR]     # default DIR: runs/secureboost_demo
"""
from __future__ import annotations

import argparse
import threading
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split

from _common import ROOT
from secureflhv.data import partition
from secureflhv.transport import InProcessNetwork
from secureflhv.tree.horizontal import HorizontalSecureBoostClient, HorizontalSecureBoostServer, tree_aggregation_config
from secureflhv.tree.params import SecureBoostParams, transform
from secureflhv.tree.vertical import SecureBoostGuest, SecureBoostHost
from secureflhv.tree.xgb_export import save_xgboost_json


def vertical(Xtr, ytr, Xte, yte, params) -> float:
    cols = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    net = InProcessNetwork("example-vertical", ["guest", "host-1", "host-2"])
    guest = SecureBoostGuest(net.transport("guest"), ["host-1", "host-2"], Xtr[:, cols[0]], ytr, params)
    hosts = [SecureBoostHost(net.transport(f"host-{i}"), "guest", Xtr[:, cols[i]], params) for i in (1, 2)]
    threads = [threading.Thread(target=lambda h=h, c=c: (h.fit(), h.serve_predictions(Xte[:, c])))
               for h, c in zip(hosts, cols[1:])]
    for t in threads:
        t.start()
    res = guest.fit()
    p = transform(guest.predict_margin(Xte[:, cols[0]]), params)
    guest.end_prediction()
    for t in threads:
        t.join()
    print(f"vertical: {len(res.model.trees)} trees, {np.mean(res.tree_seconds):.2f} s per tree; "
          f"host split tables: {[len(h.records) for h in hosts]} records")
    return roc_auc_score(yte, p)


def horizontal(Xtr, ytr, Xte, yte, params, out: Path) -> float:
    import xgboost as xgb

    part = partition("label_dirichlet", ytr, 3, seed=0, beta=0.5)
    ids = ["client-1", "client-2", "client-3"]
    net = InProcessNetwork("example-horizontal", ["server", *ids])
    cfg = tree_aggregation_config("secagg")
    server = HorizontalSecureBoostServer(net.transport("server"), ids, params, aggregation=cfg)
    clients = [HorizontalSecureBoostClient(net.transport(c), "server", ids, Xtr[part[i]], ytr[part[i]], params,
                                           aggregation=cfg) for i, c in enumerate(ids)]
    threads = [threading.Thread(target=c.fit) for c in clients]
    for t in threads:
        t.start()
    model = server.fit()
    for t in threads:
        t.join()
    path = save_xgboost_json(model, out / "secureboost_horizontal.xgboost.json")
    booster = xgb.Booster(model_file=str(path))
    p_xgb = booster.predict(xgb.DMatrix(Xte))
    print(f"horizontal: client sizes {[len(p) for p in part]}, exported to {path}; "
          f"max |xgboost - federated| = {np.max(np.abs(p_xgb - model.predict(Xte))):.2e}")
    return roc_auc_score(yte, p_xgb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "secureboost_demo",
                    help="folder for the exported XGBoost model (default: runs/secureboost_demo in the repository)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    X, y = load_breast_cancer(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    params = SecureBoostParams(n_trees=10, max_depth=4, learning_rate=0.3, max_bin=32)
    print(f"vertical test AUC {vertical(Xtr, ytr, Xte, yte, params):.4f}")
    print(f"horizontal test AUC {horizontal(Xtr, ytr, Xte, yte, params, args.out):.4f}")


if __name__ == "__main__":
    main()
