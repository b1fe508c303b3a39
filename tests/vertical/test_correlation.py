"""Cross-party Pearson correlation (secureflhv.vertical.correlation), in process: the matrix equals numpy's
``corrcoef`` of the joined table to 1e-9 whichever party learns it, the other party ends with nothing (and
decrypts only masked values), lying peers are rejected and named, and the column report equals pandas'."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from secureflhv.crypto.homomorphic.backend import PaillierHE
from secureflhv.proto import messages_pb2
from secureflhv.transport import InProcessNetwork, InProcessTransport, JobAborted, PeerTimeout
from secureflhv.vertical import correlation as corr
from secureflhv.vertical.correlation import (CorrelationConfig, CorrelationGuest, CorrelationHost,
                                             CorrelationRefused, column_statistics, standardise_columns)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tree"))
from sb_harness import run_threads  # noqa: E402

KEY = {"key_bits": 512, "insecure_test_key": True}


def _table(n=40, seed=0):
    """Guest 3 columns, host-1 2, host-2 3, correlated with each other (numpy only)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, 2))
    cols = [base[:, 0] * 3 + 100, base[:, 1] - 0.5 * base[:, 0], rng.normal(size=n) * 1e-3,  # guest
            base[:, 0] + rng.normal(size=n) * 0.1, rng.exponential(size=n) * 50,              # host-1
            -base[:, 1] * 7, base[:, 0] * base[:, 1], rng.integers(0, 5, n).astype(float)]    # host-2
    X = np.column_stack(cols)
    return X[:, :3], [X[:, 3:5], X[:, 5:]]


def run_roles(Xg, Xhs, cfg, *, deadline=30.0, transports=None, guest_kwargs=None, timeout=120):
    """Run guest and hosts in threads over an InProcessNetwork; returns (results, errors, net, roles)."""
    host_ids = [f"host-{i}" for i in range(1, len(Xhs) + 1)]
    net = InProcessNetwork("corr-test", ["guest"] + host_ids, deadline=deadline)
    transports = transports or {}

    def tr(pid):
        return transports[pid](net, pid) if pid in transports else net.transport(pid)

    guest = CorrelationGuest(tr("guest"), host_ids, Xg, cfg, feature_names=[f"g{j}" for j in range(Xg.shape[1])],
                             **(guest_kwargs or {}))
    hosts = [CorrelationHost(tr(h), "guest", X, cfg, feature_names=[f"{h}.c{j}" for j in range(X.shape[1])])
             for h, X in zip(host_ids, Xhs)]
    results, errors = run_threads({r.party_id: r.run for r in [guest, *hosts]}, timeout)  # asserts none hung
    return results, errors, net, (guest, hosts)


def _numpy_cross(Xg, Xh):
    """Pearson between every guest and host column, from numpy.corrcoef of the joined table."""
    full = np.corrcoef(np.column_stack([Xg, Xh]), rowvar=False)
    return full[:Xg.shape[1], Xg.shape[1]:]


@pytest.mark.parametrize("reveal_to", ["guest", "host"])
def test_matrix_equals_numpy_corrcoef_and_only_the_learner_gets_it(reveal_to, monkeypatch):
    Xg, Xhs = _table()
    cfg = CorrelationConfig(**KEY, reveal_to=reveal_to)
    decrypted = []  # every plain value the guest's key decrypted with decode (not masked)
    real_decrypt = PaillierHE.decrypt

    def spy(self, priv, enc):
        out = real_decrypt(self, priv, enc)
        decrypted.append(out)
        return out

    monkeypatch.setattr(PaillierHE, "decrypt", spy)
    t0 = time.monotonic()
    results, errors, net, _ = run_roles(Xg, Xhs, cfg)
    assert not errors, errors
    assert time.monotonic() - t0 < 60
    if reveal_to == "guest":
        assert set(results["guest"].matrices) == {"host-1", "host-2"}
        assert all(not results[h].matrices for h in ("host-1", "host-2"))
        got = {h: results["guest"].matrices[h] for h in ("host-1", "host-2")}
        assert len(decrypted) == 2  # one matrix per host
    else:
        assert results["guest"].matrices == {}
        assert decrypted == []  # the guest decoded nothing: it only returned masked residues
        got = {h: results[h].matrices[h] for h in ("host-1", "host-2")}
        assert set(results["host-1"].matrices) == {"host-1"}  # a host gets its own matrix, never another's
    for i, h in enumerate(("host-1", "host-2")):
        expected = _numpy_cross(Xg, Xhs[i])
        assert got[h].r.shape == expected.shape
        np.testing.assert_allclose(got[h].r, expected, rtol=0, atol=1e-9)
        assert got[h].guest_names == ["g0", "g1", "g2"]
        assert got[h].host_names == [f"{h}.c{j}" for j in range(Xhs[i].shape[1])]
        assert abs(got[h].r).max() > 0.3  # a real signal, not a matrix of zeros
    assert not any(net.mailbox(p).rejected for p in ("guest", "host-1", "host-2"))


