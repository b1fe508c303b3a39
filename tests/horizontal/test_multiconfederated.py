"""MultiConfederated learning (Duchesne, Zhang, Talhi 2024), in-process: the divergence filter's rule, an
outlier peer excluded by it, hostile updates rejected, a dead peer named, forks and merges."""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mc_harness import config, cancer_shards, run_peers  # noqa: E402

from secureflhv.horizontal.fl import check_slots  # noqa: E402
from secureflhv.horizontal.fl import FLConfig  # noqa: E402
from secureflhv.horizontal.mc_peer import TAG_UPDATE, MultiConfederatedPeer  # noqa: E402
from secureflhv.horizontal.models import ModelSpec  # noqa: E402
from secureflhv.horizontal.mc_rules import divergence, divergence_filter, merge_pool, select
from secureflhv.horizontal.strategy_registry import make_strategy  # noqa: E402
from secureflhv.proto import messages_pb2  # noqa: E402
from secureflhv.transport.base import JobAborted, PeerTimeout, PeerUnavailable, ProtocolError  # noqa: E402
from secureflhv.transport.codec import tensor_to_proto  # noqa: E402
from secureflhv.transport.inprocess import InProcessNetwork, InProcessTransport  # noqa: E402


# ---------------------------------------------------------------------------------- the rules
def test_divergence_filter_is_median_plus_tolerance_std():
    rng = np.random.default_rng(0)
    local = rng.normal(size=50)
    peers = [local + rng.normal(scale=s, size=50) for s in (0.05, 0.07, 0.06, 0.08, 3.0)]  # the last: outlier
    d = np.array([np.linalg.norm(p - local) / np.linalg.norm(local) for p in peers])
    assert np.allclose([divergence(p, local) for p in peers], d, rtol=1e-12)
    for tol in (0.0, 0.5, 1.0, 2.0):
        expected = d <= np.median(d) + tol * np.std(d)
        assert divergence_filter(d, tol).tolist() == expected.tolist()
    assert divergence_filter(d, 1.0).tolist() == [True, True, True, True, False]
    for _ in range(50):  # random lists: always the numpy rule, and the smallest always passes
        ds, tol = rng.exponential(size=rng.integers(1, 9)), float(rng.uniform(0, 3))
        mask = divergence_filter(ds, tol)
        assert mask.tolist() == (ds <= np.median(ds) + tol * np.std(ds)).tolist() and mask[np.argmin(ds)]
    assert divergence_filter([], 1.0).size == 0 and divergence_filter([0.4], 0.0).tolist() == [True]


def test_selection_takes_the_sqrt_best_by_score_and_popularity():
    ids = ["m0", "m1", "m2", "m3", "m4"]
    scores = {"m0": 0.5, "m1": 0.9, "m2": 0.6, "m3": 0.6, "m4": 0.1}
    assert select(ids, scores, {}, 4, 0.1) == ["m1", "m2", "m3"]            # ⌈√5⌉ = 3, ties by id
    assert select(ids, scores, {"m0": 4}, 4, 0.2) == ["m1", "m0", "m2"]     # 0.5 + 0.2·4/4 = 0.7
    assert select(ids, scores, {}, 4, 0.1, must="m4") == ["m1", "m2", "m4"]  # a fresh fork is always trained


def test_merge_keeps_the_more_popular_and_averages():
    a = np.ones(4, np.float32)
    pool = {"m0": a, "m1": a * 1.001, "m2": -a}
    merged = merge_pool(pool, {"m1": 3, "m0": 1}, 0.01)
    assert merged == [("m1", "m0")] and sorted(pool) == ["m1", "m2"]
    assert np.allclose(pool["m1"], a * 1.0005)


def test_the_fl_server_and_clients_refuse_a_decentralised_strategy():
    with pytest.raises(ValueError, match="decentralised"):
        check_slots(make_strategy("multiconfederated", tolerance=0.5), FLConfig())


def test_a_peer_refuses_a_regression_model_and_bad_local_data(shards):
    (X, y), (X1, y1) = shards[0], shards[1]
    net = InProcessNetwork("mc-check", ["p0", "p1"], deadline=5.0)
    regression = ModelSpec(name="mlp", n_features=X.shape[1], task="regression")
    with pytest.raises(ValueError, match=r"p0: MultiConfederated .* classification models only"):
        MultiConfederatedPeer(net.transport("p0"), ["p0", "p1"], X, y.astype(float), X1, y1.astype(float),
                              regression, config())
    spec = ModelSpec(name="mlp", n_features=X.shape[1], n_classes=2)
    with pytest.raises(ValueError, match=r"p0: test labels must be integers in \[0, 2\)"):
        MultiConfederatedPeer(net.transport("p0"), ["p0", "p1"], X, y, X1, y1 + 5, spec, config())
    with pytest.raises(ValueError, match=r"p0: training data has shape .* \(model.n_features\)"):
        MultiConfederatedPeer(net.transport("p0"), ["p0", "p1"], X[:, :3], y, X1, y1, spec, config())


