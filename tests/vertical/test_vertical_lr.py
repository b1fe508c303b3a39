"""Vertical LR: quality on breast cancer, masking, prediction, bad input and a host dying mid-training."""
import logging
import threading
import time

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from secureflhv.crypto.homomorphic import paillier
from secureflhv.transport.he_codec import encrypted_to_proto
from secureflhv.proto import messages_pb2
from secureflhv.transport import (InProcessTransport, JobAborted, Message, MessageRejected, PeerTimeout,
                                  PeerUnavailable, TransportError)
from secureflhv.vertical import lr as vlr
from secureflhv.vertical.lr import VerticalLRConfig
from secureflhv.crypto.homomorphic.backend import PaillierHE
from vlr_harness import reference_taylor_lr, run_vertical_lr

KEY = {"key_bits": 512, "insecure_test_key": True}


def _toy(n=40, d=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = (X @ rng.normal(size=d) + 0.2 * rng.normal(size=n) > 0).astype(int)
    return X, y


def test_breast_cancer_auc_matches_sklearn():
    X, y = load_breast_cancer(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=42, stratify=y)
    sc = StandardScaler().fit(Xtr)
    Xtr, Xte = sc.transform(Xtr), sc.transform(Xte)
    half = X.shape[1] // 2
    # Full batch: the Taylor-approximated loss plateaus near AUC 0.992 here (sklearn: 0.998)
    cfg = dict(key_bits=1024, insecure_test_key=True, mode="arbiter", epochs=8, batch_size=None,
               learning_rate=0.5, lr_schedule="constant", momentum=0.0, l2=1.0 / len(Xtr), seed=7,
               early_stopping_rounds=2, min_delta=1e-4)  # plain full-batch GD
    results, errors, _, _ = run_vertical_lr(Xtr[:, :half], ytr, [Xtr[:, half:]], cfg,
                                            predict_sets=(Xte[:, :half], [Xte[:, half:]]))
    assert not errors, errors
    auc_fed = roc_auc_score(yte, results["proba"])
    auc_sk = roc_auc_score(yte, LogisticRegression(max_iter=1000).fit(Xtr, ytr).predict_proba(Xte)[:, 1])
    assert auc_fed >= auc_sk - 0.01, (auc_fed, auc_sk)
    losses = results["guest"].losses
    assert losses[-1] < losses[0]  # training reduced the decrypted loss
    # the model is the independent centralised Taylor-LR's (same full batches, early stopping, kept epoch)
    w = np.concatenate([results["guest"].weights, results["host-1"].weights])
    w_ref, b_ref, losses_ref = reference_taylor_lr(Xtr, ytr, **cfg)
    np.testing.assert_allclose(w, w_ref, rtol=0, atol=1e-9)
    assert results["guest"].intercept == pytest.approx(b_ref, abs=1e-9)
    np.testing.assert_allclose(losses, losses_ref, rtol=0, atol=1e-9)
    # federated prediction = the guest's and host's halves of the same linear model
    p = 1 / (1 + np.exp(-(Xte @ w + results["guest"].intercept)))
    np.testing.assert_allclose(results["proba"], p, rtol=1e-12)


def test_full_batch_arbiter_scores_more_rows_than_it_trained_on():
    """Full batch, the arbiter bounds a score request by the training rows (as in a job): the guest splits a
    larger prediction set into requests of that size by itself (30 + 30 + 15 rows)."""
    X, y = _toy(n=30)
    Xp, _ = _toy(n=75, seed=1)
    cfg = dict(KEY, mode="arbiter", epochs=1, batch_size=None, learning_rate=0.3, l2=0.0, seed=0, early_stopping_rounds=None)
    results, errors, _, roles = run_vertical_lr(X[:, :2], y, [X[:, 2:]], cfg, deadline=10.0, arbiter_rows="job",
                                                predict_sets=(Xp[:, :2], [Xp[:, 2:]]))
    assert not errors, errors
    w = np.concatenate([results["guest"].weights, results["host-1"].weights])
    np.testing.assert_allclose(results["proba"], 1 / (1 + np.exp(-(Xp @ w + results["guest"].intercept))), atol=1e-6)
    assert roles["guest"].max_score_rows == 30


def test_key_holder_only_decrypts_uniformly_masked_values():
    """The arbiter (and the guest in two-party mode) only ever sees (m + r) mod n with r uniform in Z_n."""
    X, y = _toy()
    for mode, holder in (("arbiter", "server"), ("two_party", "guest")):
        seen = []
        orig = PaillierHE.decrypt_masked

        def spy(self, priv, enc, add=None, _orig=orig):
            out = _orig(self, priv, enc, add)
            seen.extend(out.values)
            seen_n.append(priv.public_key.n)
            return out

        seen_n = []
        PaillierHE.decrypt_masked = spy
        try:
            cfg = dict(KEY, mode=mode, epochs=2, batch_size=10, learning_rate=0.3, l2=0.0, seed=0, early_stopping_rounds=None)
            results, errors, _, _ = run_vertical_lr(X[:, :2], y, [X[:, 2:]], cfg)
        finally:
            PaillierHE.decrypt_masked = orig
        assert not errors, errors
        n = seen_n[0]
        assert len(seen) > 20
        # unmasked gradients/losses are small fixed-point mantissas (|m| << n): near 0 or near n.
        # Uniform masks put every value far from both ends (probability of failure ~ len(seen) * 2**-60).
        assert all(n >> 60 < v < n - (n >> 60) for v in seen), mode
        w_ref, _, _ = reference_taylor_lr(X, y, **cfg)
        np.testing.assert_allclose(np.concatenate([results["guest"].weights, results["host-1"].weights]), w_ref,
                                   rtol=1e-6, atol=1e-9)


def test_identity_backend_runs_the_same_protocol():
    X, y = _toy(seed=2)
    cfg = VerticalLRConfig(**KEY, mode="arbiter", epochs=3, batch_size=16, learning_rate=0.3, l2=0.01,
                           early_stopping_rounds=None)
    from secureflhv.transport import InProcessNetwork
    net = InProcessNetwork("bench", ["guest", "host-1", "server"], deadline=20)
    roles = [vlr.VerticalLRGuest(net.transport("guest"), ["host-1"], X[:, :3], y, cfg, "server",
                                 backend="identity"),
             vlr.VerticalLRHost(net.transport("host-1"), "guest", ["host-1"], X[:, 3:], cfg, "server",
                                backend="identity"),
             vlr.VerticalLRArbiter(net.transport("server"), "guest", ["host-1"], cfg, backend="identity")]
    out = {}
    threads = [threading.Thread(target=lambda r=r: out.setdefault(r.party_id, r.fit())) for r in roles]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    w_ref, b_ref, losses = reference_taylor_lr(X, y, **cfg.model_dump())
    np.testing.assert_allclose(np.concatenate([out["guest"].weights, out["host-1"].weights]), w_ref, rtol=1e-9)
    np.testing.assert_allclose(out["guest"].losses, losses, rtol=1e-9)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="key_bits"):
        VerticalLRConfig(key_bits=1024)
    with pytest.raises(ValueError, match="learning_rat"):
        VerticalLRConfig(learning_rat=0.1)
    with pytest.raises(ValueError, match="lr_decay"):
        VerticalLRConfig(lr_schedule="step", lr_decay=0.0)
    assert VerticalLRConfig().key_bits == 2048


