"""Participant sets bound to the job, and server-side bounds on what was unmasked (issue: a lying server).

Attacks staged on real rounds (certificate identities, as over mutual TLS), each ending with the exact
result or a clear error naming the offender:
- the server lists itself, an outsider holding a job-CA certificate, or a duplicate as a participant;
- split survivor views with one colluding client at n = 3 under the default settings (and, as the
  control that shows the detector matters, the same attack succeeding with ``max_colluders: 0``);
- a client that skips clipping, and one whose weight word makes the total weight 0.
"""
from __future__ import annotations

import numpy as np
import pytest

from secureflhv.crypto import shamir
from secureflhv.crypto.quantise import QuantParams, quantise, rounding_rng
from secureflhv.crypto.secagg_primitives import private_from_int, prg
from secureflhv.horizontal.fl import PARTS_PER_ROUND, FLConfig, HorizontalClient, model_bundle
from secureflhv.horizontal.models import ModelSpec, build_model, get_flat, param_shapes
from secureflhv.horizontal.strategies import LocalTrainConfig, make_strategy
from secureflhv.proto import secagg_pb2 as pb
from secureflhv.secagg import (AggregationConfig, AggregationError, OutOfRangeRound, PlainClient,
                               SecAggClient, SecAggServer)
from secureflhv.secagg.bonawitz import TAG_MASKED, TAG_SIGN, TAG_UNMASK, mask_seed, share_points, survivors_bytes
from secureflhv.secagg.exchange import TAG_SERVER, collect
from secureflhv.transport.base import parse_message
from secureflhv.transport.codec import tensor_from_proto
from secureflhv.transport.inprocess import InProcessNetwork

import secagg_harness
from secagg_harness import config, expected_quantised, make_inputs, network, run_round

D = 40


# ------------------------------------------------------------------ participant lists the job does not allow
@pytest.mark.parametrize("kind", ["secagg", "plain_quantised"])
@pytest.mark.parametrize("listed, named", [(["client0", "server"], "'server'"),
                                           (["client0", "client1", "mallory"], "['mallory']"),
                                           (["client0", "client1", "client1"], "['client1']")])
def test_client_refuses_a_participant_list_outside_the_job(kind, listed, named):
    """The server announces a list with itself, an outsider (mallory holds a job-CA certificate) or a
    duplicate: the client refuses before sending anything, naming what it refused."""
    ids, xs, ws = make_inputs(3, D)
    net = network([*ids, "mallory"])
    cfg = config(kind=kind, job_clients=tuple(ids))
    cls = SecAggClient if kind == "secagg" else PlainClient
    with pytest.raises(AggregationError, match="refusing the participant list") as err:
        cls(net.transport("client0"), "server", cfg).submit(1, listed, xs["client0"], ws["client0"])
    assert named in str(err.value)
    assert net.sent_bytes == 0


def test_the_server_alone_cannot_read_an_update_by_playing_the_second_client():
    """The staged attack: n = 2, t = 2, the server announces [victim, "server"] and would play the second
    client itself. Even with the two-client opt-in (min_clients 2, max_colluders 0) the victim refuses
    to take part, naming the server; nothing reaches the server."""
    ids, xs, ws = make_inputs(2, D)
    cfg = config(min_clients=2, max_colluders=0, job_clients=tuple(ids))
    net = network(ids)
    with pytest.raises(AggregationError, match="names the aggregation server 'server'"):
        SecAggClient(net.transport("client0"), "server", cfg).submit(1, ["client0", "server"], xs["client0"], 1.0)
    assert net.sent_bytes == 0
    # the job's own two clients still aggregate exactly under the opt-in
    res, errors, *_ = run_round(cfg, ids, xs, ws)
    total, weight, _ = expected_quantised(cfg, 1, ids, ids, xs, ws)
    assert not errors and np.array_equal(res.total, total) and res.weight == weight


