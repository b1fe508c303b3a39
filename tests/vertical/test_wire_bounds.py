"""Peer-supplied numbers that size work are bounded in real vertical runs: an EncryptedTensor (or masked
values) at another exponent than the agreed one (2^31 - 1 would make the receiver's rescale run for hours),
with one ciphertext too few or too many, or with a ciphertext outside Z*_{n^2} is rejected and logged, and
training goes on with the honest message; a peer that sends only the bad message is named when the wait
ends. Also: the split NN's label-DP noise is not derived from the job seed."""
import logging
import time

import numpy as np
import pytest

from secureflhv.proto import messages_pb2
from secureflhv.transport import InProcessTransport, Message, PeerTimeout
from secureflhv.vertical import lr as vlr
from secureflhv.vertical import split_nn as snn
from secureflhv.vertical.split_nn import SplitNNConfig
from snn_harness import make_roles, run_roles, toy
from snn_twin import roles_state, seeded_twin
from vlr_harness import reference_taylor_lr, run_vertical_lr

KEY = {"key_bits": 512, "insecure_test_key": True}
INT32_MAX = 2 ** 31 - 1


def corrupt(payload, kind: str) -> bytes:
    """A copy of ``payload`` (EncryptedTensor, MaskedValues, or a Bundle whose encrypted 'u' is hit) with one flaw."""
    bad = type(payload)()
    bad.CopyFrom(payload)
    t = bad.encrypted["u"] if isinstance(bad, messages_pb2.Bundle) else bad
    field = "values" if isinstance(t, messages_pb2.MaskedValues) else "ciphertexts"
    data, w = getattr(t, field), t.byte_width
    if kind == "huge_exponent":
        t.exponent = INT32_MAX
    elif kind == "tiny_exponent":
        t.exponent = -INT32_MAX
    elif kind == "off_by_one_exponent":
        t.exponent -= 1
    elif kind == "missing_ciphertext":
        setattr(t, field, data[:-w])
    elif kind == "extra_ciphertext":
        setattr(t, field, data + data[:w])
    elif kind == "out_of_range":
        setattr(t, field, b"\xff" * w + data[w:])
    elif kind == "zero":
        setattr(t, field, b"\0" * w + data[w:])
    else:
        raise AssertionError(kind)
    return bad.SerializeToString()


NEEDLE = {"huge_exponent": "exponent", "tiny_exponent": "exponent", "off_by_one_exponent": "exponent",
          "missing_ciphertext": "expected", "extra_ciphertext": "expected", "out_of_range": "outside (0, n^2)",
          "zero": "outside (0, n^2)"}


class Tampering(InProcessTransport):
    """Before each planned (tag, round) or (receiver, tag, round) send, first delivers a corrupted copy and
    waits until the receiver rejected it (``replace``: the honest message is never sent)."""

    def __init__(self, net, pid, plan, log, replace=False):
        super().__init__(net, pid)
        self.plan, self.log, self.replace = plan, log, replace

    def send(self, receiver, tag, payload, round=0, timeout=None):
        kind = self.plan.get((receiver, tag, round), self.plan.get((tag, round)))
        if kind is not None:
            self.log.append((self.party_id, tag, kind, self._inject_until_rejected(receiver, tag, round,
                                                                                   corrupt(payload, kind))))
            if self.replace:
                return
        super().send(receiver, tag, payload, round, timeout)

    def _inject_until_rejected(self, receiver, tag, round, data: bytes, timeout=20.0) -> str:
        """Deliver ``data``; return the reason once the receiver rejected exactly this (tag, round) from us."""
        box = self.network.mailbox(receiver)
        start = len(box.rejected)
        self.network.inject(Message(self.job_id, round, self.party_id, receiver, tag, data))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec, reason in box.rejected[start:]:
                if (rec.sender, rec.tag, rec.round) == (self.party_id, tag, round):
                    return reason
            time.sleep(0.002)
        raise AssertionError(f"{receiver} never rejected the bad {tag!r} round {round}")


