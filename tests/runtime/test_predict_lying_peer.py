"""Prediction from saved models against a lying host (in-process, no keys): a malformed answer is
rejected and logged, the honest answer that follows gives the exact scores; a host that only lies
makes the guest stop at its deadline with an error naming it, never crash."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from secureflhv.proto import tree_pb2
from secureflhv.transport import TransportError
from secureflhv.transport.base import Message
from secureflhv.transport.codec import tensor_to_proto
from secureflhv.transport.inprocess import InProcessNetwork, InProcessTransport
from secureflhv.tree.model import BoostedModel, Node, Tree
from secureflhv.tree.params import SecureBoostParams
from secureflhv.tree.vertical import SecureBoostGuest, SecureBoostHost
from secureflhv.proto import messages_pb2
from secureflhv.vertical.lr import VerticalLRArbiter, VerticalLRConfig, VerticalLRGuest, VerticalLRHost


class Liar(InProcessTransport):
    """Sends ``lie(payload)`` before each message with ``tag`` and waits until it is rejected;
    ``only_lies``: the honest message never follows."""

    def __init__(self, net, pid, tag, lie, only_lies=False):
        super().__init__(net, pid)
        self.tag, self.lie, self.only_lies, self.reasons = tag, lie, only_lies, []

    def send(self, receiver, tag, payload, round=0, timeout=None):
        if tag == self.tag:
            box = self.network.mailbox(receiver)
            start = len(box.rejected)
            self.network.inject(Message(self.job_id, round, self.party_id, receiver, tag, self.lie(payload)))
            deadline = time.monotonic() + 10
            while len(box.rejected) == start and time.monotonic() < deadline:
                time.sleep(0.002)
            self.reasons += [reason for _, reason in box.rejected[start:]]
            if self.only_lies:
                return
        super().send(receiver, tag, payload, round, timeout)


def _run(host_fn, guest_fn):
    errors = {}

    def host():
        try:
            host_fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors["host"] = exc

    t = threading.Thread(target=host, daemon=True)
    t.start()
    out = guest_fn()
    t.join(20)
    return out, errors


@pytest.mark.parametrize("lie", [
    lambda p: tensor_to_proto(np.zeros(3)).SerializeToString(),                      # wrong row count
    lambda p: tensor_to_proto(np.zeros(7, dtype=np.float32)).SerializeToString(),    # wrong dtype
    lambda p: b"\x08\xff\xff",                                                       # not a Tensor
])
def test_vertical_lr_guest_rejects_a_lying_host(lie):
    rng = np.random.default_rng(0)
    Xg, Xh, wg, wh = rng.normal(size=(7, 3)), rng.normal(size=(7, 2)), rng.normal(size=3), rng.normal(size=2)
    cfg = VerticalLRConfig(mode="arbiter")
    net = InProcessNetwork("p", ["guest", "host-1"], deadline=10)
    liar = Liar(net, "host-1", "vlr.pred", lie)
    host = VerticalLRHost.from_model(liar, "guest", ["host-1"], wh, cfg)
    guest = VerticalLRGuest.from_model(net.transport("guest"), ["host-1"], wg, 0.25, cfg)

    def score():
        p = guest.predict_proba(Xg)
        guest.end_prediction()
        return p

    p, errors = _run(lambda: host.serve_predictions(Xh), score)
    assert not errors
    np.testing.assert_array_equal(p, 1.0 / (1.0 + np.exp(-(Xg @ wg + 0.25 + Xh @ wh))))
    assert liar.reasons and all("vlr.pred" in r or "invalid payload" in r for r in liar.reasons), liar.reasons


def test_vertical_lr_host_that_only_lies_is_named_at_the_deadline():
    net = InProcessNetwork("p", ["guest", "host-1"], deadline=1.5)
    liar = Liar(net, "host-1", "vlr.pred", lambda p: tensor_to_proto(np.zeros(1)).SerializeToString(),
                only_lies=True)
    host = VerticalLRHost.from_model(liar, "guest", ["host-1"], np.ones(2), VerticalLRConfig())
    guest = VerticalLRGuest.from_model(net.transport("guest"), ["host-1"], np.ones(3), None, VerticalLRConfig())

    def score():
        with pytest.raises(TransportError, match="host-1"):
            guest.predict_proba(np.ones((4, 3)))

    _run(lambda: host.serve_predictions(np.ones((4, 2)), max_requests=1), score)


def _one_split_model(prm) -> BoostedModel:
    """Root: host-1's record 0; left leaf -1, right leaf +1 (the guest knows no threshold)."""
    tree = Tree({0: Node(0, leaf=False, owner="host-1", record=0), 1: Node(1, value=-1.0), 2: Node(2, value=1.0)})
    return BoostedModel(prm, np.zeros(1), [tree])


