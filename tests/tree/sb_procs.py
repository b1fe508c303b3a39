"""Party processes of the SecureBoost gRPC integration test (spawned: module-level entry points)."""
from __future__ import annotations

import traceback

import numpy as np

HOSTS = ["host-1", "host-2"]
CLIENTS = ["client-1", "client-2", "client-3"]


def breast_cancer():
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer(return_X_y=True)


def columns() -> list[list[int]]:
    """The vertical run's columns: the library's ``overlap`` feature split of breast cancer (guest, 2 hosts;
    20% of the columns held by every party)."""
    from secureflhv.data import vertical_split

    X, _ = breast_cancer()
    vp = vertical_split(X, len(HOSTS), "overlap", seed=3, shared_fraction=0.2)
    return [[int(c) for c in cc] for cc in vp.columns]


def vparams():
    from secureflhv.tree.params import SecureBoostParams

    return SecureBoostParams(n_trees=3, max_depth=3, max_bin=16, key_bits=512, insecure_test_key=True)


def hparams():
    from secureflhv.tree.params import SecureBoostParams

    return SecureBoostParams(n_trees=3, max_depth=3, max_bin=16, sketch_bins=256)


def _transport(pid, addresses, cert_dir, deadline=120):
    from secureflhv.transport.certs import load_party_credentials
    from secureflhv.transport.grpc_transport import GrpcTransport

    return GrpcTransport(pid, "sb-grpc", addresses[pid], addresses, tls=load_party_credentials(cert_dir, pid),
                         deadline=deadline)


def vertical_party(pid: str, addresses: dict, cert_dir: str, queue) -> None:
    from secureflhv.crypto.homomorphic import paillier as pl
    from secureflhv.tree.model import model_to_dict
    from secureflhv.tree.vertical import SecureBoostGuest, SecureBoostHost

    pl.set_workers(1)
    t = None
    try:
        X, y = breast_cancer()
        t = _transport(pid, addresses, cert_dir)
        if pid == "guest":
            cols = columns()
            g = SecureBoostGuest(t, HOSTS, X[:, cols[0]], y, vparams())
            res = g.fit()
            margin = g.predict_margin(X[:, cols[0]])
            g.end_prediction()
            queue.put((pid, (margin.tolist(), model_to_dict(res.model))))
        else:
            cols = columns()[HOSTS.index(pid) + 1]
            h = SecureBoostHost(t, "guest", X[:, cols], vparams())
            h.fit()
            h.serve_predictions(X[:, cols])
            queue.put((pid, [list(r) for r in h.records]))
    except BaseException:  # noqa: BLE001 - reported to the test
        queue.put((pid, "ERROR " + traceback.format_exc()))
    finally:
        if t is not None:
            t.close()


# library partitions of the horizontal runs: label skew with feature noise, and quantity skew for the dropout
SCHEMES = {"label_dirichlet+feature_noise": {"beta": 0.5, "sigma": 0.3}, "quantity_dirichlet": {"beta": 1.0}}


def shards(scheme: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Breast cancer partitioned over the 3 clients by ``scheme`` (seed 1): [(X_i, y_i)] in CLIENTS order."""
    from secureflhv.data import Dataset, partition

    X, y = breast_cancer()
    ds = Dataset(X, y)
    part = partition(scheme, ds, len(CLIENTS), seed=1, **SCHEMES[scheme])
    return [(s.X, s.y) for s in (part.party_data(ds, i) for i in range(len(CLIENTS)))]


def horizontal_party(pid: str, addresses: dict, cert_dir: str, queue, kill_at_tree: dict | None = None,
                     scheme: str = "label_dirichlet+feature_noise") -> None:
    """One party of the horizontal run on the :func:`shards` of ``scheme``; ``kill_at_tree``: client -> tree at
    whose first histogram submission that client SIGKILLs itself (a real process death: no message, no
    clean-up)."""
    from secureflhv.tree.horizontal import (HorizontalSecureBoostClient, HorizontalSecureBoostServer,
                                            tree_aggregation_config)
    from secureflhv.tree.model import model_to_dict

    t = None
    try:
        parts = shards(scheme)
        X = np.concatenate([p[0] for p in parts])    # predictions: of the pooled rows
        # With a death the server must give up on the dead client quickly: its transport deadline (a send to
        # the dead client fails after it) plus one input deadline (the dead client's missing key advertisement)
        # is 10 + 4 = 14 s, well inside the survivors' patience for the server: their secagg wait
        # (client_timeout_s = input + 5 * stage = 24 s) and their transport deadline (45 s). With 15 + 3 s
        # against 18 s a survivor gave up first on a loaded CI machine.
        # With a death 2 of 3 clients finish: t = 2 and two-client rounds, the explicit opt-in (no colluder
        # tolerated; each survivor learns the other's histograms)
        short = {} if kill_at_tree is None else {"stage_timeout_s": 4.0, "input_timeout_s": 4.0, "max_colluders": 0,
                                                 "min_clients": 2}
        cfg = tree_aggregation_config("secagg", **short)
        t = _transport(pid, addresses, cert_dir, 120 if kill_at_tree is None else 10 if pid == "server" else 45)
        if pid == "server":
            model = HorizontalSecureBoostServer(t, CLIENTS, hparams(), aggregation=cfg).fit()
            queue.put((pid, (model.predict(X).tolist(), model_to_dict(model))))
        else:
            Xi, yi = parts[CLIENTS.index(pid)]
            client = HorizontalSecureBoostClient(t, "server", CLIENTS, Xi, yi, hparams(), aggregation=cfg)
            if kill_at_tree and pid in kill_at_tree:
                _kill_self_at(client, kill_at_tree[pid])
            queue.put((pid, client.fit().predict(X).tolist()))
    except BaseException:  # noqa: BLE001
        queue.put((pid, "ERROR " + traceback.format_exc()))
    finally:
        if t is not None:
            t.close()


def _kill_self_at(client, tree: int) -> None:
    import os
    import signal

    grow, submit = client.grow_tree, client._submit
    at = {}

    def grow_tree(seq, *args):
        at["tree"] = seq
        return grow(seq, *args)

    def submit_or_die(vector):
        if at.get("tree") == tree:
            os.kill(os.getpid(), signal.SIGKILL)
        return submit(vector)

    client.grow_tree, client._submit = grow_tree, submit_or_die


def horizontal_dropout_party(pid: str, addresses: dict, cert_dir: str, queue) -> None:
    """:func:`horizontal_party` on quantity-skewed shards where client-2 is killed (SIGKILL) at tree 1."""
    horizontal_party(pid, addresses, cert_dir, queue, kill_at_tree={"client-2": 1}, scheme="quantity_dirichlet")
