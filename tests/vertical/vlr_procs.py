"""A guest that isolates one host's encrypted partial scores (issue 36), the exact expected scores, and the
party processes of the gRPC + mutual-TLS prediction test (spawned: module-level entry points)."""
from __future__ import annotations

import math
import traceback

import numpy as np

from secureflhv.proto import messages_pb2
from secureflhv.vertical.lr import VerticalLRArbiter, VerticalLRConfig, VerticalLRGuest, VerticalLRHost
from secureflhv.vertical.lr_scores import TAG_PRED_DEC, TAG_PRED_ENC, TAG_PRED_TOTAL

HOSTS = ["host-1", "host-2"]
ROWS, BATCH = 24, 8


class IsolatingGuest(VerticalLRGuest):
    """Follows the protocol, except that while ``attack`` is set it asks the arbiter to decrypt only
    ``target``'s encrypted partial scores of each request (the request has the honest shape, so the
    arbiter cannot tell); ``leaked`` collects what came back."""

    attack = False
    target = HOSTS[0]

    def _encrypted_total(self, own, rnd):
        if not self.attack:
            return super()._encrypted_total(own, rnd)
        pub, k, e = self._score_key(), own.shape[0], self._exponent()
        parts = {h: self.t.recv(h, TAG_PRED_ENC, round=rnd, parse=self._enc_parser(pub, (k,), h, e))
                 for h in self.host_ids}
        masked, mask = self.he.mask(pub, parts[self.target])
        msg = messages_pb2.Bundle()
        msg.encrypted["s"].CopyFrom(self.wire.to_proto(masked))
        self.t.send(self.arbiter_id, TAG_PRED_DEC, msg, round=rnd)
        out = self._take_decrypted(pub, mask, self.arbiter_id, TAG_PRED_TOTAL, rnd, (k,))
        self.leaked = getattr(self, "leaked", []) + [out.copy()]
        return out


def model(seed: int = 4):
    """Regression model (identity link: the guest's outputs are the raw total scores) and its data."""
    rng = np.random.default_rng(seed)
    X = {p: rng.normal(size=(ROWS, 3)) for p in ["guest"] + HOSTS}
    w = {p: rng.normal(size=3) for p in X}
    cfg = VerticalLRConfig(task="regression", key_bits=512, insecure_test_key=True, batch_size=BATCH)
    return X, w, 0.25, cfg


def exact_scores(X, w, b, precision_bits: int = 40) -> np.ndarray:
    """What the protocol decrypts: the sum of every part rounded to ``precision_bits`` fraction bits
    (integer mantissas, so exactly), as float64."""
    own = X["guest"] @ w["guest"] + b
    total = [int(v) for v in np.rint(np.ldexp(own, precision_bits))]
    for h in HOSTS:
        total = [a + int(v) for a, v in zip(total, np.rint(np.ldexp(X[h] @ w[h], precision_bits)))]
    return np.array([math.ldexp(v, -precision_bits) for v in total])


def prediction_party(pid: str, addresses: dict, cert_dir: str, queue) -> None:
    """Guest: an honest prediction of every row, then the isolating attack on every row; hosts and
    arbiter serve."""
    from secureflhv.crypto.homomorphic import paillier as pl
    from secureflhv.transport.certs import load_party_credentials
    from secureflhv.transport.grpc_transport import GrpcTransport

    pl.set_workers(1)
    t = None
    try:
        t = GrpcTransport(pid, "vlr-masks-grpc", addresses[pid], addresses,
                          tls=load_party_credentials(cert_dir, pid), deadline=60)
        X, w, b, cfg = model()
        if pid == "server":
            queue.put((pid, VerticalLRArbiter(t, "guest", HOSTS, cfg).serve_predictions()))
        elif pid in HOSTS:
            queue.put((pid, VerticalLRHost.from_model(t, "guest", HOSTS, w[pid], cfg, "server")
                       .serve_predictions(X[pid])))
        else:
            g = IsolatingGuest.from_model(t, HOSTS, w["guest"], b, cfg, "server")
            honest = g.predict_proba(X["guest"])
            g.attack = True
            g.predict_proba(X["guest"])
            g.end_prediction()
            queue.put((pid, (honest.tolist(), np.concatenate(g.leaked).tolist())))
    except BaseException:  # noqa: BLE001 - reported to the test
        queue.put((pid, "ERROR " + traceback.format_exc()))
    finally:
        if t is not None:
            t.close()