@pytest.mark.parametrize("masks", [[b"\x00" * 9], [], [b"\x00", b"\x00"], [b"\xff\xff"]])
def test_secureboost_guest_rejects_a_lying_host(masks):
    prm = SecureBoostParams(n_trees=1, max_depth=2)
    Xh = np.array([[0.1], [0.9], [0.2], [0.7], [0.4]])
    net = InProcessNetwork("p", ["guest", "host-1"], deadline=10)
    liar = Liar(net, "host-1", "sb.routed", lambda p: tree_pb2.SbRouteReply(left_masks=masks).SerializeToString())
    host = SecureBoostHost.from_records(liar, "guest", [[0, 3, 0.5]], prm)
    guest = SecureBoostGuest.from_model(net.transport("guest"), ["host-1"], _one_split_model(prm))

    def score():
        m = guest.predict_margin(np.zeros((5, 0)))
        guest.end_prediction()
        return m

    margin, errors = _run(lambda: host.serve_predictions(Xh), score)
    assert not errors
    np.testing.assert_array_equal(margin[:, 0], np.where(Xh[:, 0] < 0.5, -1.0, 1.0))
    assert liar.reasons and all("route reply from host-1" in r for r in liar.reasons), liar.reasons


def test_secureboost_host_refuses_unknown_records_and_rows():
    """A curious guest asking about a record or rows the host does not have gets nothing."""
    prm = SecureBoostParams(n_trees=1, max_depth=2)
    net = InProcessNetwork("p", ["guest", "host-1"], deadline=10)
    host = SecureBoostHost.from_records(net.transport("host-1"), "guest", [[0, 3, 0.5]], prm)
    t = threading.Thread(target=host.serve_predictions, args=(np.ones((5, 1)),), daemon=True)
    t.start()
    query = tree_pb2.SbRouteQuery
    for bad in (tree_pb2.SbRouteRequest(dataset="predict", n_rows=5, queries=[query(record=1, rows=[0])]),  # no record
                tree_pb2.SbRouteRequest(dataset="predict", n_rows=5, queries=[query(record=0, rows=[5])]),  # no row
                tree_pb2.SbRouteRequest(dataset="train", n_rows=5)):                                        # no data
        reason = net.inject_until_rejected(Message("p", 1, "guest", "host-1", "sb.route", bad.SerializeToString()))
        assert "route request" in reason
    net.inject(Message("p", 1, "guest", "host-1", "sb.route", tree_pb2.SbRouteRequest(stop=True).SerializeToString()))
    t.join(10)
    assert not t.is_alive()


# ------------------------------------------------------------------------ vertical LR, arbiter mode
ARB = VerticalLRConfig(mode="arbiter", key_bits=512, insecure_test_key=True, batch_size=3)  # 3 rows a request
HOSTS = ["host-1", "host-2"]
# fixed-point: each of the 3 parts is rounded to 2**-40 (precision_bits 40), so the total score is off by at
# most 3 * 2**-41 and the probability by a quarter of that
SCORE_TOL = 3 * 2.0 ** -41


class Recorder(InProcessTransport):
    """Logs every message this party sends: (receiver, tag, round, payload bytes)."""

    def __init__(self, net, pid, log):
        super().__init__(net, pid)
        self.log = log

    def send(self, receiver, tag, payload, round=0, timeout=None):
        self.log.append((self.party_id, receiver, tag, round, _raw(payload)))
        super().send(receiver, tag, payload, round, timeout)


def _arbiter_roles(make, keypair, rng, m=6):
    """guest, host-1, host-2 from saved weights and the arbiter; ``make(net, pid)`` builds the transports."""
    net = InProcessNetwork("p", ["guest", *HOSTS, "server"], deadline=10)
    Xg, Xh = rng.normal(size=(m, 3)), [rng.normal(size=(m, 2)), rng.normal(size=(m, 1))]
    wg, wh = rng.normal(size=3), [rng.normal(size=2), rng.normal(size=1)]
    guest = VerticalLRGuest.from_model(make(net, "guest"), HOSTS, wg, 0.25, ARB, arbiter_id="server")
    hosts = [VerticalLRHost.from_model(make(net, h), "guest", HOSTS, w, ARB, arbiter_id="server")
             for h, w in zip(HOSTS, wh)]
    arbiter = VerticalLRArbiter(make(net, "server"), "guest", HOSTS, ARB, keypair=keypair)
    plain = Xg @ wg + 0.25 + sum(X @ w for X, w in zip(Xh, wh))
    return net, guest, hosts, arbiter, Xg, Xh, wh, plain


