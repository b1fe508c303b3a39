"""Test harness for the split NN: run guest and hosts in threads over InProcessNetwork."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np

from secureflhv.transport import InProcessNetwork
from secureflhv.vertical.split_nn import SplitNNGuest, SplitNNHost

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: lifecycle_helpers
from lifecycle_helpers import lifecycle_kwargs  # noqa: E402


def make_roles(Xg, y, Xhs, cfg, *, deadline=60.0, transports=None, backend=None, host_kwargs=None, guest_kwargs=None,
               callbacks=None, resume=None):
    """Build the network and the role objects (not started). ``transports``: {pid: factory(net, pid)};
    ``callbacks`` / ``resume``: {pid ("guest", "host-1", ...): callbacks list / (arrays, state)}, each
    role's lifecycle arguments at construction (:mod:`secureflhv.transport.lifecycle`; absent: none)."""
    host_ids = [f"host-{i}" for i in range(1, len(Xhs) + 1)]
    net = InProcessNetwork("snn-test", ["guest"] + host_ids, deadline=deadline)
    transports = transports or {}

    def tr(pid):
        return transports[pid](net, pid) if pid in transports else net.transport(pid)

    life = lifecycle_kwargs(callbacks, resume)
    guest = SplitNNGuest(tr("guest"), host_ids, Xg, y, cfg, backend=backend, **(guest_kwargs or {}), **life("guest"))
    hosts = [SplitNNHost(tr(h), "guest", host_ids, X, cfg, backend=backend, **(host_kwargs or {}), **life(h))
             for h, X in zip(host_ids, Xhs)]
    return net, guest, hosts


def run_roles(guest, hosts, predict_sets=None, timeout=300):
    """fit() every role in its own thread; optionally predict ``predict_sets`` = (Xg, [Xh...]).

    Returns (results {pid: FitResult | proba}, errors {pid: exception})."""
    results, errors = {}, {}

    def run_host(h, Xp):
        try:
            results[h.party_id] = h.fit()
            if Xp is not None:
                h.serve_predictions(Xp)
        except BaseException as exc:  # noqa: BLE001
            errors[h.party_id] = exc

    def run_guest():
        try:
            results["guest"] = guest.fit()
            if predict_sets is not None:
                results["proba"] = guest.predict_proba(predict_sets[0])
                guest.end_prediction()
        except BaseException as exc:  # noqa: BLE001
            errors["guest"] = exc

    threads = [threading.Thread(target=run_guest, daemon=True)]
    for i, h in enumerate(hosts):
        Xp = None if predict_sets is None else predict_sets[1][i]
        threads.append(threading.Thread(target=run_host, args=(h, Xp), daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a role hung"
    return results, errors


def toy(n=48, d=6, seed=0, classes=2):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    W = rng.normal(size=(d, classes))
    y = np.argmax(X @ W + 0.3 * rng.normal(size=(n, classes)), axis=1)
    return X, y