def _toy_lr(n=24, d=6, seed=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    return X, (X @ rng.normal(size=d) > 0).astype(int)


def _check_events(events, expected_count):
    assert len(events) == expected_count, events
    for party, tag, kind, reason in events:
        assert NEEDLE[kind] in reason, (party, tag, kind, reason)
        assert "from" in reason  # names the message and its sender


def test_vertical_lr_rejects_bad_exponents_counts_and_ranges_and_trains_exactly(caplog):
    X, y = _toy_lr()
    cfg = dict(KEY, mode="arbiter", epochs=1, batch_size=12, learning_rate=0.3, l2=0.01, seed=3, early_stopping_rounds=None)
    r0, r1 = vlr.round_id(0, 0, 0), vlr.round_id(0, 1, 0)
    plans = {
        "host-1": {(vlr.TAG_FWD, r0 + vlr.S_FWD): "huge_exponent", (vlr.TAG_FWD, r1 + vlr.S_FWD): "missing_ciphertext",
                   (vlr.TAG_GRAD, r0 + vlr.S_GRAD): "tiny_exponent"},
        "host-2": {(vlr.TAG_CROSS, r0 + vlr.S_CROSS): "zero"},
        "guest": {(vlr.TAG_D, r0 + vlr.S_D): "extra_ciphertext",  # to both hosts
                  ("host-2", vlr.TAG_CROSS_IN, r1 + vlr.S_D): "out_of_range",  # every host gets one
                  (vlr.TAG_LOSS, r1 + vlr.S_GRAD): "off_by_one_exponent"},
        "server": {("host-1", vlr.TAG_GRAD_DEC, r0 + vlr.S_DEC): "huge_exponent"},  # masked values back
    }  # (in-process injection blocks the sender: no two parties wait on each other's rejection at once)
    events = []
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        results, errors, net, _ = run_vertical_lr(
            X[:, :2], y, [X[:, 2:4], X[:, 4:]], cfg, deadline=20,
            transports={pid: (lambda net, pid, p=plan: Tampering(net, pid, p, events)) for pid, plan in plans.items()})
    assert not errors, errors
    assert time.monotonic() - t0 < 60
    _check_events(events, 9)
    assert sum("rejected" in rec.getMessage() for rec in caplog.records) >= 9
    assert [len(net.mailbox(p).rejected) for p in ("guest", "host-1", "host-2", "server")] == [3, 2, 2, 2]
    w_ref, _, _ = reference_taylor_lr(X, y, **cfg)
    got = np.concatenate([results["guest"].weights, results["host-1"].weights, results["host-2"].weights])
    np.testing.assert_allclose(got, w_ref, rtol=1e-6, atol=1e-9)


def test_vertical_lr_peer_sending_only_a_huge_exponent_is_named_quickly():
    X, y = _toy_lr()
    cfg = dict(KEY, mode="two_party", epochs=1, batch_size=24, learning_rate=0.3, seed=3, early_stopping_rounds=None)
    plan = {(vlr.TAG_D, vlr.round_id(0, 0, vlr.S_D)): "huge_exponent"}
    events = []
    t0 = time.monotonic()
    results, errors, net, _ = run_vertical_lr(
        X[:, :3], y, [X[:, 3:]], cfg, deadline=2.0,
        transports={"guest": lambda net, pid: Tampering(net, pid, plan, events, replace=True)})
    assert time.monotonic() - t0 < 20  # never hours of rescaling, never a hang
    _check_events(events, 1)
    assert isinstance(errors.get("host-1"), PeerTimeout) and "'guest'" in str(errors["host-1"]), errors
    (rec, reason), = net.mailbox("host-1").rejected
    assert rec.sender == "guest" and rec.tag == vlr.TAG_D and "exponent 2147483647" in reason


SNN = dict(key_bits=512, insecure_test_key=True, host_bottom=[3, 2], guest_bottom=[2], interactive_units=2,
           batch_size=10, learning_rate=0.05, optimizer="sgd", interactive_lr=0.2, seed=2, init_seed=3)


def test_split_nn_rejects_bad_exponents_counts_and_ranges_and_trains_exactly(caplog):
    X, y = toy(n=20, d=5, seed=3)
    Xg, Xh = X[:, :2], X[:, 2:]
    cfg = SplitNNConfig(**SNN, epochs=1)
    r0, r1 = snn.round_id(0, 0, 0), snn.round_id(0, 1, 0)
    plans = {
        "host-1": {(snn.TAG_FWD, r0 + snn.S_FWD): "huge_exponent", (snn.TAG_FWD, r1 + snn.S_FWD): "missing_ciphertext",
                   (snn.TAG_ACC, r0 + snn.S_GW_DEC): "tiny_exponent",
                   (snn.TAG_FWD_DEC, r1 + snn.S_FWD_DEC): "huge_exponent"},  # masked values
        "guest": {(snn.TAG_FWD_MASKED, r0 + snn.S_FWD_MASKED): "extra_ciphertext",
                  (snn.TAG_GW, r0 + snn.S_GW): "huge_exponent", (snn.TAG_GIN, r1 + snn.S_GIN): "out_of_range"},
    }
    events = []
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        net, guest, hosts = make_roles(
            Xg, y, [Xh], cfg, deadline=20,
            transports={pid: (lambda net, pid, p=plan: Tampering(net, pid, p, events)) for pid, plan in plans.items()})
        twin = seeded_twin(cfg, guest, hosts, Xg, [Xh], y)
        results, errors = run_roles(guest, hosts, timeout=120)
    assert not errors, errors
    assert time.monotonic() - t0 < 60
    _check_events(events, 7)
    assert len(net.mailbox("guest").rejected) == 4 and len(net.mailbox("host-1").rejected) == 3
    np.testing.assert_allclose(results["guest"].batch_losses, twin.fit(Xg, [Xh], y), rtol=1e-8)
    fed, ref = roles_state(guest, hosts), twin.state()
    for k in ref:  # the rejected messages changed nothing: the model is the twin's
        np.testing.assert_allclose(fed[k], ref[k], rtol=0, atol=1e-8, err_msg=k)


def test_split_nn_host_sending_only_a_huge_exponent_is_named_quickly():
    X, y = toy(n=10, d=4, seed=1)
    cfg = SplitNNConfig(**SNN, epochs=1)
    plan = {(snn.TAG_FWD, snn.round_id(0, 0, snn.S_FWD)): "huge_exponent"}
    events = []
    t0 = time.monotonic()
    net, guest, hosts = make_roles(X[:, :2], y, [X[:, 2:]], cfg, deadline=2.0,
                                   transports={"host-1": lambda net, pid: Tampering(net, pid, plan, events,
                                                                                    replace=True)})
    results, errors = run_roles(guest, hosts, timeout=30)
    assert time.monotonic() - t0 < 20
    _check_events(events, 1)
    assert isinstance(errors.get("guest"), PeerTimeout) and "'host-1'" in str(errors["guest"]), errors


# --------------------------------------------------------------------------- secret noise
def _guest(seed, noise_seed=None):
    X, y = toy(n=10, d=4, seed=0)
    dp = {"clip_norm": 1.0, "noise_multiplier": 1.0, "noise_seed": noise_seed}
    cfg = SplitNNConfig(**{**SNN, "seed": seed, "init_seed": seed}, epochs=1, n_classes=2, label_dp=dp)
    _, guest, _ = make_roles(X[:, :2], y, [X[:, 2:]], cfg)
    return guest


def test_label_dp_noise_is_not_reproducible_from_the_job_seed():
    g = np.random.default_rng(0).normal(size=(10, 1)) * 0.3  # per-example logit gradients, inside the clip
    a, b = _guest(seed=5)._label_dp.privatise(g), _guest(seed=5)._label_dp.privatise(g)
    assert a.shape == g.shape and np.all(np.isfinite(a))
    assert np.min(np.abs(a - b)) > 0  # same job seed, different noise in every entry
    for guess in (np.random.default_rng([5, 99]), np.random.default_rng(5), np.random.default_rng([5, 5])):
        assert not np.allclose(a, g + guess.normal(0.0, 1.0, size=g.shape))
    # only the test-only noise_seed makes it reproducible
    np.testing.assert_array_equal(_guest(5, noise_seed=3)._label_dp.privatise(g),
                                  _guest(6, noise_seed=3)._label_dp.privatise(g))
    # model initialisation still follows the seed (what the seed is for)
    np.testing.assert_array_equal(_guest(seed=5).V["host-1"], _guest(seed=5).V["host-1"])


@pytest.mark.parametrize("role", ["guest", "host"])
def test_noise_generators_of_two_same_seed_runs_differ(role):
    X, y = toy(n=10, d=4, seed=0)
    cfg = SplitNNConfig(**SNN, epochs=1, n_classes=2, label_dp={"clip_norm": 1.0, "noise_multiplier": 1.0},
                        weight_noise=0.1)
    draws = []
    for _ in range(2):
        _, guest, hosts = make_roles(X[:, :2], y, [X[:, 2:]], cfg)
        draws.append(guest._label_dp._rng.random(4) if role == "guest" else hosts[0]._noise_rng.random(4))
    assert not np.any(draws[0] == draws[1])
