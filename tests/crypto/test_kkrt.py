"""KKRT OT-extension primitives (secureflhv.crypto.kkrt): base OT, OT extension identity, PRC, OPRF, cuckoo."""
import hashlib
import os

import numpy as np
import pytest
from nacl import bindings as sodium

from secureflhv.crypto import kkrt

CTX = kkrt.session_context("job-kkrt", b"\x01" * 32)


def rand_bits(rng, k):
    return rng.integers(0, 2, size=k).astype(bool)


@pytest.fixture(scope="module")
def base_ot():
    """One run of 512 base OTs: (sender, receiver, choices, k0, k1, k_s)."""
    rng = np.random.default_rng(1)
    choices = rand_bits(rng, kkrt.BASE_OTS)
    sender = kkrt.BaseOtSender(CTX)
    receiver = kkrt.BaseOtReceiver(CTX, choices)
    k0, k1 = sender.keys(receiver.points())
    ks = receiver.keys(sender.points())
    return sender, receiver, choices, k0, k1, ks


def test_base_ot_receiver_gets_the_chosen_key_only(base_ot):
    _, _, choices, k0, k1, ks = base_ot
    assert k0.shape == k1.shape == ks.shape == (kkrt.BASE_OTS, kkrt.SEED_BYTES)
    chosen = np.where(choices[:, None], k1, k0)
    other = np.where(choices[:, None], k0, k1)
    assert (ks == chosen).all()
    assert not (ks == other).all(axis=1).any()          # the flipped choice gives something else
    assert len({bytes(r) for r in np.vstack([k0, k1])}) == 2 * kkrt.BASE_OTS  # all keys distinct
    assert 0 < choices.sum() < kkrt.BASE_OTS


def test_base_ot_receiver_points_valid_and_other_context_disagrees(base_ot):
    sender, receiver, choices, k0, k1, ks = base_ot
    pts = receiver.points()
    assert len(pts) == 32 * kkrt.BASE_OTS
    assert all(sodium.crypto_core_ed25519_is_valid_point(pts[i:i + 32]) for i in range(0, len(pts), 32))
    # a receiver in a different session (other Cp, other hash key) gets different keys
    other = kkrt.BaseOtReceiver(kkrt.session_context("job-kkrt", b"\x02" * 32), choices)
    assert not (other.keys(sender.points()) == ks).all(axis=1).any()


@pytest.mark.parametrize("flaw", ["short", "long", "not_on_curve", "small_order", "identity", "equals_cp"])
def test_base_ot_rejects_invalid_points(base_ot, flaw):
    sender, receiver, *_ = base_ot
    pts = bytearray(receiver.points())
    bad = {"not_on_curve": bytes([2]) + bytes(31),        # y = 2 is not on the curve
           "small_order": bytes([0xEC]) + b"\xff" * 30 + b"\x7f",  # y = -1: order 2
           "identity": bytes([1]) + bytes(31),
           "equals_cp": kkrt.base_ot_cp(CTX)}.get(flaw)   # Cp - PK0 would be the identity
    if flaw == "short":
        pts = pts[:-1]
    elif flaw == "long":
        pts += bytes(32)
    else:
        pts[7 * 32:8 * 32] = bad
    with pytest.raises(ValueError) as ei:
        sender.keys(bytes(pts))
    if flaw not in ("short", "long"):
        assert isinstance(ei.value, kkrt.InvalidPointError) and ei.value.index == 7
    rpts = bytearray(sender.points())
    rpts[:32] = bytes([2]) + bytes(31)
    with pytest.raises(kkrt.InvalidPointError):
        receiver.keys(bytes(rpts))


def test_transpose_matches_unpackbits():
    rng = np.random.default_rng(2)
    cols = rng.integers(0, 256, size=(512, 48), dtype=np.uint8)   # 512 columns x 384 rows
    rows = kkrt.transpose_columns(cols)
    bits = np.unpackbits(cols, axis=1, bitorder="little")           # (512, 384)
    assert rows.shape == (384, 64)
    assert (np.unpackbits(rows, axis=1, bitorder="little") == bits.T).all()
    assert (kkrt.transpose_columns(kkrt.transpose_columns(cols)) == cols).all()


def test_prg_blocks_are_slices_of_one_stream():
    seeds = np.frombuffer(os.urandom(16 * 8), np.uint8).reshape(8, 16)
    whole = kkrt.prg_columns(seeds, 0, 512)
    assert (np.hstack([kkrt.prg_columns(seeds, 0, 256), kkrt.prg_columns(seeds, 256, 256)]) == whole).all()
    with pytest.raises(ValueError):
        kkrt.prg_columns(seeds, 64, 128)


