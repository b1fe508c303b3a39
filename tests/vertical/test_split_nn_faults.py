"""Split NN: bad messages rejected and logged while training goes on; a dead host named; label DP's path."""
import logging
import time

import numpy as np
import pytest

from secureflhv.crypto.homomorphic import paillier
from secureflhv.transport.he_codec import encrypted_to_proto
from secureflhv.proto import messages_pb2
from secureflhv.transport import InProcessTransport, Message, PeerTimeout, PeerUnavailable, TransportError
from secureflhv.vertical import split_nn as snn
from secureflhv.vertical.split_nn import SplitNNConfig
from snn_harness import make_roles, run_roles, toy
from snn_twin import roles_state, seeded_twin

CFG = dict(key_bits=512, insecure_test_key=True, host_bottom=[4, 3], guest_bottom=[3], interactive_units=2,
           batch_size=10, learning_rate=0.05, optimizer="sgd", interactive_lr=0.2, seed=2, init_seed=3)


class _TamperingHost(InProcessTransport):
    """Before chosen messages, first delivers a bad one with the same (tag, round) and waits until the
    guest has rejected it."""

    def __init__(self, net, pid, plan, log):
        super().__init__(net, pid)
        self.plan, self.log = plan, log
        self._other_pub, _ = paillier.generate_keypair(512, insecure_test_key=True)

    def _deliver_bad(self, receiver, tag, rnd, payload: bytes):
        reason = self.network.inject_until_rejected(Message(self.job_id, rnd, self.party_id, receiver, tag, payload))
        self.log.append((tag, rnd, reason))

    def send(self, receiver, tag, payload, round=0, timeout=None):
        kind = self.plan.get((tag, round))
        if kind == "wrong_shape":
            good = messages_pb2.EncryptedTensor.FromString(payload.SerializeToString())
            bad = messages_pb2.EncryptedTensor()
            bad.CopyFrom(good)
            bad.shape[0] = good.shape[0] - 1  # valid ciphertexts, one row short
            bad.ciphertexts = good.ciphertexts[:good.byte_width * (good.shape[0] - 1) * good.shape[1]]
            self._deliver_bad(receiver, tag, round, bad.SerializeToString())
        elif kind == "other_key":
            bad = encrypted_to_proto(paillier.encrypt(self._other_pub, np.zeros(tuple(payload.shape))))
            self._deliver_bad(receiver, tag, round, bad.SerializeToString())
        super().send(receiver, tag, payload, round, timeout)


def test_wrong_shape_and_wrong_key_rejected_logged_training_unchanged(caplog):
    X, y = toy(n=30, d=6, seed=3)
    Xg, Xh = X[:, :2], X[:, 2:]
    cfg = SplitNNConfig(**CFG, epochs=2)
    plan = {(snn.TAG_FWD, snn.round_id(0, 1, snn.S_FWD)): "wrong_shape",
            (snn.TAG_ACC, snn.round_id(1, 0, snn.S_GW_DEC)): "other_key",
            (snn.TAG_FWD, snn.round_id(1, 2, snn.S_FWD)): "other_key"}
    events = []
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        net, guest, hosts = make_roles(Xg, y, [Xh], cfg, deadline=20,
                                       transports={"host-1": lambda net, pid: _TamperingHost(net, pid, plan, events)})
        twin = seeded_twin(cfg, guest, hosts, Xg, [Xh], y)
        results, errors = run_roles(guest, hosts)
    assert not errors, errors
    reasons = [r for _, _, r in events]
    assert len(reasons) == 3, reasons
    assert "shape" in reasons[0]
    assert all("fingerprint" in r or "key" in r for r in reasons[1:])
    assert len(net.mailbox("guest").rejected) == 3
    assert sum("rejected" in rec.getMessage() for rec in caplog.records) >= 3
    np.testing.assert_allclose(results["guest"].batch_losses, twin.fit(Xg, [Xh], y), rtol=1e-8)
    fed, ref = roles_state(guest, hosts), twin.state()
    for k in ref:  # the rejected messages changed nothing: the model is the twin's
        np.testing.assert_allclose(fed[k], ref[k], rtol=0, atol=1e-8, err_msg=k)


