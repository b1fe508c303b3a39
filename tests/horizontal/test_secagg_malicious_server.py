"""A malicious aggregation server against honest clients (Bonawitz et al. CCS 2017, Sec. 6), each a real
attack on a real in-process round where every party has a CA-issued certificate identity: the clients
detect it and stop with an AggregationError naming the offence, the server never obtains both a
b-share and an s-share of one client, nothing hangs; attacks the protocol tolerates end with the
exact sum. Plus the configuration floors: t > n/2 and min_clients."""

import numpy as np
import pytest

from secureflhv.crypto.secagg_primitives import KeyPair
from secureflhv.proto import secagg_pb2 as pb
from secureflhv.secagg import STAGES, AggregationConfig, AggregationError, SecAggClient, SecAggServer
from secureflhv.secagg.bonawitz import TAG_MASKED, TAG_SIGN, TAG_UNMASK, advert_bytes
from secureflhv.secagg.exchange import TAG_SERVER, collect
from secureflhv.transport.base import MessageRejected, parse_message

from secagg_harness import RecordingTransport, config, expected_quantised, make_inputs, network, run_round

N, D = 6, 80  # t = 4


def server_message(payload) -> pb.ServerMessage:
    """A private copy of a server message (broadcasts share one object between receivers)."""
    data = payload if isinstance(payload, bytes) else payload.SerializeToString()
    return pb.ServerMessage.FromString(data)


def shares_received(st) -> tuple[set[str], set[str]]:
    """Owners of the b-shares and of the s-shares the server received in UnmaskResponses."""
    b, s = set(), set()
    for _, tag, payload in st.received:
        if tag == TAG_UNMASK:
            m = pb.UnmaskResponse.FromString(payload)
            b |= {e.owner for e in m.b_shares}
            s |= {e.owner for e in m.s_shares}
    return b, s


def tampering_server(ids, hook):
    """A network and a server transport whose outgoing messages pass through ``hook``."""
    net = network(ids)
    st = RecordingTransport(net, "server")
    st.send_hook = hook
    return net, st


@pytest.mark.parametrize("how", ["key_swapped", "resigned_by_server", "signature_stripped"])
def test_server_substituting_a_public_key_is_caught_by_the_signature(how):
    ids, xs, ws = make_inputs(N, D, seed=1)
    cfg = config()
    victim = ids[2]
    rogue = KeyPair().public

    def hook(receiver, tag, payload, round):
        if round % STAGES != 1:
            return payload
        msg = server_message(payload)
        for k in msg.keys.keys:
            if k.client_id == victim:
                k.advert.s_pk = rogue  # the server would know the pairwise masks with the victim
                if how == "resigned_by_server":
                    k.advert.certificate = st.identity.certificate
                    k.advert.signature = st.identity.sign(advert_bytes("job-secagg", 1, victim, k.advert))
                elif how == "signature_stripped":
                    k.advert.certificate, k.advert.signature = b"", b""
        return msg

    net, st = tampering_server(ids, hook)
    res, errors, *_ = run_round(cfg, ids, xs, ws, network=net, server_transport=st)
    assert isinstance(res, AggregationError)
    assert set(errors) == set(ids)  # every client stopped before sharing anything
    for c, err in errors.items():
        assert isinstance(err, AggregationError) and f"invalid advertisement of {victim!r}" in str(err), err
    assert not any(tag != "agg.advertise" for _, tag, _ in st.received)


class SplitViewServer(SecAggServer):
    """Shows half A the survivor set U3 and half B U3 minus the victim, forwards every signature to all,
    and collects whatever unmask answers come: without the ConsistencyCheck, A would reveal b-shares of
    the victim and B its s-shares (its input unmasked)."""

    victim = "client0"
    half_a = ("client0", "client1", "client2")

    def masked_input_collection(self, rnd, live):
        masked = collect(self.t, live, TAG_MASKED, rnd.envelope(2), self.config.stage_timeout_s,
                         parse_message(pb.MaskedInput))
        rnd.u3 = sorted(masked)
        self.views = {c: rnd.u3 if c in self.half_a else [v for v in rnd.u3 if v != self.victim] for c in live}
        for c in live:
            self.t.send(c, TAG_SERVER, pb.ServerMessage(round_id=rnd.round_id, stage=3, survivors=pb.ClientList(
                clients=self.views[c])), round=rnd.envelope(3))
        return live

    def consistency_check(self, rnd, live):
        if not self.config.consistency_check:
            return live
        sigs = collect(self.t, live, TAG_SIGN, rnd.envelope(3), self.config.stage_timeout_s,
                       parse_message(pb.ConsistencySignature))
        every = {c: m.signature for c, m in sigs.items()}
        for c in sigs:
            self.t.send(c, TAG_SERVER, pb.ServerMessage(round_id=rnd.round_id, stage=4, signatures=pb.SignatureList(
                signatures=every, survivors=self.views[c])), round=rnd.envelope(4))
        return live

    def unmasking(self, rnd, live):
        collect(self.t, live, TAG_UNMASK, rnd.envelope(4), self.config.stage_timeout_s, parse_message(pb.UnmaskResponse))
        raise AggregationError("the split-view server collected what it could")