def test_horizontal_client_refuses_a_round_listing_the_server():
    """Through ``HorizontalClient.train_round`` with real certificates: the round bundle's participants
    name the server; the client trains locally but submits nothing and raises naming the server."""
    spec = ModelSpec(name="mlp", n_features=5, n_classes=3)
    net = InProcessNetwork("fl-bound", ["server", "c0", "c1", "c2"], cert_dir=secagg_harness.CERT_DIR)
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(16, 5)).astype(np.float32), rng.integers(0, 3, 16)
    agg = AggregationConfig(kind="secagg", job_clients=("c0", "c1", "c2"), input_timeout_s=2, stage_timeout_s=1)
    cfg = FLConfig(rounds=1, aggregation=agg, local=LocalTrainConfig(batch_size=8))
    client = HorizontalClient(net.transport("c0"), "server", X, y, X[:0], y[:0], spec, make_strategy("fedavg"), cfg)
    model = build_model(spec, seed=1)
    bundle = model_bundle(param_shapes(model), get_flat(model), command="train", participants="c0,server")
    with pytest.raises(AggregationError, match="names the aggregation server 'server'"):
        client.train_round(1, bundle)
    assert net.sent_bytes == 0


# ------------------------------------------------------------------ split survivor views with one colluder
class Colluder(SecAggClient):
    """A client working with the server: it hands over its signing key and every share it holds."""

    loot: dict = {}

    def _receive_shares(self, rnd, sharelist):
        super()._receive_shares(rnd, sharelist)
        Colluder.loot.update(held=rnd.held, signer=rnd.signer)


class CollusionServer(SecAggServer):
    """With colluder client2: shows the victim (client0) U3 = all three and the honest client1 U3 without
    the victim, forges the colluder's signature of both views, and tries to rebuild the victim's input
    from the victim's own b-share + the colluder's, and client1's s-share + the colluder's."""

    victim, honest, colluder = "client0", "client1", "client2"

    def masked_input_collection(self, rnd, live):
        self.masked = collect(self.t, live, TAG_MASKED, rnd.envelope(2), self.config.stage_timeout_s,
                              parse_message(pb.MaskedInput))
        rnd.u3 = sorted(self.masked)
        self.views = {c: rnd.u3 if c != self.honest else [v for v in rnd.u3 if v != self.victim] for c in live}
        for c in live:
            self.t.send(c, TAG_SERVER, pb.ServerMessage(round_id=rnd.round_id, stage=3, survivors=pb.ClientList(
                clients=self.views[c])), round=rnd.envelope(3))
        return live

    def consistency_check(self, rnd, live):
        sigs = collect(self.t, live, TAG_SIGN, rnd.envelope(3), self.config.stage_timeout_s,
                       parse_message(pb.ConsistencySignature))
        signer = Colluder.loot["signer"]
        for c in (self.victim, self.honest):
            view = self.views[c]
            forged = {c: sigs[c].signature, self.colluder: signer.sign(survivors_bytes(self.t.job_id, rnd.round_id, view))}
            self.t.send(c, TAG_SERVER, pb.ServerMessage(round_id=rnd.round_id, stage=4, signatures=pb.SignatureList(
                signatures=forged, survivors=view)), round=rnd.envelope(4))
        return live

    def unmasking(self, rnd, live):
        resp = collect(self.t, [self.victim, self.honest], TAG_UNMASK, rnd.envelope(4), self.config.stage_timeout_s,
                       parse_message(pb.UnmaskResponse))
        self.answers = sorted(resp)
        held = Colluder.loot["held"][self.victim]
        points = share_points(rnd.parts)
        b = {points[self.colluder]: held.b}
        s = {points[self.colluder]: held.s}
        for c, m in resp.items():
            b.update({points[c]: shamir.from_bytes(e.value) for e in m.b_shares if e.owner == self.victim})
            s.update({points[c]: shamir.from_bytes(e.value) for e in m.s_shares if e.owner == self.victim})
        self.shares = (len(b), len(s))
        self.recovered = None
        if min(len(b), len(s)) >= rnd.t:
            acc = tensor_from_proto(self.masked[self.victim].y, dtype=rnd.qp.word_dtype.str, what="y")
            seed = shamir.reconstruct(b, rnd.t).to_bytes(32, "big")
            acc -= prg(seed, acc.size, acc.dtype)
            s_v = private_from_int(shamir.reconstruct(s, rnd.t))
            for o in rnd.parts:
                if o != self.victim:
                    p = prg(mask_seed(s_v, rnd.adv[o].s_pk, self.t.job_id, rnd.round_id, self.victim, o), acc.size,
                            acc.dtype)
                    acc = acc - p if self.victim < o else acc + p
            self.recovered = acc & acc.dtype.type(rnd.qp.modulus_mask)
        raise AggregationError("the colluding server collected what it could")