class _DyingHost(InProcessTransport):
    """Dies (mailbox closed, nothing more leaves it) when about to send its forward message of epoch 1, batch 1."""

    dead = False

    def send(self, receiver, tag, payload, round=0, timeout=None):
        if self.dead:  # a killed process sends nothing, not even an abort
            raise PeerUnavailable(f"{self.party_id} is dead")
        if tag == snn.TAG_FWD and round >= snn.round_id(1, 1, 0):
            self.dead = True
            self.network.take_down(self.party_id)
            raise PeerUnavailable(f"{self.party_id} is dead")
        super().send(receiver, tag, payload, round, timeout)


def test_host_taken_down_mid_epoch_guest_fails_naming_it():
    X, y = toy(n=40, d=6, seed=5)
    cfg = SplitNNConfig(**CFG, epochs=4)
    net, guest, hosts = make_roles(X[:, :2], y, [X[:, 2:4], X[:, 4:]], cfg, deadline=3.0,
                                   transports={"host-1": _DyingHost})
    t0 = time.monotonic()
    results, errors = run_roles(guest, hosts)
    assert time.monotonic() - t0 < 3.0 + 6.0
    assert isinstance(errors.get("guest"), PeerTimeout), errors
    assert "host-1" in str(errors["guest"])
    assert isinstance(errors.get("host-1"), TransportError)
    assert "guest" not in results


def test_config_mismatch_named_and_guest_stops():
    X, y = toy(n=20, d=4, seed=1)
    cfg = SplitNNConfig(**CFG, epochs=1)
    net, guest, hosts = make_roles(X[:, :2], y, [X[:, 2:]], cfg, deadline=5)
    hosts[0].config = cfg.model_copy(update={"batch_size": 7})
    results, errors = run_roles(guest, hosts)
    assert "batch_size" in str(errors["host-1"])
    assert isinstance(errors.get("guest"), TransportError) and "host-1" in str(errors["guest"])


def test_label_dp_without_effective_noise_or_clip_is_the_exact_protocol():
    """label_dp's private backward (per-example logit gradients, clipped and noised, back-propagated) with a clip
    no row reaches and negligible noise trains exactly what plain autograd trains; with real noise the host sees
    different gradients and trains on them, and so does the guest (everything follows from the noised ones)."""
    X, y = toy(n=10, d=5, seed=7)
    outs = {}
    for name, dp in (("off", None), ("inert", {"clip_norm": 100.0, "noise_multiplier": 1e-15}),
                     ("noisy", {"clip_norm": 1.0, "noise_multiplier": 1.0})):
        cfg = SplitNNConfig(**CFG, epochs=1, n_classes=2, label_dp=dp)
        _, guest, hosts = make_roles(X[:, :2], y, [X[:, 2:]], cfg, host_kwargs={"record_gradients": True})
        results, errors = run_roles(guest, hosts)
        assert not errors, errors
        outs[name] = (guest.state_arrays(), hosts[0].state_arrays(), hosts[0].gradient_norms.copy(),
                      results["guest"].batch_losses)
    g0, h0, n0, l0 = outs["off"]
    for name in ("inert", "noisy"):
        assert np.all(np.isfinite(outs[name][2]))
    gi, hi, ni, li = outs["inert"]
    assert l0 == pytest.approx(li, rel=1e-9)
    np.testing.assert_allclose(n0, ni, rtol=1e-8)
    for k in ("interactive.W_g", "interactive.bias", "top.0.weight", "bottom.0.weight"):
        np.testing.assert_allclose(g0[k], gi[k], rtol=1e-8, atol=1e-12, err_msg=k)
    # W_h = V_h + E_h (each share carries the host's secret noise, the sum does not)
    np.testing.assert_allclose(g0["interactive.V.host-1"] + h0["interactive.E"],
                               gi["interactive.V.host-1"] + hi["interactive.E"], rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(h0["bottom.0.weight"], hi["bottom.0.weight"], rtol=1e-8, atol=1e-12)
    g1, h1, n1, _ = outs["noisy"]
    assert np.max(np.abs(n0 - n1)) > 1e-3  # the host saw different gradients...
    assert np.max(np.abs(h0["bottom.0.weight"] - h1["bottom.0.weight"])) > 1e-6  # ...and trained on them
    assert np.max(np.abs(g0["top.0.weight"] - g1["top.0.weight"])) > 1e-6  # the guest's top too