def test_small_chunks_missing_cells_constant_columns_and_anonymous_names():
    """Many row chunks (a small message limit) give the same matrix; a missing cell is mean-imputed
    (missing: mean), a constant column is NaN; without share_feature_names the learner sees party:index."""
    Xg, Xhs = _table(n=30, seed=3)
    Xg = Xg.copy()
    Xh = Xhs[0].copy()
    Xg[[2, 7], 1] = np.nan
    Xh[:, 1] = 4.2  # constant
    Xh[5, 0] = np.nan
    cfg = CorrelationConfig(**KEY, share_feature_names=False)
    host_ids = ["host-1"]
    net = InProcessNetwork("corr-chunks", ["guest"] + host_ids, deadline=30, max_payload_bytes=3 * 4096 + 2000)
    guest = CorrelationGuest(net.transport("guest"), host_ids, Xg, cfg)
    host = CorrelationHost(net.transport("host-1"), "guest", Xh, cfg, feature_names=["secret_a", "secret_b"])
    assert guest.chunk_rows(guest.he.generate_keypair(512, True)[0]) < 10  # several chunks
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("host", host.run()), daemon=True)
    th.start()
    res = guest.run()
    th.join(30)
    m = res.matrices["host-1"]
    assert m.host_names == ["host-1:0", "host-1:1"]
    imputed_g = pd.DataFrame(Xg).fillna(pd.DataFrame(Xg).mean()).to_numpy()
    imputed_h = pd.DataFrame(Xh).fillna(pd.DataFrame(Xh).mean()).to_numpy()
    expected = _numpy_cross(imputed_g, imputed_h[:, :1])
    np.testing.assert_allclose(m.r[:, :1], expected, rtol=0, atol=1e-9)
    assert np.isnan(m.r[:, 1]).all()
    assert not net.mailbox("guest").rejected and not net.mailbox("host-1").rejected


def test_missing_nan_gives_numpy_nan_pattern():
    Xg, Xhs = _table(n=25, seed=5)
    Xg = Xg.copy()
    Xg[3, 2] = np.nan
    results, errors, _, _ = run_roles(Xg, Xhs[:1], CorrelationConfig(**KEY, missing="nan", reveal_to="host"))
    assert not errors, errors
    r = results["host-1"].matrices["host-1"].r
    with np.errstate(invalid="ignore"):
        expected = _numpy_cross(Xg, Xhs[0])  # numpy propagates the NaN through that column
    assert np.isnan(expected[2]).all() and np.isnan(r[2]).all()
    np.testing.assert_allclose(r[:2], expected[:2], rtol=0, atol=1e-9)


# --------------------------------------------------------------------------------------- lying peers
class Lying(InProcessTransport):
    """Replaces the payload of planned (tag, round) sends by ``fix(payload)``, delivered as if honest. The liar
    waits longer than its victim (``deadline``), so the victim's deadline is the one that ends the run."""

    def __init__(self, net, pid, plan, deadline=20.0):
        super().__init__(net, pid)
        self.plan = plan
        self.deadline = deadline

    def send(self, receiver, tag, payload, round=0, timeout=None):
        fix = self.plan.get((tag, round))
        if fix is not None:
            payload = fix(payload)
        super().send(receiver, tag, payload, round, timeout)