# ---------------------------------------------------------------------------------- runs
class Scaling(InProcessTransport):
    """A lying peer: every model it sends is its trained model × 40 (a valid, finite, hostile update)."""

    def send(self, receiver, tag, payload, round=0, timeout=None):
        if tag == TAG_UPDATE:
            b = messages_pb2.Bundle.FromString(payload.SerializeToString())
            for k, t in b.tensors.items():
                w = np.frombuffer(t.data, "<f4") * 40
                b.tensors[k].CopyFrom(tensor_to_proto(w, "<f4"))
            payload = b
        super().send(receiver, tag, payload, round, timeout)


@pytest.fixture(scope="module")
def shards():
    return cancer_shards(4)


def test_an_outlier_peer_is_excluded_and_the_others_learn_as_without_it(shards):
    cfg = config(rounds=2, popularity_weight=0.0, fork_margin=1.0, initial_models=2, max_models=4)
    peers, errors, _ = run_peers(shards, cfg, transport_of=lambda net, pid: Scaling(net, pid) if pid == "p3"
                                 else net.transport(pid))
    assert not errors, errors
    honest, _, _ = run_peers(shards[:3], cfg)  # the same three peers, no outlier
    for p, h in zip(peers[:3], honest):
        for rec in p.history:
            assert set(rec.rejected) == set(rec.trained)
            assert all(rec.rejected[m] == ["p3"] for m in rec.trained), rec.rejected
            for m in rec.trained:  # numpy's rule on the recorded divergences excludes p3 and only p3
                d = np.array(list(rec.divergences[m].values()))
                assert list(rec.divergences[m])[-1] == "p3" and (d <= np.median(d) + np.std(d)).tolist() == \
                    [True, True, False]
        assert sorted(p.pool) == sorted(h.pool)
        for m in p.pool:
            assert np.array_equal(p.pool[m], h.pool[m]), (p.party_id, m)


def _bad_updates(good: bytes, sender: str):
    """Hostile variants of an honest mc.update."""
    def edit(fn):
        b = messages_pb2.Bundle.FromString(good)
        fn(b)
        return b.SerializeToString()

    first = lambda b: next(iter(b.tensors))  # noqa: E731
    return {
        "nan": edit(lambda b: b.tensors[first(b)].CopyFrom(tensor_to_proto(
            np.full(np.frombuffer(b.tensors[first(b)].data, "<f4").size, np.nan), "<f4"))),
        "shape": edit(lambda b: b.tensors[first(b)].CopyFrom(tensor_to_proto(np.zeros(7), "<f4"))),
        "dtype": edit(lambda b: b.tensors[first(b)].CopyFrom(tensor_to_proto(
            np.frombuffer(b.tensors[first(b)].data, "<f4"), "<f8"))),
        "spoofed sender": edit(lambda b: b.text.__setitem__("sender", "p0" if sender != "p0" else "p2")),
        "unknown model": edit(lambda b: (b.text.__setitem__("models", "evil@1"),
                                         b.tensors["model/evil@1"].CopyFrom(b.tensors[first(b)]),
                                         [b.tensors.pop(k) for k in list(b.tensors) if k != "model/evil@1"])),
        "zero rows": edit(lambda b: b.scalars.__setitem__("n", 0.0)),
        "extra field": edit(lambda b: b.text.__setitem__("note", "x")),
        "garbage": b"\xff\x00garbage",
    }


def test_hostile_updates_are_rejected_logged_and_the_run_is_unchanged(shards, caplog):
    cfg = config(rounds=1)
    honest, errors, _ = run_peers(shards[:3], cfg)
    assert not errors
    variants = {}

    class Hostile(InProcessTransport):
        """p1 first sends each receiver a hostile variant, then (once it was rejected) its honest update."""

        def send(self, receiver, tag, payload, round=0, timeout=None):
            if tag == TAG_UPDATE:
                good = payload.SerializeToString()
                bad = _bad_updates(good, self.party_id)
                name = sorted(bad)[len(variants) % len(bad)]
                variants[receiver] = name
                from secureflhv.transport.base import Message
                self.network.inject_until_rejected(Message(self.job_id, round, self.party_id, receiver, tag, bad[name]))
            super().send(receiver, tag, payload, round, timeout)

    caplog.set_level("WARNING", logger="secureflhv.transport")
    peers, errors, net = run_peers(shards[:3], cfg, transport_of=lambda n, pid: Hostile(n, pid) if pid == "p1"
                                   else n.transport(pid))
    assert not errors, errors
    for p in ("p0", "p2"):
        rej = net.mailbox(p).rejected
        assert len(rej) == 1 and rej[0][0].sender == "p1" and "invalid payload" in rej[0][1], (p, variants[p], rej)
    assert sum("rejected a message from p1" in r.getMessage() for r in caplog.records) == 2
    for p, h in zip(peers, honest):
        assert all(np.array_equal(p.pool[m], h.pool[m]) for m in h.pool) and sorted(p.pool) == sorted(h.pool)