def test_server_showing_two_halves_different_survivor_sets_is_caught_by_the_consistency_check():
    ids, xs, ws = make_inputs(N, D, seed=2)
    res, errors, clients, st, _ = run_round(config(), ids, xs, ws, server_cls=SplitViewServer)
    b, s = shares_received(st)
    assert not (b & s) and not b and not s  # no unmask answer at all, so no victim's both shares
    honest_signers = [c for c in ids if clients[c].included]
    assert honest_signers and all("consistency check failed" in str(errors[c]) for c in honest_signers)
    assert all(isinstance(e, AggregationError) for e in errors.values())


def test_without_the_consistency_check_the_split_view_attack_gets_both_shares_of_the_victim():
    """Control: the detector above works — with the check off (semi-honest setting) the same server
    receives b-shares and s-shares of the victim."""
    ids, xs, ws = make_inputs(N, D, seed=2)
    res, errors, clients, st, _ = run_round(config(consistency_check=False), ids, xs, ws, server_cls=SplitViewServer)
    b, s = shares_received(st)
    assert SplitViewServer.victim in (b & s)


def test_server_asking_for_unmasking_twice_is_refused():
    ids, xs, ws = make_inputs(N, D, seed=3)
    cfg = config()
    refusals = []

    class TwiceAsking(SecAggServer):
        def unmasking(self, rnd, live):
            super().unmasking(rnd, live)
            again = pb.ServerMessage(round_id=rnd.round_id, stage=4, signatures=pb.SignatureList(
                survivors=[c for c in rnd.u3 if c != ids[0]]))
            for c in live:
                try:
                    self.t.send(c, TAG_SERVER, again, round=rnd.envelope(4))
                except MessageRejected as exc:
                    refusals.append(str(exc))

    res, errors, clients, st, _ = run_round(cfg, ids, xs, ws, server_cls=TwiceAsking)
    total, weight, _ = expected_quantised(cfg, 1, ids, ids, xs, ws)
    assert np.array_equal(res.total, total) and res.weight == weight and not errors
    assert len(refusals) == N and all("stale or replayed" in r for r in refusals)
    answers = [s for s, tag, _ in st.received if tag == TAG_UNMASK]
    assert sorted(answers) == sorted(ids)  # one unmask answer per client
    b, s = shares_received(st)
    assert not (b & s)


@pytest.mark.parametrize("lie", ["outside_u2", "below_t", "changed_at_unmask"])
def test_server_lying_about_the_survivors_is_refused(lie):
    ids, xs, ws = make_inputs(N, D, seed=4)
    cfg = config()
    gone = ids[5]  # vanishes before ShareKeys: not in U2

    def hook(receiver, tag, payload, round):
        stage = round % STAGES
        if lie == "outside_u2" and stage == 3:
            msg = server_message(payload)
            msg.survivors.clients.append(gone)
            return msg
        if lie == "below_t" and stage == 3:
            msg = server_message(payload)
            keep = [receiver] + [c for c in msg.survivors.clients if c != receiver][:2]  # 3 < t = 4
            del msg.survivors.clients[:]
            msg.survivors.clients.extend(sorted(keep))
            return msg
        if lie == "changed_at_unmask" and stage == 4 and not msg_is_abort(payload):
            msg = server_message(payload)
            msg.signatures.survivors.remove(ids[0])
            return msg
        return payload

    net, st = tampering_server(ids, hook)
    res, errors, *_ = run_round(cfg, ids, xs, ws, network=net, server_transport=st, vanish={gone: 1})
    assert isinstance(res, AggregationError)
    honest = [c for c in ids if c != gone]
    expected = {"outside_u2": "not a subset of U2", "below_t": "survivor list (U3), fewer than t=4",
                "changed_at_unmask": "changed the survivor set"}[lie]
    assert all(expected in str(errors[c]) for c in honest), errors
    b, s = shares_received(st)
    assert not b and not s


def msg_is_abort(payload) -> bool:
    return server_message(payload).WhichOneof("body") == "abort"