def test_host_rejects_mismatched_config_and_guest_fails():
    X, y = _toy()
    from secureflhv.transport import InProcessNetwork
    net = InProcessNetwork("cfg", ["guest", "host-1"], deadline=5)
    g = vlr.VerticalLRGuest(net.transport("guest"), ["host-1"], X[:, :2], y,
                            VerticalLRConfig(**KEY, mode="two_party", seed=1), None)
    h = vlr.VerticalLRHost(net.transport("host-1"), "guest", ["host-1"], X[:, 2:],
                           VerticalLRConfig(**KEY, mode="two_party", seed=2), None)
    errs = {}

    def run(role):
        try:
            role.fit()
        except Exception as exc:  # noqa: BLE001
            errs[role.party_id] = exc

    ts = [threading.Thread(target=run, args=(r,)) for r in (g, h)]
    [t.start() for t in ts]
    [t.join(20) for t in ts]
    assert "seed" in str(errs["host-1"])
    assert isinstance(errs["guest"], JobAborted) and "seed" in str(errs["guest"])


# --------------------------------------------------------------------------- bad input during training
class _TamperingGuest(InProcessTransport):
    """The guest's transport; before sending [[d]] at chosen rounds it first delivers a bad message with
    the same (tag, round) and waits until the host has rejected it; after one send it replays a stale one."""

    def __init__(self, net, pid, plan, log):
        super().__init__(net, pid)
        self.plan, self.log, self._last = plan, log, None
        self._other_pub, _ = paillier.generate_keypair(512, insecure_test_key=True)

    def _deliver_bad(self, receiver, tag, rnd, payload: bytes):
        reason = self.network.inject_until_rejected(Message(self.job_id, rnd, self.party_id, receiver, tag, payload))
        self.log.append((tag, rnd, reason))

    def send(self, receiver, tag, payload, round=0, timeout=None):
        kind = self.plan.get(round) if tag == vlr.TAG_D else None
        if kind == "wrong_shape":
            good = messages_pb2.EncryptedTensor.FromString(payload.SerializeToString())
            bad = messages_pb2.EncryptedTensor()
            bad.CopyFrom(good)
            bad.shape[0] = good.shape[0] - 1  # valid ciphertexts, one row short
            bad.ciphertexts = good.ciphertexts[:good.byte_width * (good.shape[0] - 1)]
            self._deliver_bad(receiver, tag, round, bad.SerializeToString())
        elif kind == "other_key":
            bad = encrypted_to_proto(paillier.encrypt(self._other_pub, np.zeros(int(payload.shape[0]))))
            self._deliver_bad(receiver, tag, round, bad.SerializeToString())
        super().send(receiver, tag, payload, round, timeout)
        if kind == "stale_after":
            try:  # replay of the round the host has just consumed... or will: use the previous batch's round
                self.network.inject(Message(self.job_id, self._last, self.party_id, receiver, tag,
                                            payload.SerializeToString()))
            except MessageRejected as exc:
                self.log.append((tag, self._last, str(exc)))
        if tag == vlr.TAG_D:
            self._last = round