def _reshaped(p):
    bad = messages_pb2.EncryptedTensor()
    bad.CopyFrom(p)
    bad.shape[:] = [p.shape[1], p.shape[0]]  # transposed: same bytes, wrong shape
    return bad


def _exponent_off(p):
    bad = messages_pb2.EncryptedTensor()
    bad.CopyFrom(p)
    bad.exponent = 2 ** 31 - 1
    return bad


@pytest.mark.parametrize("tag,fix,needle", [
    (corr.TAG_RESULT, _reshaped, "shape"),
    (corr.TAG_RESULT, _exponent_off, "exponent 2147483647"),
])
def test_host_sending_a_bad_result_is_rejected_and_named(tag, fix, needle):
    Xg, Xhs = _table(n=20, seed=1)
    t0 = time.monotonic()
    results, errors, net, _ = run_roles(Xg, Xhs[:1], CorrelationConfig(**KEY), deadline=2.0,
                                        transports={"host-1": lambda net, pid: Lying(net, pid, {(tag, 1): fix})})
    assert time.monotonic() - t0 < 20  # never a hang
    assert isinstance(errors.get("guest"), PeerTimeout) and "'host-1'" in str(errors["guest"]), errors
    assert "guest" not in results
    (rec, reason), = net.mailbox("guest").rejected
    assert rec.sender == "host-1" and rec.tag == tag and needle in reason, reason


def test_host_announcing_too_many_columns_is_rejected():
    Xg, Xhs = _table(n=20, seed=1)

    def huge(p):
        bad = messages_pb2.Bundle()
        bad.CopyFrom(p)
        bad.scalars["p_h"] = 5000.0
        return bad

    cfg = CorrelationConfig(**KEY, max_features=50)
    results, errors, net, _ = run_roles(Xg, Xhs[:1], cfg, deadline=2.0,
                                        transports={"host-1": lambda net, pid: Lying(net, pid,
                                                                                     {(corr.TAG_HELLO, 0): huge})})
    assert isinstance(errors.get("guest"), PeerTimeout) and "'host-1'" in str(errors["guest"])
    (rec, reason), = net.mailbox("guest").rejected
    assert rec.tag == corr.TAG_HELLO and "p_h" in reason


def test_guest_sending_a_chunk_of_the_wrong_exponent_or_shape_is_rejected_by_the_host():
    Xg, Xhs = _table(n=20, seed=1)

    def off_by_one(p):
        bad = messages_pb2.EncryptedTensor()
        bad.CopyFrom(p)
        bad.exponent -= 1
        return bad

    results, errors, net, _ = run_roles(Xg, Xhs[:1], CorrelationConfig(**KEY), deadline=2.0,
                                        transports={"guest": lambda net, pid: Lying(net, pid,
                                                                                    {(corr.TAG_ZG, 1): off_by_one})})
    assert isinstance(errors.get("host-1"), PeerTimeout) and "'guest'" in str(errors["host-1"]), errors
    (rec, reason), = net.mailbox("host-1").rejected
    assert rec.tag == corr.TAG_ZG and "exponent" in reason


def test_host_rejects_a_setup_that_disagrees_with_its_config():
    Xg, Xhs = _table(n=20, seed=1)
    host_ids = ["host-1"]
    net = InProcessNetwork("corr-setup", ["guest"] + host_ids, deadline=2.0)
    guest = CorrelationGuest(net.transport("guest"), host_ids, Xg, CorrelationConfig(**KEY, reveal_to="guest"))
    host = CorrelationHost(net.transport("host-1"), "guest", Xhs[0], CorrelationConfig(**KEY, reveal_to="host"))
    _, errors = run_threads({r.party_id: r.run for r in (guest, host)}, timeout=30)
    assert isinstance(errors.get("host-1"), (PeerTimeout, JobAborted)), errors  # whichever deadline ends first
    assert isinstance(errors.get("guest"), (PeerTimeout, JobAborted)), errors
    (rec, reason), = net.mailbox("host-1").rejected
    assert rec.tag == corr.TAG_SETUP and "reveal_to" in reason


