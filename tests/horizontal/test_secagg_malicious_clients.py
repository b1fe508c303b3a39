"""Dishonest clients against secure aggregation (Bonawitz et al. CCS 2017, Sec. 6), each a real attack
on a real in-process round with certificate identities: the round ends with the EXACT sum (compared
with plain_quantised under the same seed) and the offender named, or with an AggregationError naming
the offender — never a wrong sum, a hang, or an honest client crashing."""
import logging

import numpy as np
import pytest

from secureflhv.crypto import shamir
from secureflhv.crypto.secagg_primitives import KeyPair, new_seed
from secureflhv.secagg import AggregationError, SecAggClient, SecAggServer
from secureflhv.secagg.bonawitz import STAGE_NAMES
from secureflhv.secagg.bonawitz_client import _HeldShares

from secagg_harness import RecordingTransport, config, expected_quantised, make_inputs, network, run_round

N, D = 6, 120  # t = 4
LOW_ORDER = bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800")  # order 8


def assert_exact(res, cfg, ids, survivors, xs, ws, round_id=1):
    assert not isinstance(res, Exception), res
    total, weight, _ = expected_quantised(cfg, round_id, ids, survivors, xs, ws)
    assert res.survivors == sorted(survivors)
    assert np.array_equal(res.total, total) and res.weight == weight


def shifting_client(kind: str, owner_pick=0):
    """A client that adds 1 to one of its ``kind`` ("b"/"s") shares in its UnmaskResponse."""
    class Shifting(SecAggClient):
        def _send(self, round_id, stage, tag, msg):
            if stage == 4:
                entries = msg.b_shares if kind == "b" else msg.s_shares
                e = entries[owner_pick]
                e.value = shamir.to_bytes((shamir.from_bytes(e.value) + 1) % shamir.PRIME)
            super()._send(round_id, stage, tag, msg)
    return Shifting


@pytest.mark.parametrize("kind", ["b", "s"])
def test_shifted_share_at_unmasking_is_dropped_and_the_sum_stays_exact(kind, caplog):
    ids, xs, ws = make_inputs(N, D, seed=1)
    cfg = config()
    liar = ids[1]
    vanish = {ids[4]: 2} if kind == "s" else {}  # s-shares are asked for a client dropped before its input
    with caplog.at_level(logging.WARNING, logger="secureflhv.secagg.bonawitz"):
        res, errors, *_ = run_round(cfg, ids, xs, ws, vanish=vanish, client_classes={liar: shifting_client(kind)})
    survivors = [c for c in ids if c not in vanish]
    assert_exact(res, cfg, ids, survivors, xs, ws)  # the liar's own input is unmasked from the others' shares
    assert list(res.offenders) == [liar] and "commitments" in res.offenders[liar]
    assert any(liar in r.getMessage() and STAGE_NAMES[4] in r.getMessage() for r in caplog.records)
    assert set(errors) == set(vanish)


def test_too_many_liars_leave_fewer_than_t_valid_shares_and_the_error_names_them():
    ids, xs, ws = make_inputs(4, D, seed=2)  # t = 3
    cfg = config()
    liars = [ids[0], ids[2]]
    res, errors, *_ = run_round(cfg, ids, xs, ws, client_classes={c: shifting_client("b") for c in liars})
    assert isinstance(res, AggregationError)
    assert STAGE_NAMES[4] in str(res) and "t=3" in str(res) and all(c in str(res) for c in liars)
    assert not errors


def test_share_not_matching_its_commitment_is_refused_by_the_recipient():
    """The dealer's commitments to one recipient's share are of another value than the share it
    encrypts: the recipient refuses the share (logs the dealer), the others' shares recover the dealer's
    secrets, the sum is exact."""
    ids, xs, ws = make_inputs(N, D, seed=3)
    cfg = config()
    dealer, victim = ids[2], ids[5]

    class BadDealer(SecAggClient):
        def _commit(self, rnd, holder, pair):  # commits to a shifted b-share for the victim only
            if holder == victim:
                pair = _HeldShares((pair.b + 1) % shamir.PRIME, pair.s)
            return super()._commit(rnd, holder, pair)

    res, errors, clients, *_ = run_round(cfg, ids, xs, ws, client_classes={dealer: BadDealer})
    assert_exact(res, cfg, ids, ids, xs, ws)
    rej = clients[victim].rejected
    assert len(rej) == 1 and dealer in rej[0][1]
    assert not errors