@pytest.mark.parametrize("mode", ["arbiter", "two_party"])
def test_bad_messages_rejected_and_logged_training_correct(mode, caplog):
    X, y = _toy(n=36, d=5, seed=4)
    cfg = dict(KEY, mode=mode, epochs=2, batch_size=12, learning_rate=0.3, l2=0.01, seed=3,
               early_stopping_rounds=None)
    plan = {vlr.round_id(0, 1, vlr.S_D): "wrong_shape", vlr.round_id(1, 0, vlr.S_D): "other_key",
            vlr.round_id(1, 2, vlr.S_D): "stale_after"}
    events = []
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        results, errors, net, _ = run_vertical_lr(
            X[:, :2], y, [X[:, 2:]], cfg, deadline=20,
            transports={"guest": lambda net, pid: _TamperingGuest(net, pid, plan, events)})
    assert not errors, errors
    reasons = [r for _, _, r in events]
    assert len(reasons) == 3, reasons
    assert "shape" in reasons[0]
    assert "key" in reasons[1] or "fingerprint" in reasons[1]
    assert "stale" in reasons[2]
    assert len(net.mailbox("host-1").rejected) == 3
    assert sum("rejected" in rec.getMessage() for rec in caplog.records) >= 3
    w_ref, b_ref, _ = reference_taylor_lr(X, y, **cfg)
    np.testing.assert_allclose(np.concatenate([results["guest"].weights, results["host-1"].weights]), w_ref,
                               rtol=1e-6, atol=1e-9)
    assert results["guest"].intercept == pytest.approx(b_ref, rel=1e-6)


# --------------------------------------------------------------------------- a host dies
class _DyingHost(InProcessTransport):
    """Dies (mailbox closed, nothing more leaves it, not even an abort) when it is about to send
    its forward message of epoch 1."""

    def __init__(self, net, pid):
        super().__init__(net, pid)
        self.dead = False

    def send(self, receiver, tag, payload, round=0, timeout=None):
        if self.dead:
            raise PeerUnavailable(f"{self.party_id} is dead")
        if tag == vlr.TAG_FWD and round >= vlr.round_id(1, 0, 0):
            self.dead = True
            self.network.take_down(self.party_id)
            raise PeerUnavailable(f"{self.party_id} is dead")
        super().send(receiver, tag, payload, round, timeout)


@pytest.mark.parametrize("mode", ["arbiter", "two_party"])
def test_host_taken_down_mid_training_fails_fast_naming_it(mode):
    X, y = _toy()
    cfg = dict(KEY, mode=mode, epochs=5, batch_size=20, learning_rate=0.3, early_stopping_rounds=None)
    t0 = time.monotonic()
    results, errors, _, _ = run_vertical_lr(X[:, :2], y, [X[:, 2:]], cfg, deadline=3.0,
                                            transports={"host-1": _DyingHost})
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0 + 5.0, elapsed
    survivors = ["guest"] + (["server"] if mode == "arbiter" else [])
    for pid in survivors:
        assert isinstance(errors.get(pid), TransportError), (pid, errors)
        assert "host-1" in str(errors[pid]), (pid, errors[pid])
    # whoever times out first (guest or arbiter) names the host; the other gets its abort, which also does
    assert any(isinstance(errors[pid], PeerTimeout) and "from 'host-1'" in str(errors[pid]) for pid in survivors)
    assert all(isinstance(errors[pid], (PeerTimeout, JobAborted)) for pid in survivors)
