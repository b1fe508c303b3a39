"""Vertical SecureBoost: equals an independent numpy twin (tests/tree/numpy_gbdt.py: its own quantile cuts of
the pooled columns, its own base margin, float64 gradients) under every vertical feature split of
secureflhv.data (even, random, explicit, overlap), every objective, early stopping and federated
prediction; rejects bad histograms; stops with a clear error when a host dies. With a sample overlap
(PSI in the job): tests/runtime/test_secureboost_vertical_psi.py.

Small Paillier keys (512 bits, insecure_test_key=True) and the worker pool off (threads only) keep it fast.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris

import numpy_gbdt as twin
from sb_harness import assert_trees_equal_twin, vertical_nodes, vertical_run, vertical_structure
from secureflhv.crypto.homomorphic import paillier as pl
from secureflhv.data import load_sklearn, vertical_split
from secureflhv.data.partition.features import VERTICAL_SCHEMES
from secureflhv.proto import tree_pb2
from secureflhv.transport import Message
from secureflhv.tree.binning import fit_cuts
from secureflhv.tree.params import SecureBoostParams
from secureflhv.tree.vertical import ROW_PART_WINDOW, TAG_HIST, SecureBoostError, part_rows


@pytest.fixture(autouse=True, scope="module")
def _inline_paillier():
    pl.set_workers(1)
    yield
    pl.set_workers(None)


KEY = pl.generate_keypair(512, insecure_test_key=True)


def _params(**kw):
    base = dict(n_trees=3, max_depth=3, max_bin=12, learning_rate=0.3, key_bits=512, insecure_test_key=True)
    base.update(kw)
    return SecureBoostParams(**base)


def _assert_twin(run, X, y, col_groups, params, X_val=None, y_val=None, X_pred=None):
    """The run's model equals the numpy twin on the joined columns (guest's, then each host's): cuts, base
    margin, trees (split feature, bin, threshold, default direction; leaves), validation losses, predictions."""
    assert not run["errors"], run["errors"]
    guest, hosts = run["guest"], run["hosts"]
    order = np.concatenate(col_groups)
    Xo = X[:, order]
    cuts = [twin.quantile_cuts(Xo[:, j], params.max_bin) for j in range(Xo.shape[1])]
    for j, (got, want) in enumerate(zip(guest.cuts + [c for h in hosts for c in h.cuts], cuts, strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"joined column {j}: party's cuts != twin's")
    ref = twin.fit(Xo, y, cuts, twin.Config.of(params), X_val=None if X_val is None else X_val[:, order], y_val=y_val)
    fed = run["result"].model
    np.testing.assert_allclose(fed.base_margin, ref.base, rtol=1e-12, atol=0)
    tables = [(h.party_id, len(c), h.records) for h, c in zip(hosts, col_groups[1:])]
    assert_trees_equal_twin([(t.output, vertical_nodes(t, len(col_groups[0]), tables)) for t in fed.trees], ref)
    assert fed.val_losses == pytest.approx(ref.val_losses, rel=1e-6)
    assert fed.best_round == ref.best_round
    if X_pred is not None:
        np.testing.assert_allclose(run["pred"], ref.predict_margin(X_pred[:, order]), rtol=0, atol=1e-5)
    return ref


SPLIT_ARGS = {"overlap": {"shared_fraction": 0.2},
              "explicit": {"columns": [[0, 5, 7, 21, 22, 27], [1, 2, 3, 10, 11, 12, 13, 20], [4, 6, 8, 9, 14, 15, 16,
                                                                                               17, 18, 19, 23, 24,
                                                                                               25, 26, 28, 29]]}}


@pytest.mark.parametrize("scheme", VERTICAL_SCHEMES)
def test_vertical_equals_numpy_twin_for_every_feature_split(scheme):
    ds = load_sklearn("breast_cancer")
    vp = vertical_split(ds, 2, scheme, seed=3, **SPLIT_ARGS.get(scheme, {}))
    col_groups = [np.asarray(c) for c in vp.columns]
    X, y = ds.X.astype(np.float64), ds.y
    params = _params()
    run = vertical_run(X, y, col_groups, params, X_pred=X[:150], keypair=KEY)
    _assert_twin(run, X, y, col_groups, params, X_pred=X[:150])
    # the model is a real classifier, and the hosts' splits are used
    owners = {n.owner for t in run["result"].model.trees for n in t.nodes.values() if not n.leaf}
    assert owners - {"guest"}, "no host split was chosen: the test would not exercise the encrypted path"
    acc = np.mean((run["pred"][:, 0] > 0) == y[:150])
    assert acc > 0.9


def test_vertical_multiclass_and_regression_equal_twin():
    X, y = load_iris(return_X_y=True)
    cols = [np.array([0]), np.array([1, 2]), np.array([3])]
    params = _params(objective="multiclass", n_classes=3, n_trees=2)
    run = vertical_run(X, y, cols, params, X_pred=X, keypair=KEY)
    _assert_twin(run, X, y, cols, params, X_pred=X)
    assert np.mean(np.argmax(run["pred"], axis=1) == y) > 0.9

    Xd, yd = load_diabetes(return_X_y=True)
    cols = [np.arange(0, 3), np.arange(3, 7), np.arange(7, 10)]
    params = _params(objective="regression", n_trees=3, reg_lambda=2.0, min_child_weight=3.0, gamma=1e4)
    run = vertical_run(Xd, yd, cols, params, X_pred=Xd[:50], keypair=KEY)
    ref = _assert_twin(run, Xd, yd, cols, params, X_pred=Xd[:50])
    # gamma prunes: some node that had rows to split ended as a leaf in both models
    assert any(n[0] == "leaf" and t.rows[nid] >= 2 for t in ref.trees for nid, n in t.nodes.items()
               if int(np.log2(nid + 1)) < params.max_depth)


def test_vertical_early_stopping_matches_twin():
    X, y = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(0)
    y_noisy = np.where(rng.random(len(y)) < 0.3, 1 - y, y)  # noisy labels: validation loss turns up
    tr, va = np.arange(0, 400), np.arange(400, 569)
    cols = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    params = _params(n_trees=12, max_depth=4, learning_rate=0.8, early_stopping_rounds=2, min_child_weight=0.0)
    run = vertical_run(X[tr], y_noisy[tr], cols, params, X_val=X[va], y_val=y[va], keypair=KEY)
    ref = _assert_twin(run, X[tr], y_noisy[tr], cols, params, X_val=X[va], y_val=y[va])
    model = run["result"].model
    assert run["result"].stopped_early
    assert len(model.val_losses) < 12 and len(model.trees) == model.best_round + 1
    assert model.val_losses[model.best_round] == min(model.val_losses)
    assert ref.best_round == model.best_round


def test_identity_backend_builds_the_same_trees():
    X, y = load_breast_cancer(return_X_y=True)
    cols = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    params = _params(n_trees=2)
    enc = vertical_run(X, y, cols, params, keypair=KEY)
    plain = vertical_run(X, y, cols, params, backend="identity")
    assert not enc["errors"] and not plain["errors"]
    for a, b in zip(enc["result"].model.trees, plain["result"].model.trees):
        assert vertical_structure(enc["guest"], enc["hosts"], a, cols) == \
            vertical_structure(plain["guest"], plain["hosts"], b, cols)
        assert all(a.nodes[i].value == b.nodes[i].value for i in a.nodes if a.nodes[i].leaf)


class _CorruptFirstHistogram:
    """Transport wrapper of a host: its first histogram message goes out corrupted (then the real one)."""

    def __init__(self, inner, net, corrupt):
        self.inner, self.net, self.corrupt, self.done = inner, net, corrupt, False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def send(self, receiver, tag, payload, round=0, timeout=None):
        if tag == TAG_HIST and not self.done:
            self.done = True
            box = self.net.mailbox(receiver)
            before = len(box.rejected)
            bad = self.corrupt(tree_pb2.SbHistograms.FromString(payload.SerializeToString()))
            self.net.inject(Message(self.inner.job_id, round, self.inner.party_id, receiver, tag,
                                    bad.SerializeToString()))
            deadline = time.monotonic() + 30
            while len(box.rejected) == before and time.monotonic() < deadline:
                time.sleep(0.01)
        return self.inner.send(receiver, tag, payload, round=round, timeout=timeout)


def _other_key(msg):
    other, _ = pl.generate_keypair(512, insecure_test_key=True)
    msg.sums.key_fingerprint = other.fingerprint
    return msg


def _wrong_shape(msg):
    w = msg.sums.byte_width
    msg.sums.ciphertexts = msg.sums.ciphertexts[:-w]
    msg.sums.shape[0] = msg.sums.shape[0] - 1
    return msg


@pytest.mark.parametrize("corrupt, reason", [(_other_key, "key_fingerprint"), (_wrong_shape, "shape")])
def test_histogram_under_other_key_or_wrong_shape_is_rejected(corrupt, reason):
    X, y = load_breast_cancer(return_X_y=True)
    cols = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    params = _params(n_trees=1, max_depth=2)
    wrap = {"host-2": lambda tr, net: _CorruptFirstHistogram(tr, net, corrupt)}
    run = vertical_run(X, y, cols, params, host_wrappers=wrap, keypair=KEY)
    rejected = run["net"].mailbox("guest").rejected
    assert any(m.sender == "host-2" and m.tag == TAG_HIST and reason in why for m, why in rejected), rejected
    # the bad message changed nothing: training finished and equals the twin
    _assert_twin(run, X, y, cols, params)


class _CorruptFirstDerivation(_CorruptFirstHistogram):
    """Corrupts the host's first histogram message with a derived node; records every message it sends."""

    def __init__(self, inner, net, corrupt, sent):
        super().__init__(inner, net, corrupt)
        self.done, self.sent, self.armed = True, sent, True

    def send(self, receiver, tag, payload, round=0, timeout=None):
        if tag == TAG_HIST:
            self.sent.append(tree_pb2.SbHistograms.FromString(payload.SerializeToString()))
            if self.armed and any(x.derived for x in payload.nodes):
                self.armed = self.done = False  # the base class corrupts this one
        return super().send(receiver, tag, payload, round=round, timeout=timeout)