# ------------------------------------------------------------------ configuration floors
def test_threshold_below_the_collusion_bound_is_a_configuration_error():
    with pytest.raises(ValueError, match=r"threshold fraction must be in \(1/2, 1\]"):
        AggregationConfig(threshold=0.5)
    with pytest.raises(ValueError, match="threshold must be >= 2"):
        AggregationConfig(threshold=1)
    with pytest.raises(ValueError, match="max_colluders must be an int >= 0"):
        AggregationConfig(max_colluders=-1)
    cfg = config(threshold=3)  # max_colluders = 1 by default: n = 6 needs t >= 4 (1 < 2t - 6)
    with pytest.raises(ValueError, match=r"threshold t=3 is invalid for n=6 .*max_colluders=1.* \[4, 6\]"):
        cfg.resolve_threshold(6)
    ids, xs, ws = make_inputs(N, D)
    net = network(ids)
    with pytest.raises(AggregationError, match="threshold t=3"):
        SecAggServer(net.transport("server"), cfg).aggregate(1, ids, D)
    with pytest.raises(AggregationError, match="threshold t=3"):
        SecAggClient(net.transport(ids[0]), "server", cfg).submit(1, ids, xs[ids[0]], ws[ids[0]])
    assert net.sent_bytes == 0  # refused before anything was sent
    for c in range(0, 4):  # every default t is the smallest with n_C < 2t - n (Bonawitz et al. Thm 6.5)
        for n in range(max(3, c + 2), 40):
            t = AggregationConfig(max_colluders=c).resolve_threshold(n)
            assert c < 2 * t - n and not c < 2 * (t - 1) - n and t <= n, (c, n, t)


def test_a_round_too_small_for_the_job_is_refused_by_server_and_client():
    with pytest.raises(ValueError, match="min_clients must be an int >= 2"):
        AggregationConfig(min_clients=1)
    for n, cfg, why in [(1, config(), "at least 3 are needed"), (2, config(), "at least 3 are needed"),
                        (3, config(min_clients=2, max_colluders=2), "at least 4 are needed"),
                        (1, config(min_clients=2, max_colluders=0), "at least 2 are needed")]:
        ids, xs, ws = make_inputs(n, D)
        net = network(ids)
        with pytest.raises(AggregationError, match=why):
            SecAggServer(net.transport("server"), cfg).aggregate(1, ids, D)
        with pytest.raises(AggregationError, match=why):
            SecAggClient(net.transport(ids[0]), "server", cfg).submit(1, ids, xs[ids[0]], ws[ids[0]])
        assert net.sent_bytes == 0
    ids, xs, ws = make_inputs(2, D)  # the explicit opt-in: two clients, no colluder tolerated
    cfg = config(min_clients=2, max_colluders=0)
    res, errors, *_ = run_round(cfg, ids, xs, ws)
    total, weight, _ = expected_quantised(cfg, 1, ids, ids, xs, ws)
    assert not isinstance(res, Exception) and np.array_equal(res.total, total) and res.weight == weight


def test_a_round_left_with_one_client_is_aborted():
    ids, xs, ws = make_inputs(3, D, seed=5)  # t = 2
    res, errors, *_ = run_round(config(), ids, xs, ws, vanish={ids[0]: 1, ids[1]: 1})
    assert isinstance(res, AggregationError) and "1 of 3" in str(res)
    assert "aborted" in str(errors[ids[2]])


def test_min_clients_above_t_is_enforced_by_the_server():
    ids, xs, ws = make_inputs(4, D, seed=6)
    cfg = config(threshold=3, min_clients=4)
    res, errors, *_ = run_round(cfg, ids, xs, ws, vanish={ids[1]: 2})
    assert isinstance(res, AggregationError) and "min_clients=4" in str(res)


def test_client_refuses_a_key_list_smaller_than_its_min_clients():
    """A server that ignores min_clients (configured with 2) relays 3 of 4 advertisements; the clients,
    configured with min_clients=4, refuse before sending any share."""
    ids, xs, ws = make_inputs(4, D, seed=7)
    server_cfg, client_cfg = config(threshold=3), config(threshold=3, min_clients=4)

    def hook(receiver, tag, payload, round):
        if round % STAGES != 1:
            return payload
        msg = server_message(payload)
        kept = [k for k in msg.keys.keys if k.client_id != ids[3]]
        del msg.keys.keys[:]
        msg.keys.keys.extend(kept)
        return msg

    net, st = tampering_server(ids, hook)
    res, errors, *_ = run_round(server_cfg, ids, xs, ws, network=net, server_transport=st,
                                client_configs={c: client_cfg for c in ids})
    assert isinstance(res, AggregationError)
    assert all("min_clients=4" in str(errors[c]) and "(U1)" in str(errors[c]) for c in ids[:3]), errors
    assert not any(tag == "agg.share" for _, tag, _ in st.received)