def test_ot_extension_identity(base_ot):
    """q_j = t_j xor (C(r_j) AND s), on real base-OT keys, across several transpose blocks."""
    _, _, choices, k0, k1, ks = base_ot
    old = kkrt._BLOCK_ROWS
    kkrt._BLOCK_ROWS = 256  # exercise the row-block loop with a small matrix
    try:
        rng = np.random.default_rng(3)
        m = 640
        codewords = rng.integers(0, 256, size=(m, 64), dtype=np.uint8)
        T, U = kkrt.receiver_rows(k0, k1, codewords)
        Q = kkrt.sender_rows(ks, choices, U)
    finally:
        kkrt._BLOCK_ROWS = old
    mask = kkrt.bits_to_mask(choices)
    assert (Q == T ^ (codewords & mask)).all()
    assert not (U == codewords).all(axis=1).any()
    # a sender with wrong choice bits gets something else
    assert not (kkrt.sender_rows(ks, ~choices, U) == Q).all(axis=1).any()
    # in row-range parts (how the protocol sends U): the same T, U and Q
    parts = [kkrt.receiver_rows(k0, k1, codewords[a:a + 256], start_row=a) for a in (0, 256, 512)]
    assert (np.vstack([t for t, _ in parts]) == T).all() and (np.vstack([u for _, u in parts]) == U).all()
    Q2 = np.empty_like(Q)
    for a in (0, 256, 512):
        kkrt.sender_rows(ks, choices, U[a:a + 256], start_row=a, out=Q2[a:a + 256])
    assert (Q2 == Q).all()
    with pytest.raises(ValueError, match="from a row multiple"):
        kkrt.sender_rows(ks, choices, U[:128], start_row=64)


def test_choice_bit_swap_makes_the_effective_bits_s_prime_xor_delta():
    """After the guest's swap the identity holds with s = s' xor delta; with s' = 0 (a host's attack) s = delta."""
    rng = np.random.default_rng(4)
    codewords = rng.integers(0, 256, size=(256, 64), dtype=np.uint8)
    for chosen in (np.zeros(kkrt.BASE_OTS, bool), rand_bits(rng, kkrt.BASE_OTS)):
        receiver = kkrt.BaseOtReceiver(CTX, chosen)
        sender = kkrt.BaseOtSender(CTX)
        k0, k1 = sender.keys(receiver.points())  # the receiver's points are fixed before delta is drawn
        ks = receiver.keys(sender.points())
        delta = kkrt.random_bits()
        assert delta.shape == (512,) and delta.dtype == bool and 128 < delta.sum() < 384
        s = chosen ^ delta
        T, U = kkrt.receiver_rows(*kkrt.swap_base_ot_keys(k0, k1, delta), codewords)
        Q = kkrt.sender_rows(ks, s, U)
        assert (Q == T ^ (codewords & kkrt.bits_to_mask(s))).all()
        # the host's own bits no longer work: with s' = 0 it would have had Q = T for every row
        assert not (kkrt.sender_rows(ks, chosen, U) == T).all(axis=1).any()
    assert (kkrt.mask_to_bits(kkrt.bits_to_mask(delta).tobytes(), 512) == delta).all()
    with pytest.raises(ValueError, match="63 bytes for 512 bits"):
        kkrt.mask_to_bits(bytes(63), 512)
    with pytest.raises(ValueError, match="delta has 511 bits"):
        kkrt.swap_base_ot_keys(k0, k1, delta[:511])


def test_prc_distinct_inputs_far_apart_and_deterministic():
    prc = kkrt.Prc(CTX)
    items = np.frombuffer(os.urandom(15 * 100), np.uint8).reshape(100, 15)
    a = prc.encode(items, 0)
    assert a.shape == (100, 64)
    assert (prc.encode(items, 0) == a).all()
    assert (kkrt.Prc(CTX).encode(items[:3], np.array([0, 1, 2]))[0] == a[0]).all()
    for other in (prc.encode(items, 1), prc.encode(items, kkrt.DUMMY_INDEX), np.roll(a, 1, axis=0),
                  kkrt.Prc(kkrt.session_context("other", b"")).encode(items, 0)):
        dist = np.unpackbits(a ^ other, axis=1).sum(axis=1)
        assert dist.min() >= 128          # binomial(512, 1/2): below 128 has probability < 2**-96