def _score_with_arbiter(guest, hosts, arbiter, Xg, Xh, rows_batches):
    errors, served = {}, {}

    def run(name, fn):
        try:
            served[name] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[name] = exc

    threads = [threading.Thread(target=run, args=(h.party_id, lambda h=h, X=X: h.serve_predictions(X)), daemon=True)
               for h, X in zip(hosts, Xh)]
    threads.append(threading.Thread(target=run, args=("server", lambda: arbiter.serve_predictions(max_rows=len(Xg))),
                                    daemon=True))
    for t in threads:
        t.start()
    try:
        p = np.concatenate([guest.predict_proba(Xg, rows=r) for r in rows_batches])
        guest.end_prediction()
    finally:
        for t in threads:
            t.join(20)
    return p, errors, served


@pytest.fixture(scope="module")
def arbiter_keys():
    from secureflhv.crypto.homomorphic.backend import PaillierHE

    he = PaillierHE()
    return he, he.generate_keypair(512, True), he.generate_keypair(512, True)


def test_arbiter_mode_guest_gets_only_totals(arbiter_keys):
    """Scores equal the plaintext model to the fixed-point bound; the guest receives each host's part only
    as ciphertexts under the arbiter's key, each alone decrypting to noise (zero-sum host masks) and both
    together to exactly the sum, and the arbiter sees only uniformly masked totals."""
    from secureflhv.crypto.homomorphic.backend import ldexp_int
    from secureflhv.vertical import lr_scores

    he, (pub, priv), _ = arbiter_keys
    log: list = []
    net, guest, hosts, arbiter, Xg, Xh, wh, plain = _arbiter_roles(lambda n, p: Recorder(n, p, log), (pub, priv),
                                                                   np.random.default_rng(1))
    p, errors, served = _score_with_arbiter(guest, hosts, arbiter, Xg, Xh, [np.arange(4), np.arange(4, 6)])
    assert not errors, errors
    assert served == {"host-1": 3, "host-2": 3, "server": 3}  # rows 0-2, 3, 4-5
    np.testing.assert_allclose(p, 1.0 / (1.0 + np.exp(-plain)), rtol=0, atol=SCORE_TOL / 4)
    to_guest = {(s, tag) for s, r, tag, _, _ in log if r == "guest"}
    assert to_guest == {("host-1", lr_scores.TAG_PRED_ENC), ("host-2", lr_scores.TAG_PRED_ENC),
                        ("server", lr_scores.TAG_PRED_KEY), ("server", lr_scores.TAG_PRED_TOTAL)}
    parts: dict = {}
    for sender, _, tag, rnd, data in log:
        if tag == lr_scores.TAG_PRED_ENC:  # one host's part alone decrypts to noise (two hosts: zero-sum masks)
            i = HOSTS.index(sender)
            rows = {1: np.arange(3), 2: np.arange(3, 4), 3: np.arange(4, 6)}[rnd]
            enc = guest.wire.from_proto(messages_pb2.EncryptedTensor.FromString(data), pub, (len(rows),), "t",
                                        exponent=-40)
            assert np.all(np.abs(he.decrypt(priv, enc) - Xh[i][rows] @ wh[i]) > 2.0 ** 40)
            parts.setdefault(rnd, []).append((enc, Xh[i][rows] @ wh[i]))
    for rnd, pair in parts.items():  # both hosts' parts together: exactly the sum of the rounded scores
        assert len(pair) == 2
        exact = sum(np.ldexp(np.rint(np.ldexp(u, 40)), -40) for _, u in pair)
        np.testing.assert_array_equal(he.decrypt(priv, pair[0][0] + pair[1][0]), exact)
        if tag == lr_scores.TAG_PRED_TOTAL:  # what the arbiter decrypted: s + r mod n, r uniform in Z_n
            vals = guest.wire.masked_from_proto(messages_pb2.MaskedValues.FromString(data), pub, None, "t",
                                                exponent=-40).values
            assert all(2 ** 100 < v < pub.n - 2 ** 100 for v in vals)  # never the small encoded score
            assert not any(abs(ldexp_int(v, -40)) < 1e3 for v in vals)