def test_every_hostile_variant_fails_the_parser(shards):
    peers, _, net = run_peers(shards[:2], config(rounds=1))
    p0 = peers[0]
    trained = {m: p0.pool[m] for m in ("m0", "m1")}
    good = p0.update_message(trained, 0.5).SerializeToString()
    parse = peers[1].parser("p0", 2)
    assert set(parse(good).models) == {"m0", "m1"}
    for name, bad in _bad_updates(good, "p0").items():
        try:
            parse(bad)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError is a plain Exception
            assert isinstance(exc, ProtocolError) or "Decode" in type(exc).__name__, (name, exc)
        else:
            pytest.fail(f"the parser accepted a hostile update ({name})")
    huge = messages_pb2.Bundle.FromString(good)
    huge.text["pad"] = "x" * peers[1].max_update_bytes
    with pytest.raises(ProtocolError, match="at most"):
        parse(huge.SerializeToString())
    too_many = messages_pb2.Bundle.FromString(good)
    too_many.text["models"] = "m0,m1,m0"
    with pytest.raises(ProtocolError, match="model ids"):
        parse(too_many.SerializeToString())


def test_a_dead_peer_stops_the_others_naming_it(shards):
    cfg = config(rounds=2, round_timeout_s=3.0, send_timeout_s=1.0)

    class Dies(InProcessTransport):
        """p2's process is killed before its round-2 update: it sends nothing more and tells nobody."""

        def send(self, receiver, tag, payload, round=0, timeout=None):
            if tag == TAG_UPDATE and round == 2:
                raise SystemExit("p2 killed")
            super().send(receiver, tag, payload, round, timeout)

        def abort(self, reason, peers):
            pass

    t0 = time.monotonic()
    peers, errors, _ = run_peers(shards[:3], cfg, transport_of=lambda n, pid: Dies(n, pid) if pid == "p2"
                                 else n.transport(pid))
    assert time.monotonic() - t0 < 3.0 + 20  # the deadline (3 s) plus training, not the 30 s default
    assert set(errors) == {"p0", "p1", "p2"}
    # each survivor stops naming the message and a peer: it cannot deliver its update to p2 (the process is
    # gone), times out waiting for p2's, or is told by the first survivor that stopped (JobAborted); a
    # survivor whose round-2 send races the other survivor's stop names that one instead (it is gone too)
    named = {}
    for p in ("p0", "p1"):
        assert isinstance(errors[p], (PeerTimeout, PeerUnavailable, JobAborted)), errors[p]
        assert "'mc.update' (round 2)" in str(errors[p]), errors[p]
        named[p] = [q for q in ("p0", "p1", "p2") if q != p and f"'{q}'" in str(errors[p])]
        assert named[p], errors[p]
    assert any("p2" in n for n in named.values()), errors  # the first to stop names the dead peer
    assert all(len(p.history) == 1 for p in peers[:2])


def test_peers_fork_when_the_aggregate_is_worse_and_forks_spread(shards):
    # two peers with opposite labels: each one's aggregate is bad on its own rows -> forks, and the
    # other peer adopts the fork in the next round
    (X0, y0), (X1, y1) = shards[:2]
    data = [(X0, y0), (X1, 1 - y1)]
    cfg = config(rounds=3, fork_margin=0.05, max_models=6, local=config().local.__class__(epochs=3, batch_size=16,
                                                                                         lr=0.1))
    peers, errors, _ = run_peers(data, cfg)
    assert not errors, errors
    forks = [rec.forked for p in peers for rec in p.history if rec.forked]
    assert forks, [vars(r) for p in peers for r in p.history]
    for p in peers:
        for f in forks:
            owner, r = f.split("@")
            if int(r) < cfg.rounds:  # announced in the next round: every peer holds it (unless merged)
                assert f in p.pool or any(f in pair for rec in p.history for pair in rec.merged), (p.party_id, f)
    assert all(np.all(np.isfinite(w)) for p in peers for w in p.pool.values())
    # what forking buys: both groups' personal models fit their own labels; one shared pool cannot
    single, errors, _ = run_peers(data, dataclasses.replace(cfg, fork_margin=1.0))
    assert not errors and not any(rec.forked for p in single for rec in p.history)
    forked_acc = [p.history[-1].test_accuracy for p in peers]
    single_acc = [p.history[-1].test_accuracy for p in single]
    assert min(forked_acc) >= 0.85 and min(single_acc) < 0.8, (forked_acc, single_acc)