def _collusion_round(cfg):
    """One round of 3 clients against :class:`CollusionServer` with client2 colluding; returns (server,
    client errors, inputs, weights)."""
    made = {}

    class Kept(CollusionServer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made["server"] = self
            self.recovered, self.shares = None, (0, 0)

    Colluder.loot = {}
    ids, xs, ws = make_inputs(3, D, seed=9)
    _, errors, *_ = run_round(cfg, ids, xs, ws, server_cls=Kept, client_classes={"client2": Colluder})
    return made["server"], errors, xs, ws


def test_split_views_with_one_colluder_at_n3_fail_under_the_default_settings():
    """Default max_colluders = 1 gives t = 3 at n = 3 (1 < 2t − 3): the victim sees only 2 valid
    signatures of its view and the honest client a survivor list below t, so both stop before unmasking;
    the server recovers nothing."""
    cfg = config(job_clients=("client0", "client1", "client2"))
    assert cfg.resolve_threshold(3) == 3
    server, errors, _, _ = _collusion_round(cfg)
    assert server.recovered is None and max(server.shares) < 3
    assert "consistency check failed" in str(errors["client0"]) and "fewer than t=3" in str(errors["client0"])
    assert "(U3), fewer than t=3" in str(errors["client1"])


def test_split_views_with_one_colluder_succeed_when_the_job_tolerates_none():
    """The control: with max_colluders = 0 and min_clients = 2 (t = 2 at n = 3, the old defaults) the same
    server and colluder rebuild the victim's exact quantised input, so the bound above is what stops it."""
    cfg = config(max_colluders=0, min_clients=2, job_clients=("client0", "client1", "client2"))
    assert cfg.resolve_threshold(3) == 2
    server, _, xs, ws = _collusion_round(cfg)
    qp = cfg.quant_params(3, D)
    truth, _ = quantise(xs["client0"], ws["client0"], qp, rounding_rng(cfg.seed, 1, "client0"))
    assert server.recovered is not None and np.array_equal(server.recovered.astype(np.uint64), truth)


# ------------------------------------------------------------------ inputs no honest client can produce
def unclipped(base):
    class Unclipped(base):
        """Skips clipping: quantises with a clip 10^4 times the job's."""

        def _encode(self, x, weight, qp, round_id):
            wide = QuantParams(qp.clip * 1e4, qp.scale, qp.max_weight, qp.k_bits)
            return quantise(x * 1e4, weight, wide, rounding_rng(None, round_id, self.party_id))[0]
    return Unclipped


def zero_total(base, others_weight_words):
    class ZeroTotal(base):
        """Writes the weight word that makes the total weight 0 (the others' weights are known)."""

        def _encode(self, x, weight, qp, round_id):
            words = super()._encode(x, weight, qp, round_id)
            words[-2] = np.uint64((-int(others_weight_words)) % (1 << qp.k_bits))
            return words
    return ZeroTotal


@pytest.mark.parametrize("kind", ["secagg", "plain_quantised"])
def test_an_unclipped_client_makes_the_round_out_of_range(kind):
    ids, xs, ws = make_inputs(4, D, seed=3)
    cfg = config(kind=kind, job_clients=tuple(ids))
    base = SecAggClient if kind == "secagg" else PlainClient
    res, errors, *_ = run_round(cfg, ids, xs, ws, client_classes={"client2": unclipped(base)})
    assert isinstance(res, OutOfRangeRound), res
    assert "exceed Σw·clip" in str(res) and "not clipped" in str(res)
    if kind == "plain_quantised":   # the server sees each input: it names the offender
        assert set(res.offenders) == {"client2"}
    else:                           # masked: only the sum is known
        assert res.offenders == {}


@pytest.mark.parametrize("kind", ["secagg", "plain_quantised"])
def test_a_weight_word_that_zeroes_the_total_is_refused_not_a_crash(kind):
    ids, xs, ws = make_inputs(3, D, seed=4)
    xs = {c: np.zeros(D) for c in ids}  # so that the coordinates stay within any bound: only the weight lies
    cfg = config(kind=kind, job_clients=tuple(ids))
    qp = cfg.quant_params(3, D)
    others = sum(int(quantise(xs[c], ws[c], qp, rounding_rng(cfg.seed, 1, c))[0][-2]) for c in ids[:2])
    base = SecAggClient if kind == "secagg" else PlainClient
    res, errors, *_ = run_round(cfg, ids, xs, ws, client_classes={"client2": zero_total(base, others)})
    assert isinstance(res, OutOfRangeRound), res
    if kind == "plain_quantised":   # its own weight word is negative: named
        assert set(res.offenders) == {"client2"} and "client2: total weight -" in str(res)
    else:
        assert "total weight 0 outside (0, " in str(res) and res.offenders == {}


def test_honest_inputs_at_the_clip_and_max_weight_pass_the_bounds():
    """Edge values: every coordinate at ±clip and the largest weight are never refused (and sum exactly)."""
    ids = [f"client{i}" for i in range(3)]
    xs = {c: np.where(np.arange(D) % 2 == 0, 5.0, -5.0) for c in ids}   # clipped to ±clip
    ws = {c: 1000.0 for c in ids}
    cfg = config(job_clients=tuple(ids), max_weight=1000.0)
    res, errors, *_ = run_round(cfg, ids, xs, ws)
    total, weight, clipped = expected_quantised(cfg, 1, ids, ids, xs, ws)
    assert not errors and np.array_equal(res.total, total) and res.weight == weight == 3000.0
    assert res.n_clipped == clipped == 3 * D


def test_fl_server_refuses_an_out_of_range_round_and_keeps_its_model():
    """Horizontal FL with a client that skips clipping in round 1 only: the server refuses round 1 (logged
    in the round's record, model unchanged, no crash) and round 2, honest, updates the model."""
    from fl_harness import run_fl
    from secureflhv.horizontal.models import ModelSpec

    spec = ModelSpec(name="mlp", n_features=6, n_classes=3)
    rng = np.random.default_rng(2)
    shards = [(rng.normal(size=(24, 6)).astype(np.float32), rng.integers(0, 3, 24)) for _ in range(3)]

    def prepare(server, clients):
        liar = clients[1].agg_clients["model"]

        class OnceUnclipped(unclipped(SecAggClient)):
            def _encode(self, x, weight, qp, round_id):
                if round_id // PARTS_PER_ROUND == 1:   # FL round 1's model part
                    return super()._encode(x, weight, qp, round_id)
                return SecAggClient._encode(self, x, weight, qp, round_id)
        liar.__class__ = OnceUnclipped

    models = []
    server, clients, errors = run_fl(shards, None, spec, "fedavg", "secagg", rounds=2, seed=1,
                                     cert_dir=secagg_harness.CERT_DIR, prepare=prepare,
                                     agg_kw=dict(job_clients=("c0", "c1", "c2")),
                                     on_round=lambda rec, vec: models.append(vec.copy()))
    assert not errors, errors
    first, second = server.history
    assert "out of range" in first.refused and "not clipped" in first.refused and first.survivors == []
    assert np.array_equal(models[0], server.initial[0])        # round 1's sum was never used
    assert second.refused == "" and second.survivors == ["c0", "c1", "c2"]
    assert np.all(np.isfinite(models[1])) and not np.array_equal(models[1], models[0])


def test_bounds_check_equals_the_signed_definition():
    """The unsigned-residue comparison of ``range_violation`` against the bounds written on signed integers."""
    from secureflhv.secagg.bounds import range_violation

    rng = np.random.default_rng(5)
    seen = set()
    for trial in range(400):
        n, d = int(rng.integers(1, 5)), 30
        k = int(rng.integers((n * 4 * (50 * 16 + 1) + 20).bit_length() + 1, 40))   # no honest sum wraps
        qp = QuantParams(clip=float(rng.choice([0.5, 1.0, 3.0])), scale=16.0, max_weight=50.0, k_bits=k)
        modulus = 1 << k
        weight = int(rng.integers(-5, n * (50 * 16 + 1) + 5))
        bound = qp.clip * (max(weight, 0) + n) + n
        signed = rng.integers(-int(bound) - 3, int(bound) + 4, d) if trial % 2 else rng.integers(-int(bound), int(bound) + 1, d)
        clipped = int(rng.integers(-2, n * d + 3))
        words = np.array([*(v % modulus for v in signed), weight % modulus, clipped % modulus], dtype=np.uint64)
        honest = (0 < weight <= n * (50 * 16 + 1) and 0 <= clipped <= n * d
                  and all(abs(int(v)) <= bound for v in signed))
        assert (range_violation(words, qp, n) is None) == honest, (k, n, weight, clipped, signed)
        seen.add(honest)
    assert seen == {True, False}