def _honest_run_with(liar_pid, tag, lie, arbiter_keys):
    _, keypair, _ = arbiter_keys
    liars = {}

    def make(net, pid):
        if pid == liar_pid:
            liars[pid] = Liar(net, pid, tag, lie)
            return liars[pid]
        return net.transport(pid)

    net, guest, hosts, arbiter, Xg, Xh, _, plain = _arbiter_roles(make, keypair, np.random.default_rng(2))
    p, errors, _ = _score_with_arbiter(guest, hosts, arbiter, Xg, Xh, [np.arange(len(Xg))])
    return p, errors, plain, liars[liar_pid].reasons


def _enc(keypair, k, exponent=-40):
    from secureflhv.transport.he_codec import encrypted_to_proto
    from secureflhv.crypto.homomorphic.backend import PaillierHE

    he = PaillierHE()
    enc = he.encrypt(keypair[0], np.zeros(k))
    msg = encrypted_to_proto(enc)
    msg.exponent = exponent
    return msg.SerializeToString()


def _raw(payload) -> bytes:
    return payload if isinstance(payload, bytes) else payload.SerializeToString()


def _out_of_range(payload) -> bytes:
    msg = messages_pb2.EncryptedTensor.FromString(_raw(payload))
    msg.ciphertexts = b"\xff" * len(msg.ciphertexts)  # >= n^2
    return msg.SerializeToString()


@pytest.mark.parametrize("liar, tag, lie, reason", [
    ("host-1", "vlr.pred_enc", lambda keys: lambda p: _enc(keys[1], 2), "shape"),
    ("host-1", "vlr.pred_enc", lambda keys: lambda p: _enc(keys[2], 3), "key"),            # another key
    ("host-1", "vlr.pred_enc", lambda keys: lambda p: _enc(keys[1], 3, exponent=-8), "exponent"),
    ("host-1", "vlr.pred_enc", lambda keys: _out_of_range, "outside (0, n^2)"),
    ("host-1", "vlr.pred_enc", lambda keys: lambda p: tensor_to_proto(np.zeros(3)).SerializeToString(),
     "EncryptedTensor"),                                                                    # plaintext scores
    ("guest", "vlr.pred_dec", lambda keys: lambda p: _bundle_plain(), "needs"),            # a plaintext score
    ("guest", "vlr.pred_dec", lambda keys: lambda p: _bundle_s(_enc(keys[1], 4)), "shape"),  # more rows than allowed
    ("server", "vlr.pred_total", lambda keys: lambda p: _wrong_masked(p), "value"),
])
def test_arbiter_mode_lying_peer_is_rejected(arbiter_keys, liar, tag, lie, reason):
    p, errors, plain, reasons = _honest_run_with(liar, tag, lie(arbiter_keys), arbiter_keys)
    assert not errors, errors
    np.testing.assert_allclose(p, 1.0 / (1.0 + np.exp(-plain)), rtol=0, atol=SCORE_TOL / 4)
    assert reasons and all(tag in r or "invalid payload" in r for r in reasons), reasons
    assert any(reason in r for r in reasons), reasons


def _bundle_s(enc_payload: bytes) -> bytes:
    msg = messages_pb2.Bundle()
    msg.encrypted["s"].CopyFrom(messages_pb2.EncryptedTensor.FromString(enc_payload))
    return msg.SerializeToString()


def _bundle_plain() -> bytes:
    msg = messages_pb2.Bundle()
    msg.tensors["s"].CopyFrom(tensor_to_proto(np.zeros(3)))
    return msg.SerializeToString()


def _wrong_masked(payload) -> bytes:
    msg = messages_pb2.MaskedValues.FromString(_raw(payload))
    msg.values = b"\xff" * len(msg.values)  # not in Z_n
    return msg.SerializeToString()


def test_arbiter_mode_silent_arbiter_is_named_at_the_deadline(arbiter_keys):
    net = InProcessNetwork("p", ["guest", "host-1", "server"], deadline=1.5)
    host = VerticalLRHost.from_model(net.transport("host-1"), "guest", ["host-1"], np.ones(2), ARB, arbiter_id="server")
    guest = VerticalLRGuest.from_model(net.transport("guest"), ["host-1"], np.ones(3), None, ARB, arbiter_id="server")

    def score():
        with pytest.raises(TransportError, match="server"):
            guest.predict_proba(np.ones((4, 3)))

    _run(lambda: host.serve_predictions(np.ones((4, 2)), max_requests=1), score)