def test_shares_matching_commitments_but_off_the_polynomial_fail_naming_the_dealer():
    """The dealer's committed shares are of a seed other than the b_u it committed to (and masks with):
    the reconstruction is caught by the commitment; the error names the dealer, no wrong sum."""
    ids, xs, ws = make_inputs(N, D, seed=4)
    cfg = config()
    dealer = ids[3]

    class OffPolynomial(SecAggClient):
        def share_keys(self, rnd):
            real, rnd.b_seed = rnd.b_seed, new_seed()
            try:
                super().share_keys(rnd)
            finally:
                rnd.b_seed = real

    res, errors, *_ = run_round(cfg, ids, xs, ws, client_classes={dealer: OffPolynomial})
    assert isinstance(res, AggregationError), res
    assert dealer in str(res) and "self-mask seed" in str(res)
    assert not errors


def test_mask_key_shares_of_a_dropped_dealer_off_the_polynomial_fail_naming_it():
    ids, xs, ws = make_inputs(N, D, seed=5)
    cfg = config()
    dealer = ids[0]

    class OffPolynomialThenGone(SecAggClient):
        def share_keys(self, rnd):
            real, rnd.sk = rnd.sk, KeyPair()
            try:
                super().share_keys(rnd)
            finally:
                rnd.sk = real

        def _on_stage(self, stage):
            if stage == 2:
                self.t.network.take_down(self.party_id)
                raise AggregationError("gone")

    res, errors, *_ = run_round(cfg, ids, xs, ws, client_classes={dealer: OffPolynomialThenGone})
    assert isinstance(res, AggregationError), res
    assert dealer in str(res) and "mask key" in str(res)
    assert set(errors) == {dealer}


def bad_key_client(mutate):
    class BadKeys(SecAggClient):
        def advertise_keys(self, rnd):
            mutate(self, rnd)
            super().advertise_keys(rnd)
    return BadKeys


SHARED = KeyPair()


@pytest.mark.parametrize("attack", ["low_order_c", "low_order_s", "zero_s", "short_c", "same_c_and_s"])
def test_client_advertising_an_invalid_key_is_refused_and_the_round_completes(attack):
    ids, xs, ws = make_inputs(N, D, seed=6)
    cfg = config()
    bad = ids[2]

    def mutate(cli, rnd):
        if attack == "low_order_c":
            rnd.ck.public = LOW_ORDER
        elif attack == "low_order_s":
            rnd.sk.public = bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f")
        elif attack == "zero_s":
            rnd.sk.public = bytes(32)
        elif attack == "short_c":
            rnd.ck.public = rnd.ck.public[:31]
        else:
            rnd.sk = rnd.ck

    res, errors, *_ = run_round(cfg, ids, xs, ws, client_classes={bad: bad_key_client(mutate)})
    assert_exact(res, cfg, ids, [c for c in ids if c != bad], xs, ws)
    assert list(res.offenders) == [bad] and res.dropped_at == {bad: STAGE_NAMES[0]}
    assert set(errors) == {bad} and "refused" in str(errors[bad])  # told at once, no hang


def test_two_clients_advertising_the_same_key_are_both_refused():
    ids, xs, ws = make_inputs(N, D, seed=7)
    cfg = config()
    pair = [ids[1], ids[4]]

    def mutate(cli, rnd):
        rnd.sk = SHARED
    res, errors, *_ = run_round(cfg, ids, xs, ws, client_classes={c: bad_key_client(mutate) for c in pair})
    assert_exact(res, cfg, ids, [c for c in ids if c not in pair], xs, ws)
    assert sorted(res.offenders) == pair and all("advertised by" in r for r in res.offenders.values())
    assert set(errors) == set(pair)


def test_client_reusing_its_keys_of_an_earlier_round_is_refused():
    ids, xs, ws = make_inputs(N, D, seed=8)
    cfg = config()
    reuser = ids[3]
    kept = {}

    class Reusing(SecAggClient):
        def advertise_keys(self, rnd):
            if "sk" in kept:
                rnd.sk = kept["sk"]
            kept["sk"] = rnd.sk
            super().advertise_keys(rnd)

    net = network(ids)
    server = SecAggServer(RecordingTransport(net, "server"), cfg)  # one server across rounds: it remembers keys
    res1, errors, *_ = run_round(cfg, ids, xs, ws, round_id=1, network=net, server=server,
                                 client_classes={reuser: Reusing})
    assert_exact(res1, cfg, ids, ids, xs, ws)
    res2, errors, *_ = run_round(cfg, ids, xs, ws, round_id=2, network=net, server=server,
                                 client_classes={reuser: Reusing})
    assert_exact(res2, cfg, ids, [c for c in ids if c != reuser], xs, ws, round_id=2)
    assert list(res2.offenders) == [reuser] and "earlier round" in res2.offenders[reuser]
    assert set(errors) == {reuser}