@pytest.mark.parametrize("reveal_to,refuser", [("guest", "host-1"), ("host", "guest")])
def test_the_party_that_does_not_learn_refuses_a_learner_with_too_many_columns(reveal_to, refuser):
    rng = np.random.default_rng(2)
    n = 9
    wide, narrow = rng.normal(size=(n, 5)), rng.normal(size=(n, 1))  # 8 > 2 x 5 fails, 8 > 2 x 1 passes
    Xg, Xh = (wide, narrow) if reveal_to == "guest" else (narrow, wide)
    cfg = CorrelationConfig(**KEY, reveal_to=reveal_to)
    results, errors, _, _ = run_roles(Xg, [Xh], cfg, deadline=10.0, guest_kwargs={})
    assert isinstance(errors.get(refuser), CorrelationRefused), errors
    other = "guest" if refuser == "host-1" else "host-1"
    assert isinstance(errors.get(other), JobAborted) and refuser in str(errors[other]), errors
    assert not results


# --------------------------------------------------------------------------------------- local parts
def test_standardise_columns_flags_constant_and_empty_columns():
    X = np.array([[1.0, 0.1, np.nan, 2.0], [2.0, 0.1, np.nan, np.nan], [4.0, 0.1, np.nan, 5.0]])
    Z, undefined = standardise_columns(X)
    assert undefined.tolist() == [False, True, True, False]
    np.testing.assert_allclose(Z[:, 0], (X[:, 0] - X[:, 0].mean()) / X[:, 0].std())
    assert (Z[:, 1:3] == 0).all()
    np.testing.assert_allclose(Z[:, 3], np.array([-1.5, 0.0, 1.5]) / np.sqrt(1.5))  # mean-imputed middle cell
    assert standardise_columns(X, "nan")[1].tolist() == [False, True, True, True]
    with pytest.raises(ValueError, match="infinite"):
        standardise_columns(np.array([[1.0], [np.inf]]))


def test_column_statistics_equal_pandas():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(50, 3))
    X[rng.random(50) < 0.2, 0] = np.nan
    X[:, 2] = rng.integers(0, 4, 50)
    names = ["a", "b", "cat"]
    qs = [0.01, 0.25, 0.5, 0.75, 0.99]
    rep = column_statistics(X, names, qs, categorical=["cat"])
    frame = pd.DataFrame(X, columns=names)
    desc = frame.describe(percentiles=qs)
    np.testing.assert_array_equal(rep["missing"], frame.isna().sum().to_numpy())
    np.testing.assert_array_equal(rep["unique"], frame.nunique().to_numpy())
    assert (rep["rows"] == 50).all()
    for col in ("a", "b"):
        for stat in ("mean", "std", "min", "max"):
            assert rep.loc[col, stat] == pytest.approx(desc.loc[stat, col], rel=1e-12)
        for q in qs:
            assert rep.loc[col, f"q{q:g}"] == pytest.approx(desc.loc[f"{q * 100:g}%", col], rel=1e-12)
    assert np.isnan(rep.loc["cat", "mean"]) and rep.loc["cat", "unique"] == 4
    with pytest.raises(ValueError, match="quantiles"):
        column_statistics(X, names, [1.5])


def test_okamoto_uchiyama_gives_the_same_matrix_to_the_host():
    """he_scheme ou (statistical masks): reveal_to host still equals numpy to 1e-9 (1024 bits: OU's minimum)."""
    Xg, Xhs = _table(n=30, seed=7)
    cfg = CorrelationConfig(key_bits=1024, insecure_test_key=True, he_scheme="ou", reveal_to="host")
    results, errors, _, _ = run_roles(Xg, Xhs[:1], cfg)
    assert not errors, errors
    assert results["guest"].matrices == {}
    np.testing.assert_allclose(results["host-1"].matrices["host-1"].r, _numpy_cross(Xg, Xhs[0]), rtol=0, atol=1e-9)