def test_cuckoo_places_every_item_in_a_candidate_bin():
    ids = [f"id-{i}" for i in range(5000)]
    m = kkrt.cuckoo_bins(len(ids))
    items, cand = kkrt.hash_ids(ids, CTX, m)
    assert items.shape == (5000, 15) and cand.shape == (5000, 3) and cand.max() < m
    table, index = kkrt.cuckoo_place(cand, m, np.random.default_rng(4))
    placed = table[table >= 0]
    assert np.array_equal(np.sort(placed), np.arange(5000))            # each item exactly once
    assert (table[cand[np.arange(5000), index]] == np.arange(5000)).all()  # in its index's bin
    # same context, same hashes at the other party; another context, other bins
    assert (kkrt.hash_ids(ids[:10], CTX, m)[1] == cand[:10]).all()
    assert not (kkrt.hash_ids(ids[:10], kkrt.session_context("job-kkrt", b"\x03" * 32), m)[1] == cand[:10]).all()


def test_cuckoo_gives_up_when_overfull():
    cand = np.zeros((5, 3), np.int64)
    cand[:, 1], cand[:, 2] = 1, 2          # 5 items, 3 possible bins
    with pytest.raises(kkrt.CuckooError):
        kkrt.cuckoo_place(cand, 3, np.random.default_rng(0), max_rounds=50)


def test_oprf_equal_inputs_match_and_others_do_not(base_ot):
    """The guest's value of x equals the host's value for x (at the hash the guest used) only."""
    _, _, choices, k0, k1, ks = base_ot
    guest_ids = [f"u{i}" for i in range(300)]
    host_ids = [f"u{i}" for i in range(150, 450)]
    salt, ctx, items, cand, table, index = kkrt.guest_table(guest_ids, "job-kkrt")
    assert ctx == kkrt.session_context("job-kkrt", salt)
    codes = kkrt.guest_codewords(kkrt.Prc(ctx), items, table, index)
    T, U = kkrt.receiver_rows(k0, k1, codes)
    mine = kkrt.guest_values(ctx, T, cand, index, 16)
    h_items, h_cand = kkrt.hash_ids(host_ids, ctx, table.size)
    theirs = kkrt.host_values(ctx, kkrt.sender_rows(ks, choices, U), choices, h_items, h_cand, 16)
    assert len(mine) == 16 * 300 and len(theirs) == 16 * 3 * 300
    g = {mine[16 * i:16 * i + 16]: i for i in range(300)}
    hits = {}
    for v in range(900):
        i = g.get(theirs[16 * v:16 * v + 16])
        if i is not None:
            hits[i] = v
    assert sorted(hits) == list(range(150, 300))
    for i, v in hits.items():
        assert host_ids[v // 3] == guest_ids[i] and v % 3 == index[i]
    assert len(set(theirs[16 * v:16 * v + 16] for v in range(900))) == 900
    # OPRF hash: input order, width, and the bin index matters
    rows = np.zeros((2, 64), np.uint8)
    out = kkrt.oprf_hash(ctx, np.array([0, 1]), rows, 12)
    assert len(out) == 24 and out[:12] != out[12:]


def test_guest_codewords_dummy_bins_differ_from_real_codes():
    ids = ["a", "b", "c"]
    salt, ctx, items, cand, table, index = kkrt.guest_table(ids, "j")
    prc = kkrt.Prc(ctx)
    codes = kkrt.guest_codewords(prc, items, table, index)
    assert codes.shape == (kkrt.cuckoo_bins(3), 64)
    for x in range(3):
        j = cand[x, index[x]]
        assert (codes[j] == prc.encode(items[x:x + 1], index[x])[0]).all()
    assert len({bytes(r) for r in codes}) == codes.shape[0]


def test_session_context_separates_jobs_and_salts():
    a = kkrt.session_context("job", b"s" * 32)
    assert len(a) == 32 and a != kkrt.session_context("job2", b"s" * 32) != kkrt.session_context("job", b"t" * 32)
    assert hashlib.blake2b(b"x", key=a).digest() != hashlib.blake2b(b"x").digest()


def test_guest_table_draws_a_fresh_salt_when_placement_fails(monkeypatch):
    real, calls = kkrt.cuckoo_place, []

    def flaky(cand, bins, rng=None, max_rounds=5000):
        calls.append(cand.copy())
        if len(calls) == 1:
            raise kkrt.CuckooError("forced")
        return real(cand, bins, rng, max_rounds)

    monkeypatch.setattr(kkrt, "cuckoo_place", flaky)
    ids = [f"id-{i}" for i in range(200)]
    salt, ctx, items, cand, table, index = kkrt.guest_table(ids, "job")
    assert len(calls) == 2 and not np.array_equal(calls[0], calls[1])   # rehashed under a new salt
    assert np.array_equal(cand, calls[1]) and ctx == kkrt.session_context("job", salt)
    monkeypatch.setattr(kkrt, "cuckoo_place", lambda *a, **k: (_ for _ in ()).throw(kkrt.CuckooError("x")))
    with pytest.raises(kkrt.CuckooError, match="under 3 salts"):
        kkrt.guest_table(ids, "job", max_tries=3)
