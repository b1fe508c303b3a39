"""The guest's service ends its role's prediction (split NN, LR: a message to every host and the arbiter)
BEFORE it sends the hosts "stop": a host leaves at "stop" and closes its transport, so a message to it after
that was retried until the deadline (found by benchmarks/serving.py: SIGTERM took --deadline seconds)."""
from __future__ import annotations

from types import SimpleNamespace as NS
from unittest import mock

import numpy as np

from secureflhv.runtime.serve import federation as fed
from secureflhv.runtime.serve.feature_store import MemoryFeatureStore
from secureflhv.transport import InProcessNetwork


def test_the_roles_end_of_prediction_reaches_the_host_before_its_stop():
    import threading

    net = InProcessNetwork("serve-close", ["guest", "host-1"], deadline=10)
    events: list[str] = []
    host_done = threading.Event()

    class Scoring:
        bundle, role = NS(algorithm="vertical_nn"), None

        def __init__(self, t=None):
            self.t = t

        def score(self, X):
            return np.asarray(X).sum(axis=1)

        def answer(self, X):
            return 0

        def close(self):  # as PredictionGuest.end_prediction: a message to every host
            self.t.send("host-1", "pred.req", fed._ctl("end"), round=1)

    guest, host = NS(id="guest", role="guest"), NS(id="host-1", role="host")
    cfg = NS(guest=guest, hosts=[host])
    store = MemoryFeatureStore(["a1"], np.array([[1.0, 2.0]]), ["x", "y"])
    load = lambda model_dir: NS(algorithm="vertical_nn", model_dir=model_dir)  # noqa: E731
    gt, ht = net.transport("guest"), net.transport("host-1")
    send = gt.send

    def recorded(receiver, tag, msg, round=0, timeout=None):
        events.append(f"{tag} {msg.text.get('op', '')}".strip() + (" (host gone)" if host_done.is_set() else ""))
        return send(receiver, tag, msg, round=round, timeout=timeout)
    gt.send = recorded

    def host_loop():
        loop = fed.HostLoop(ht, cfg, host, load, lambda cols: store, "v1", 8)
        loop.run()
        events.append("host left")
        host_done.set()

    with mock.patch.object(fed, "build_scoring", lambda cfg_, party, t, *a, **k: Scoring(t)), \
            mock.patch.object(fed, "fingerprint", lambda b: "fp"), \
            mock.patch.object(fed, "input_columns", lambda b: ["x", "y"]):
        th = threading.Thread(target=host_loop, daemon=True)
        th.start()
        f = fed.GuestFederation(gt, cfg, guest, load, "v1", max_rows=8)
        scores, missing = f.score(["a1"], np.array([[1.0, 1.0]]))
        f.close()
        th.join(10)
    assert scores.tolist() == [2.0] and missing == {}
    assert events[-3:] == ["pred.req end", "serve.ctl stop", "host left"], events
