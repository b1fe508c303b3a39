"""Vertical LR, arbiter mode, two hosts (issue 36): a guest that has the arbiter decrypt one host's
encrypted partial scores alone -- in a prediction request or in a training batch's gradient request,
both of the honest shape -- gets noise, not u_h = X_h w_h; the same attack without the host masks
recovers u_h (the control); an honest run's scores and weights equal the unmasked protocol's bit for bit.
In-process with the real roles, and the prediction attack once over gRPC + mutual TLS processes."""
from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np
import pytest

import vlr_procs
from vlr_procs import HOSTS, IsolatingGuest, exact_scores, model
from secureflhv.crypto.homomorphic import paillier as pl
from secureflhv.crypto.secagg_primitives import KeyPair
from secureflhv.proto import messages_pb2
from secureflhv.transport import InProcessNetwork, ProtocolError
from secureflhv.vertical import lr as vlr
from secureflhv.vertical.host_masks import TAG_MASK_KEY, HostMasks, _key_parser
from secureflhv.vertical.lr import VerticalLRArbiter, VerticalLRConfig, VerticalLRGuest, VerticalLRHost

FAR = 2.0 ** 40  # a mask is ~2^88 in score units; the honest values here are < 10


def _threads(fns: dict, timeout=60):
    out, errors = {}, {}

    def work(pid, fn):
        try:
            out[pid] = fn()
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            errors[pid] = exc

    threads = [threading.Thread(target=work, args=kv, daemon=True) for kv in fns.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a party hung"
    assert not errors, errors
    return out


def _predict(guest_cls, guest_fn):
    """Prediction-only roles (saved weights) of a 2-host regression model; ``guest_fn(guest)`` runs at the guest."""
    X, w, b, cfg = model()
    net = InProcessNetwork("vlr-masks", ["guest", *HOSTS, "server"], deadline=20)
    g = guest_cls.from_model(net.transport("guest"), HOSTS, w["guest"], b, cfg, "server")
    fns = {"server": lambda: VerticalLRArbiter(net.transport("server"), "guest", HOSTS, cfg).serve_predictions()}
    for h in HOSTS:
        fns[h] = (lambda h=h: VerticalLRHost.from_model(net.transport(h), "guest", HOSTS, w[h], cfg, "server")
                  .serve_predictions(X[h]))

    def guest():
        try:
            return guest_fn(g, X["guest"])
        finally:
            g.end_prediction()

    fns["guest"] = guest
    return _threads(fns)["guest"], X, w, b


def test_prediction_guest_isolating_one_host_gets_noise():
    def run(g, Xg):
        honest = g.predict_proba(Xg)
        g.attack = True
        first = g.predict_proba(Xg, rows=list(range(8)))
        again = g.predict_proba(Xg, rows=list(range(8)))
        return honest, first, again

    (honest, first, again), X, w, b = _predict(IsolatingGuest, run)
    # all hosts' parts: the total is exactly the unmasked fixed-point sum (bit for bit)
    np.testing.assert_array_equal(honest, exact_scores(X, w, b))
    u1 = X[HOSTS[0]][:8] @ w[HOSTS[0]]
    assert np.all(np.abs(first - u1) > FAR) and np.all(np.abs(again - u1) > FAR)  # noise on every row
    assert np.all(first != again)  # fresh masks per request: no fixed offset to learn


class MixedRowsGuest(VerticalLRGuest):
    """Asks host-1 for the rows it wants and host-2 for other rows in the same request: with masks keyed by
    position this would reveal u_1[i] + u_2[j] for any pairs, hence u_1 up to a constant."""

    def _request_rows(self, n_rows, rows):
        self._pred_round += 1
        for h, r in zip(self.host_ids, [rows, rows[::-1]]):
            self.t.send(h, self.pred_request_tag, messages_pb2.RowsRequest(n_rows=n_rows, rows=r),
                        round=self._pred_round)
        return self._pred_round


def test_prediction_guest_asking_hosts_for_different_rows_gets_noise():
    rows = list(range(6))
    out, X, w, b = _predict(MixedRowsGuest, lambda g, Xg: g.predict_proba(Xg, rows=rows))
    own = X["guest"][rows] @ w["guest"] + b
    mixed = own + X[HOSTS[0]][rows] @ w[HOSTS[0]] + X[HOSTS[1]][rows[::-1]] @ w[HOSTS[1]]
    assert np.all(np.abs(out - mixed) > FAR)


# ------------------------------------------------------------------------------------------ training
class _Recorder:
    """The guest's transport, keeping every parsed vlr.fwd by (sender, round)."""

    def __init__(self, t):
        self._t, self.fwds = t, {}

    def __getattr__(self, name):
        return getattr(self._t, name)

    def recv(self, peer, tag, **kw):
        out = self._t.recv(peer, tag, **kw)
        if tag == vlr.TAG_FWD:
            self.fwds[(peer, kw.get("round"))] = out
        return out


class GradSwapGuest(VerticalLRGuest):
    """In batch ``target`` it sends, as its gradient request ([[X_g^T d]] of shape (d_g,)), the first d_g of
    ``victim``'s encrypted partial scores of that batch instead, at the gradient's exponent."""

    victim = HOSTS[0]
    target = None  # round_id(epoch, batch, 0)
    leaked = None

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.t = _Recorder(self.t)

    def _ask_decrypt(self, pub, enc, holder, tag, rnd):
        if tag == vlr.TAG_GRAD and rnd == self.target + vlr.S_GRAD:
            u = self.t.fwds[(self.victim, self.target + vlr.S_FWD)][0]
            zero = pl.EncryptedArray(pub, self.he.encrypt(pub, np.zeros(enc.shape)).ciphertexts, enc.exponent)
            enc = u[:enc.shape[0]] + zero  # same values, read at the gradient's (finer) exponent
        return super()._ask_decrypt(pub, enc, holder, tag, rnd)

    def _take_decrypted(self, pub, mask, holder, tag, rnd, shape):
        out = super()._take_decrypted(pub, mask, holder, tag, rnd, shape)
        if tag == vlr.TAG_GRAD_DEC and rnd == self.target + vlr.S_DEC:
            self.leaked = out.copy()
        return out


def _train(guest_cls=VerticalLRGuest, task="binary", he_scheme="paillier", key_bits=512, **guest_attrs):
    rng = np.random.default_rng(8)
    n = 30
    X = rng.normal(size=(n, 7))
    y = rng.integers(0, 3 if task == "multiclass" else 2, size=n)
    cfg = VerticalLRConfig(task=task, he_scheme=he_scheme, key_bits=key_bits, insecure_test_key=True, epochs=2,
                           batch_size=10, learning_rate=0.3, early_stopping_rounds=None, restore_best=False, seed=1)
    cols = {"guest": [0, 1], HOSTS[0]: [2, 3, 4], HOSTS[1]: [5, 6]}
    net = InProcessNetwork("vlr-masks-train", ["guest", *HOSTS, "server"], deadline=30)
    g = guest_cls(net.transport("guest"), HOSTS, X[:, cols["guest"]], y, cfg, "server",
                  n_classes=3 if task == "multiclass" else None)
    for k, v in guest_attrs.items():
        setattr(g, k, v)
    roles = {"guest": g, "server": VerticalLRArbiter(net.transport("server"), "guest", HOSTS, cfg)}
    sent = {}
    for h in HOSTS:
        roles[h] = VerticalLRHost(net.transport(h), "guest", HOSTS, X[:, cols[h]], cfg, "server")
        sent[h] = []
        enc = roles[h].he.encrypt
        roles[h].he.encrypt = lambda pub, x, enc=enc, h=h: (sent[h].append(np.array(x)), enc(pub, x))[1]
    out = _threads({p: r.fit for p, r in roles.items()})
    return out, roles, sent


def _last_batch_scores(sent, host, nb=10):
    return [u for u in sent[host] if u.shape == (nb,)][-1]


def test_training_guest_isolating_one_host_gets_noise(monkeypatch):
    target = vlr.round_id(1, 2, 0)  # the last batch: weights have moved, nothing runs on the spoilt gradient
    _, roles, sent = _train(GradSwapGuest, target=target)
    u = _last_batch_scores(sent, HOSTS[0])[:3]
    assert np.all(np.abs(u) > 1e-3)  # the victim's scores are not trivially 0
    assert np.all(np.abs(roles["guest"].leaked - u) > FAR)
    # control: the same attack on the unmasked protocol recovers u_h (what the masks stop)
    monkeypatch.setattr(vlr._Role, "_masked", lambda self: False)
    _, roles, sent = _train(GradSwapGuest, target=target)
    np.testing.assert_allclose(roles["guest"].leaked, _last_batch_scores(sent, HOSTS[0])[:3], rtol=0, atol=1e-9)


@pytest.mark.parametrize("task,he_scheme,key_bits", [("binary", "paillier", 512), ("multiclass", "paillier", 512),
                                                     ("regression", "paillier", 256), ("binary", "ou", 1024)])
def test_masked_training_equals_the_unmasked_protocol_bit_for_bit(monkeypatch, task, he_scheme, key_bits):
    if he_scheme == "ou":
        pytest.importorskip("heu", reason="sf-heu is a linux dependency of the OU scheme")
    masked, _, _ = _train(task=task, he_scheme=he_scheme, key_bits=key_bits)
    monkeypatch.setattr(vlr._Role, "_masked", lambda self: False)
    plain, _, _ = _train(task=task, he_scheme=he_scheme, key_bits=key_bits)
    for p in ["guest", *HOSTS]:  # the gradients see exactly the same U
        np.testing.assert_array_equal(masked[p].weights, plain[p].weights)
    # the loss: 1/2 U H U from the masked products is exact in the fixed-point encoding, where the
    # unmasked protocol rounds |u_h|^2 per host: equal to ~1e-12
    np.testing.assert_allclose(masked["guest"].losses, plain["guest"].losses, rtol=1e-10)


# ------------------------------------------------------------------------------------------ key agreement
def test_host_masks_cancel_over_all_hosts_and_only_there():
    hosts = ["h-a", "h-b", "h-c"]
    net = InProcessNetwork("masks", hosts, deadline=10)
    hm = _threads({h: lambda h=h: HostMasks(net.transport(h), hosts, 40).agree() for h in hosts})
    rows = [3, 17, 5]
    m = {h: hm[h].masks(("ctx", 1), rows, 2) for h in hosts}
    assert [sum(v) for v in zip(*m.values())] == [0] * 6
    assert all(abs(v) > 2 ** 80 for v in m["h-a"])  # one host's mask alone is large
    assert hm["h-a"].masks(("ctx", 2), rows, 2) != m["h-a"]  # fresh per context
    assert hm["h-a"].masks(("ctx", 1), rows[::-1], 2)[:2] == m["h-a"][4:]  # keyed by the row index


@pytest.mark.parametrize("text,why", [({"x25519": "00" * 32}, "low order"), ({"x25519": "ab"}, "64 hex"),
                                      ({"x25519": KeyPair().public.hex(), "extra": "1"}, "only")])
def test_a_bad_host_key_is_rejected_naming_the_sender(text, why):
    with pytest.raises(ProtocolError, match=f"{TAG_MASK_KEY} from host-2.*{why}"):
        _key_parser("host-2")(messages_pb2.Bundle(text=text).SerializeToString())


# ------------------------------------------------------------------------------------------ gRPC + mTLS
@pytest.mark.slow
def test_prediction_attack_over_grpc_tls_processes(tmp_path):
    from secureflhv.runtime.job.demo import free_ports
    from secureflhv.transport.certs import generate_certificates

    parties = ["guest", *HOSTS, "server"]
    generate_certificates(tmp_path / "certs", parties)
    addresses = {p: f"127.0.0.1:{port}" for p, port in zip(parties, free_ports(len(parties)))}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=vlr_procs.prediction_party, args=(p, addresses, str(tmp_path / "certs"), q))
             for p in parties]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in parties:
            pid, val = q.get(timeout=120)
            out[pid] = val
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    errors = {k: v for k, v in out.items() if isinstance(v, str) and v.startswith("ERROR")}
    assert not errors, errors
    X, w, b, _ = model()
    honest, leaked = (np.array(v) for v in out["guest"])
    np.testing.assert_array_equal(honest, exact_scores(X, w, b))
    assert np.all(np.abs(leaked - X[HOSTS[0]] @ w[HOSTS[0]]) > FAR)