def _first_derived(msg):
    return next(x for x in msg.nodes if x.derived)


def _parent_out_of_range(msg):
    _first_derived(msg).parent_candidate[0] = 10_000
    return msg


def _not_flagged(msg):
    x = _first_derived(msg)
    x.derived = False
    return msg


def _short_derivation(msg):
    del _first_derived(msg).sibling_candidate[-1]
    return msg


@pytest.mark.parametrize("corrupt, reason", [(_parent_out_of_range, "beyond the parent"),
                                             (_not_flagged, "the plan says"), (_short_derivation, "entries for")])
def test_a_derivation_that_lies_is_rejected_and_derived_nodes_carry_no_sums(corrupt, reason):
    """A derived node's sums are the parent's minus the sibling's, found by the guest from index lists;
    the host compresses and the guest decrypts only the built nodes. Bad index lists are rejected."""
    X, y = load_breast_cancer(return_X_y=True)
    cols = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    params = _params(n_trees=1, max_depth=3)
    sent = []
    wrap = {"host-2": lambda tr, net: _CorruptFirstDerivation(tr, net, corrupt, sent)}
    run = vertical_run(X, y, cols, params, host_wrappers=wrap, keypair=KEY)
    rejected = run["net"].mailbox("guest").rejected
    assert any(m.sender == "host-2" and m.tag == TAG_HIST and reason in why for m, why in rejected), rejected
    _assert_twin(run, X, y, cols, params)
    per = run["guest"].he.pair_sums(KEY[0], 24, 0, len(y)).per
    derived = [x for m in sent for x in m.nodes if x.derived]
    assert derived and all(len(x.parent_candidate) == len(x.sibling_candidate) == x.n_candidates for x in derived)
    for m in sent:
        assert m.sums.shape[0] == sum(-(-x.n_candidates // per) for x in m.nodes if not x.derived)


class _DieAtDepth:
    """Transport wrapper that takes its host down when it waits for the plan of tree 1, depth 1.

    A killed process tells nobody: ``abort`` does nothing, so the guest must notice by itself."""

    def __init__(self, inner, net):
        self.inner, self.net = inner, net

    def abort(self, reason, peers):
        pass

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def recv(self, sender, tag, round=0, timeout=None, parse=None):
        if tag == "sb.plan" and round == 64 + 2:  # tree 1, depth 1
            self.net.take_down(self.inner.party_id)
            raise SystemExit("host-1 killed")
        return self.inner.recv(sender, tag, round=round, timeout=timeout, parse=parse)


def test_host_killed_mid_tree_stops_job_naming_it():
    X, y = load_breast_cancer(return_X_y=True)
    cols = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    params = _params(n_trees=3)
    run = vertical_run(X, y, cols, params, host_wrappers={"host-1": _DieAtDepth}, deadline=3.0, keypair=KEY)
    err = run["errors"].get("guest")
    assert isinstance(err, SecureBoostError), run["errors"]
    assert "host-1" in str(err) and "tree 1" in str(err)
    # the other host was told and stopped too, rather than hanging
    assert "host-2" in run["errors"]


def test_row_pairs_travel_in_acknowledged_parts_within_a_small_message_limit():
    """569 rows of 128-byte ciphertexts (73 kB per host and tree) under a 24 KiB message limit: one
    message holding every row (as before the row parts) would be refused; now each tree's rows go in
    36 parts of 16 rows, at most ROW_PART_WINDOW unacknowledged, and the model still equals its twin."""
    X, y = load_breast_cancer(return_X_y=True)
    cols = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    params = _params(n_trees=2)
    limit = 24 << 10
    assert len(X) * KEY[0].byte_width > limit
    run = vertical_run(X, y, cols, params, keypair=KEY, max_payload_bytes=limit)
    _assert_twin(run, X, y, cols, params)
    rows = part_rows(len(X), KEY[0].byte_width, limit)
    assert rows == 16
    for host in ("host-1", "host-2"):
        tags = run["net"].wire_stats()["guest"][host]["by_tag"]
        assert tags["sb.rows"]["messages_sent"] == 2 * -(-len(X) // rows) == 72
        assert tags["sb.rows_ack"]["messages_received"] == 72
    assert ROW_PART_WINDOW < 36  # so the guest waited for acknowledgements before sending on


def test_guest_cuts_are_float32_quantiles():
    X, _ = load_breast_cancer(return_X_y=True)
    cuts = fit_cuts(X, 16)
    assert all(len(c) <= 15 and np.all(np.diff(c) > 0) for c in cuts)
    assert all(np.all(c.astype(np.float32).astype(np.float64) == c) for c in cuts)


def test_okamoto_uchiyama_equals_centralised_twin():
    """he_scheme: ou: GH packing, histogram subtraction and compression under OU give the twin's trees."""
    pytest.importorskip("heu", reason="sf-heu is a linux dependency of the OU scheme")
    from secureflhv.crypto.homomorphic import ou
    keypair = ou.generate_keypair(1024, insecure_test_key=True)
    ds = load_sklearn("breast_cancer")
    vp = vertical_split(ds, 2, "random", seed=5)
    col_groups = [np.asarray(c) for c in vp.columns]
    X, y = ds.X.astype(np.float64), ds.y
    params = _params(he_scheme="ou", key_bits=1024)
    run = vertical_run(X, y, col_groups, params, X_pred=X[:100], keypair=keypair, backend=None)
    assert run["guest"].he.name == "ou" and all(h.he.name == "ou" for h in run["hosts"])
    _assert_twin(run, X, y, col_groups, params, X_pred=X[:100])
    owners = {n.owner for t in run["result"].model.trees for n in t.nodes.values() if not n.leaf}
    assert owners - {"guest"}, "no host split: the OU histograms were not exercised"
    Xi, yi = load_iris(return_X_y=True)
    cols = [np.array([0]), np.array([1, 2]), np.array([3])]
    params = _params(he_scheme="ou", key_bits=1024, objective="multiclass", n_classes=3, n_trees=2)
    _assert_twin(vertical_run(Xi, yi, cols, params, keypair=keypair, backend=None), Xi, yi, cols, params)


def test_a_guest_given_a_prefetched_key_trains_under_it():
    """The job runner hands the guest a Future of its key pair (generated while PSI runs)."""
    from secureflhv.crypto.homomorphic.key_prefetch import prefetch_keypair

    rng = np.random.default_rng(5)
    X = rng.normal(size=(200, 4))
    y = (X[:, 0] + X[:, 2] > 0).astype(float)
    params = _params(n_trees=1, max_depth=2, max_bin=8)
    fut = prefetch_keypair("paillier", 512, insecure_test_key=True)
    col_groups = [np.array([0, 1]), np.array([2, 3])]
    run = vertical_run(X, y, col_groups, params, keypair=fut)
    _assert_twin(run, X, y, col_groups, params)
    assert run["guest"].pub == fut.result()[0] and all(h.pub == fut.result()[0] for h in run["hosts"])
