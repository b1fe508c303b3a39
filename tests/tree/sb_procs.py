"""Party processes of the SecureBoost gRPC integration test (spawned: module-level entry points)."""
from __future__ import annotations

import traceback

import numpy as np

COLS = [list(range(0, 10)), list(range(10, 20)), list(range(20, 30))]
HOSTS = ["host-1", "host-2"]
CLIENTS = ["client-1", "client-2", "client-3"]


def breast_cancer():
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer(return_X_y=True)


def vparams():
    from secureflhv.tree.params import SecureBoostParams

    return SecureBoostParams(n_trees=3, max_depth=3, max_bin=16, key_bits=512, insecure_test_key=True)


def hparams():
    from secureflhv.tree.params import SecureBoostParams

    return SecureBoostParams(n_trees=3, max_depth=3, max_bin=16, sketch_bins=256)


def _transport(pid, addresses, cert_dir):
    from secureflhv.transport.certs import load_party_credentials
    from secureflhv.transport.grpc_transport import GrpcTransport

    return GrpcTransport(pid, "sb-grpc", addresses[pid], addresses, tls=load_party_credentials(cert_dir, pid),
                         deadline=120)


def vertical_party(pid: str, addresses: dict, cert_dir: str, queue) -> None:
    from secureflhv.crypto import paillier as pl
    from secureflhv.tree.vertical import SecureBoostGuest, SecureBoostHost

    pl.set_workers(1)
    t = None
    try:
        X, y = breast_cancer()
        t = _transport(pid, addresses, cert_dir)
        if pid == "guest":
            g = SecureBoostGuest(t, HOSTS, X[:, COLS[0]], y, vparams())
            g.fit()
            margin = g.predict_margin(X[:, COLS[0]])
            g.end_prediction()
            queue.put((pid, margin.tolist()))
        else:
            cols = COLS[HOSTS.index(pid) + 1]
            h = SecureBoostHost(t, "guest", X[:, cols], vparams())
            h.fit()
            h.serve_predictions(X[:, cols])
            queue.put((pid, len(h.records)))
    except BaseException:  # noqa: BLE001 - reported to the test
        queue.put((pid, "ERROR " + traceback.format_exc()))
    finally:
        if t is not None:
            t.close()


def horizontal_party(pid: str, addresses: dict, cert_dir: str, queue) -> None:
    from secureflhv.tree.horizontal import (HorizontalSecureBoostClient, HorizontalSecureBoostServer,
                                             tree_aggregation_config)

    t = None
    try:
        X, y = breast_cancer()
        cfg = tree_aggregation_config("secagg")
        t = _transport(pid, addresses, cert_dir)
        if pid == "server":
            model = HorizontalSecureBoostServer(t, CLIENTS, hparams(), aggregation=cfg).fit()
            queue.put((pid, (model.predict(X).tolist(), [c.tolist() for c in model.cuts],
                             model.base_margin.tolist())))
        else:
            rows = np.array_split(np.arange(len(y)), 3)[CLIENTS.index(pid)]
            model = HorizontalSecureBoostClient(t, "server", CLIENTS, X[rows], y[rows], hparams(),
                                                aggregation=cfg).fit()
            queue.put((pid, model.predict(X).tolist()))
    except BaseException:  # noqa: BLE001
        queue.put((pid, "ERROR " + traceback.format_exc()))
    finally:
        if t is not None:
            t.close()
