"""Paillier layer: round trips, homomorphic identities, phe interop, wire validation, packing."""
import math

import gmpy2
import numpy as np
import pytest

from secureflhv.crypto.homomorphic import paillier as P
from secureflhv.crypto.homomorphic import paillier_engine as E
from secureflhv.proto import messages_pb2
from secureflhv.transport import he_codec as C


@pytest.fixture(scope="module")
def keys():
    P.set_workers(1)
    pk, sk = P.generate_keypair(1024, insecure_test_key=True)
    yield pk, sk
    P.set_workers(None)


@pytest.fixture(scope="module")
def other_keys():
    return P.generate_keypair(512, insecure_test_key=True)


EDGE = np.array([0.0, -0.0, 1.0, -1.0, 1e-9, -3.5e-7, 123456.789, -9.87654321e8, 2.0 ** 40, -(2.0 ** 60), 1e300 * 0])


def q(x, bits):
    """Value after fixed-point rounding at `bits` fraction bits."""
    return np.ldexp(np.rint(np.ldexp(np.asarray(x, dtype=float), bits)), -bits)


def test_round_trip_edge_values_public_and_crt(keys):
    pk, sk = keys
    for key in (pk, sk):
        enc = P.encrypt(key, EDGE)
        assert enc.shape == EDGE.shape and enc.exponent == -P.DEFAULT_PRECISION_BITS
        np.testing.assert_array_equal(P.decrypt(sk, enc), q(EDGE, P.DEFAULT_PRECISION_BITS))
    x = np.random.default_rng(1).normal(size=(3, 4, 5)) * 1e3
    np.testing.assert_array_equal(P.decrypt(sk, P.encrypt(pk, x, precision_bits=53)), q(x, 53))
    ints = np.array([[0, -7], [2 ** 62, -(2 ** 62)]], dtype=np.int64)
    np.testing.assert_array_equal(P.decrypt(sk, P.encrypt(pk, ints, precision_bits=0)), ints.astype(float))


def test_encryption_is_randomised_and_djn_form(keys):
    pk, sk = keys
    a, b = P.encrypt(pk, np.zeros(4)), P.encrypt(sk, np.zeros(4))
    cts = list(a.ciphertexts) + list(b.ciphertexts)
    assert len(set(int(c) for c in cts)) == 8
    # c * (1 + m n)^-1 must be an n-th residue h_s^alpha: its (p-1)(q-1)-th power mod n^2 is 1
    n2 = pk.nsquare
    lam = (sk.p - 1) * (sk.q - 1)
    assert all(gmpy2.powmod(c, lam, n2) == 1 for c in cts)
    assert E.derive_h(pk.n) == E.derive_h(pk.n)  # deterministic from n


def test_every_table_size_gives_correct_djn_ciphertexts(other_keys):
    """No table (plain powmod), the small table and the large table: all decrypt and all are DJN-form."""
    pk, sk = other_keys
    pub, priv = E.PublicEngine(pk.n), E.PrivateEngine(sk.p, sk.q)
    lam = (sk.p - 1) * (sk.q - 1)
    ms = [0, 1, 7, pk.n - 1, 123456789]
    seen = set()
    for stage in ("none", "small", "large"):
        if stage != "none":
            pub.prepare(large=stage == "large")
            priv.prepare(large=stage == "large")
        assert (pub._table is None) == (stage == "none")
        if stage == "large":
            assert pub._table.w == E.window_bits(pk.n_bits, large=True) > E.window_bits(pk.n_bits)
            assert priv._tables[0].w == E.window_bits(pk.n_bits, large=True, crt=True) > E.window_bits(pk.n_bits)
        for eng in (pub, priv):
            cts = eng.encrypt(ms)
            assert [int(m) for m in priv.decrypt(cts)] == ms
            n2 = pk.nsquare
            r = [c * gmpy2.invert(1 + m * pk.n, n2) % n2 for c, m in zip(cts, ms)]
            assert all(gmpy2.powmod(x, lam, n2) == 1 for x in r)  # n-th residues h_s^alpha
            seen.update(int(c) for c in cts)
    assert len(seen) == 6 * len(ms)  # fresh randomness every time


def test_a_batch_share_that_large_builds_the_large_table_first(other_keys):
    """``expected`` (a worker's share of the batch) from LARGE_TABLE_AFTER on: the large table before the
    first encryption, never the small one; below it: the small table, as without the hint."""
    pk, sk = other_keys
    for expected, large in ((E.LARGE_TABLE_AFTER, True), (E.LARGE_TABLE_AFTER - 1, False)):
        pub, priv = E.PublicEngine(pk.n), E.PrivateEngine(sk.p, sk.q)
        ms = list(range(E.TABLE_MIN_BATCH))
        for eng in (pub, priv):
            assert [int(m) for m in priv.decrypt(eng.encrypt(ms, expected))] == ms
        assert pub._large == large and priv._large == [large, large]
        assert pub._table.w == E.window_bits(pk.n_bits, large=large)
        assert priv._tables[0].w == E.window_bits(pk.n_bits, large=large, crt=True)


def test_column_major_fixed_base_equals_powmod(other_keys):
    """pow_columns (the batched encryption kernel) == base^alpha for alpha rebuilt from its digits,
    and == the row-major pow_many on the same digits, for the public and both CRT tables."""
    pk, sk = other_keys
    pub, priv = E.PublicEngine(pk.n), E.PrivateEngine(sk.p, sk.q)
    pub.prepare(large=False)
    priv.prepare(large=False)
    for tab in (pub._table, *priv._tables):
        cols = tab.random_columns(7)
        assert len(cols) == tab.n_digits and all(len(c) == 7 for c in cols)
        assert tab.n_digits * tab.w >= pub.alpha_bits
        alphas = [sum(d << (tab.w * i) for i, d in enumerate(digits)) for digits in zip(*cols)]
        base = tab.rows[0][1]
        assert tab.pow_columns(cols) == [gmpy2.powmod(base, a, tab.mod) for a in alphas]
        assert tab.pow_columns(cols) == tab.pow_many([list(d) for d in zip(*cols)])
    # the key holder's CRT encryption uses one alpha for both halves: its output is the public one's
    ms = [3, pk.n - 5, 0]
    assert [int(m) for m in priv.decrypt(priv.encrypt(ms))] == ms
    assert [int(m) for m in priv.decrypt(pub.encrypt(ms))] == ms


def test_add_fast_path_equals_broadcast_path(keys):
    """enc + enc with equal shapes (inline list path) == the broadcasting path, element by element."""
    pk, sk = keys
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    ex, ey = P.encrypt(pk, x), P.encrypt(pk, y)
    fast = ex + ey
    slow = ex + ey.reshape(1, 3, 4)  # (3, 4) + (1, 3, 4): the broadcasting path
    assert fast.shape == (3, 4) and slow.shape == (1, 3, 4)
    assert [int(c) for c in fast.ciphertexts.ravel()] == [int(c) for c in slow.ciphertexts.ravel()]
    np.testing.assert_array_equal(P.decrypt(sk, fast), q(x, 40) + q(y, 40))


def test_too_large_value_refused(keys):
    pk, _ = keys
    with pytest.raises(OverflowError, match="bits"):
        P.encrypt(pk, np.array([2.0 ** 1000]))
    with pytest.raises(ValueError):
        P.encrypt(pk, np.array([np.nan]))


def test_homomorphic_identities(keys):
    pk, sk = keys
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(4, 3)) * 10, rng.normal(size=(4, 3)) * 10
    ex, ey = P.encrypt(pk, x), P.encrypt(sk, y)
    qx, qy = q(x, 40), q(y, 40)
    np.testing.assert_array_equal(P.decrypt(sk, ex + ey), qx + qy)
    np.testing.assert_array_equal(P.decrypt(sk, ex - ey), qx - qy)
    np.testing.assert_array_equal(P.decrypt(sk, -ex), -qx)
    np.testing.assert_allclose(P.decrypt(sk, ex + y), qx + qy, rtol=0, atol=1e-11)
    np.testing.assert_allclose(P.decrypt(sk, y - ex), qy - qx, rtol=0, atol=1e-11)
    np.testing.assert_allclose(P.decrypt(sk, ex + y[0]), qx + qy[0], atol=1e-11)  # broadcast
    k = rng.integers(-1000, 1000, size=(4, 3))
    np.testing.assert_array_equal(P.decrypt(sk, ex * k), qx * k)      # negative scalars exact
    np.testing.assert_array_equal(P.decrypt(sk, ex * -3), qx * -3)
    np.testing.assert_array_equal(P.decrypt(sk, 0 * ex), np.zeros_like(x))
    f = rng.normal(size=3)
    np.testing.assert_allclose(P.decrypt(sk, ex * f), qx * q(f, 32), rtol=1e-12)
    np.testing.assert_allclose(P.decrypt(sk, P.mul(ex, f, precision_bits=50)), qx * q(f, 50), rtol=1e-14)
    np.testing.assert_allclose(P.decrypt(sk, ex.sum()), qx.sum(), rtol=1e-14)
    np.testing.assert_allclose(P.decrypt(sk, ex.sum(axis=0)), qx.sum(axis=0), rtol=1e-14)
    np.testing.assert_allclose(P.decrypt(sk, ex.sum(axis=1)), qx.sum(axis=1), rtol=1e-14)
    # exponent alignment: coarser operand is rescaled
    ez = P.encrypt(pk, y, precision_bits=10)
    np.testing.assert_allclose(P.decrypt(sk, ex + ez), qx + q(y, 10), atol=1e-11)
    # indexing / concatenate / reshape
    np.testing.assert_array_equal(P.decrypt(sk, ex[1:3, ::2]), qx[1:3, ::2])
    np.testing.assert_array_equal(P.decrypt(sk, ex[2, 1]), qx[2, 1])
    cat = P.concatenate([ex, ez], axis=1)
    np.testing.assert_allclose(P.decrypt(sk, cat), np.concatenate([qx, q(y, 10)], axis=1), atol=1e-11)
    assert len(ex) == 4 and ex.reshape(12).shape == (12,)


def test_overflowed_result_is_refused(keys):
    pk, sk = keys
    base = pk.n_bits - 4
    e = P.encrypt(pk, np.array([2.0 ** base]), precision_bits=0)
    k = round((pk.n / 2) / 2 ** base)                # mantissa k * 2^base lands within n/6 of n/2
    with pytest.raises(OverflowError, match="overflow"):
        P.decrypt(sk, e * k)


def test_dot_matches_numpy_on_quantised_inputs(keys):
    pk, sk = keys
    rng = np.random.default_rng(3)
    n, d = 300, 4
    X = rng.normal(size=(n, d)) * 3
    X[5] = 0.0
    X[:, 2] = np.abs(X[:, 2])            # one all-positive column
    r = rng.normal(size=n)
    er = P.encrypt(pk, r)
    got = P.decrypt(sk, P.dot(X, er))
    want = q(X, P.DEFAULT_DOT_PRECISION_BITS).T @ q(r, 40)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(P.decrypt(sk, P.dot(X[:, 0], er)), want[0], rtol=1e-12)
    Xi = rng.integers(-50, 50, size=(n, 2))
    np.testing.assert_allclose(P.decrypt(sk, P.dot(Xi, er)), Xi.T @ q(r, 40), rtol=1e-12)
    with pytest.raises(ValueError):
        P.dot(X[:10], er)


def test_parallel_paths_match_inline(keys):
    pk, sk = keys
    rng = np.random.default_rng(4)
    x = rng.normal(size=600)
    X = rng.normal(size=(600, 5))
    try:
        P.set_workers(2)
        e_pub, e_crt = P.encrypt(pk, x), P.encrypt(sk, x)
        np.testing.assert_array_equal(P.decrypt(sk, e_pub), q(x, 40))
        np.testing.assert_array_equal(P.decrypt(sk, e_crt), q(x, 40))
        k = rng.integers(-(2 ** 20), 2 ** 20, size=600)
        np.testing.assert_array_equal(P.decrypt(sk, e_pub * k), q(x, 40) * k)
        par_dot = P.decrypt(sk, P.dot(X, e_pub))
    finally:
        P.set_workers(1)
    np.testing.assert_array_equal(par_dot, P.decrypt(sk, P.dot(X, e_pub)))


def test_phe_interop_both_directions(keys):
    pk, sk = keys
    ppk, psk = pk.to_phe(), sk.to_phe()
    assert P.PublicKey.from_phe(ppk, insecure_test_key=True) == pk
    assert P.PrivateKey.from_phe(psk, insecure_test_key=True).p == sk.p
    vals = [0.0, -2.5, 1e-6, 31337.25, -1e9]
    enc = P.EncryptedArray.from_phe([ppk.encrypt(v) for v in vals], pk)
    np.testing.assert_allclose(P.decrypt(sk, enc), vals, rtol=1e-12, atol=1e-12)
    ours = P.encrypt(pk, np.array(vals), precision_bits=41)  # exponent not a multiple of 4
    np.testing.assert_allclose([psk.decrypt(c) for c in ours.to_phe()], q(vals, 41), rtol=1e-15)


def test_proto_round_trip_and_rejections(keys, other_keys):
    pk, sk = keys
    pk2, _ = other_keys
    x = np.arange(6.0).reshape(2, 3) - 2.5
    enc = P.encrypt(pk, x)
    msg = C.encrypted_to_proto(enc)
    back = C.encrypted_from_proto(messages_pb2.EncryptedTensor.FromString(msg.SerializeToString()), pk, (2, 3))
    np.testing.assert_array_equal(P.decrypt(sk, back), x)
    with pytest.raises(P.CiphertextError, match="fingerprint"):
        C.encrypted_from_proto(msg, pk2)
    with pytest.raises(P.CiphertextError, match="shape"):
        C.encrypted_from_proto(msg, pk, expected_shape=(3, 2))
    # ciphertext made under another key, relabelled with our fingerprint: 0 / n^2 / multiple of p
    w = pk.byte_width

    def tamper(value):
        m = messages_pb2.EncryptedTensor()
        m.CopyFrom(msg)
        data = bytearray(m.ciphertexts)
        data[w:2 * w] = int(value).to_bytes(w, "big")
        m.ciphertexts = bytes(data)
        return m

    for bad in (0, pk.nsquare, sk.p * 12345):
        with pytest.raises(P.CiphertextError, match=r"ciphertexts\[1\]"):
            C.encrypted_from_proto(tamper(bad), pk)
    m = messages_pb2.EncryptedTensor()
    m.CopyFrom(msg)
    m.ciphertexts = m.ciphertexts[:-1]
    with pytest.raises(P.CiphertextError, match="bytes"):
        C.encrypted_from_proto(m, pk)
    with pytest.raises(P.CiphertextError, match="different public key"):
        P.decrypt(sk, P.encrypt(pk2, x))


def test_public_key_proto_and_size_policy(keys):
    pk, _ = keys
    kmsg = C.public_key_to_proto(pk)
    assert C.public_key_from_proto(kmsg, insecure_test_key=True) == pk
    with pytest.raises(P.CiphertextError, match="rejected"):
        C.public_key_from_proto(kmsg)                    # 1024 bits without the test flag
    bad = messages_pb2.PaillierPublicKey(n=kmsg.n, fingerprint=b"\0" * 32)
    with pytest.raises(P.CiphertextError, match="fingerprint"):
        C.public_key_from_proto(bad, insecure_test_key=True)
    with pytest.raises(ValueError, match="insecure_test_key"):
        P.generate_keypair(1024)
    with pytest.raises(ValueError):
        P.PublicKey(pk.n)


def test_packing_sizing_and_round_trip_at_slot_limits(keys):
    pk, sk = keys
    prec, bound, N = 16, 2.0, 50
    spec = P.PackingSpec.create(pk.n_bits, precision_bits=prec, value_bound=bound, n_summands=N)
    assert spec.slots == P.slots_per_plaintext(pk.n_bits, prec, bound, N)
    assert spec.slots * spec.slot_bits <= pk.n_bits - 2 and spec.capacity >= N
    assert (spec.slots + 1) * spec.slot_bits > pk.n_bits - 2
    # every slot at +bound / -bound / mixed, summed exactly `capacity` times: the extreme allowed sums
    B = spec.value_bound
    rows = np.array([[B] * spec.slots, [-B] * spec.slots, [B if j % 2 else -B for j in range(spec.slots)]])
    enc = P.encrypt_packed(pk, rows, spec)
    total = enc
    for _ in range(spec.capacity - 1):
        total = total + enc
    assert total.summands == spec.capacity
    np.testing.assert_array_equal(P.decrypt(sk, total), rows * spec.capacity)
    # plaintext pack/unpack and proto round trip with packing metadata
    v = np.random.default_rng(5).uniform(-bound, bound, size=(7, spec.slots))
    np.testing.assert_array_equal(P.unpack(P.pack(v, spec), spec), q(v, prec))
    ev = P.encrypt_packed(sk, v, spec)
    back = C.encrypted_from_proto(C.encrypted_to_proto(ev.sum(axis=0)), pk)
    assert back.summands == 7
    np.testing.assert_allclose(P.decrypt(sk, back), q(v, prec).sum(axis=0), rtol=0, atol=1e-12)
    # g/h pair, the SecureBoost case
    gh = P.PackingSpec.create(pk.n_bits, precision_bits=30, value_bound=1.0, n_summands=10_000, slots=2)
    pairs = np.random.default_rng(6).uniform(-1, 1, size=(40, 2))
    np.testing.assert_allclose(P.decrypt(sk, P.encrypt_packed(pk, pairs, gh).sum()), q(pairs, 30).sum(0), atol=1e-12)


def test_packing_overflow_is_refused(keys):
    pk, sk = keys
    spec = P.PackingSpec.create(pk.n_bits, precision_bits=8, value_bound=1.0, n_summands=4)
    enc = P.encrypt_packed(pk, np.ones((spec.capacity + 1, spec.slots)), spec)
    with pytest.raises(OverflowError, match="overflow"):
        enc.sum()                                   # capacity + 1 summands
    part = enc[: spec.capacity].sum()
    with pytest.raises(OverflowError, match="overflow"):
        part + enc[0]
    with pytest.raises(OverflowError, match="bound"):
        P.encrypt_packed(pk, np.full((1, spec.slots), 1.5), spec)
    with pytest.raises(OverflowError):
        P.PackingSpec.create(pk.n_bits, precision_bits=8, value_bound=1.0, n_summands=4, slots=spec.slots + 1)
    with pytest.raises(TypeError):
        enc * 2
    # a forged summands count beyond capacity is rejected on receipt
    m = C.encrypted_to_proto(part)
    m.summands = spec.capacity + 1
    with pytest.raises(P.CiphertextError, match="summands"):
        C.encrypted_from_proto(m, pk)
    # an overflow the sizing forbids (forged here by bypassing the counter) is refused on decryption
    forged = P.EncryptedArray(pk, enc._c[:1], enc.exponent, spec, 1)
    big = forged
    for _ in range(spec.capacity + 2):
        big = P.EncryptedArray(pk, (big + forged)._c, spec.exponent, spec, 1)
    with pytest.raises(OverflowError, match="overflow"):
        P.decrypt(sk, big)


def test_real_2048_bit_key_round_trip():
    pk, sk = P.generate_keypair()
    assert pk.n_bits == 2048
    x = np.array([0.0, -1.25, 3.0e5, 7e-8])
    np.testing.assert_array_equal(P.decrypt(sk, P.encrypt(pk, x)), q(x, 40))
    np.testing.assert_array_equal(P.decrypt(sk, P.encrypt(sk, x) * -2), -2 * q(x, 40))
    assert C.public_key_from_proto(C.public_key_to_proto(pk)) == pk
    assert math.isclose(P.decrypt(sk, P.encrypt(pk, x).sum()), q(x, 40).sum(), rel_tol=1e-15)


def test_masked_decryption_round_trip_through_the_codec(keys, other_keys):
    """crypto.he masking + transport.he_codec MaskedValues: exact, and a receiver's checks still hold."""
    from secureflhv.crypto.homomorphic.backend import make_backend
    from secureflhv.transport import ProtocolError

    pk, sk = keys
    he, wire = make_backend("paillier", 40, 24), C.codec_for(make_backend("paillier"))
    x = np.array([[0.5, -3.25], [1e-3, 7.0]])
    masked, mask = he.mask(pk, he.encrypt(pk, x))
    enc = wire.from_proto(wire.to_proto(masked), pk, (2, 2), "masked", exponent=-40)
    msg = wire.masked_to_proto(he.decrypt_masked(sk, enc, add=np.ones((2, 2))), sk)
    back = he.unmask(pk, wire.masked_from_proto(msg, pk, (2, 2), "dec", exponent=-40), mask)
    np.testing.assert_array_equal(back, q(x, 40) + 1.0)
    bad = messages_pb2.MaskedValues()
    bad.CopyFrom(msg)
    bad.values = pk.n.to_bytes(msg.byte_width, "big") + msg.values[msg.byte_width:]
    with pytest.raises(ProtocolError, match="not in Z_n"):
        wire.masked_from_proto(bad, pk, (2, 2), "dec", exponent=-40)
    with pytest.raises(ProtocolError, match="expected key"):
        wire.masked_from_proto(msg, other_keys[0], (2, 2), "dec", exponent=-40)
    with pytest.raises(ProtocolError, match="shape"):
        wire.masked_from_proto(msg, pk, (4,), "dec", exponent=-40)
    with pytest.raises(ValueError, match="backend"):
        make_backend("rot13")


def test_precomputed_obfuscators_are_used_once_each_and_change_no_answer(other_keys):
    """PublicEngine.precompute: pooled h_s^alpha are taken first, each by one ciphertext only (fresh, DJN form),
    and the plaintexts decrypt as without the pool; a background precompute beside encryptions is safe."""
    import threading

    pk, sk = other_keys
    eng = E.public_engine(pk.n)
    eng._pool.clear()
    assert eng.precompute(40) == 40
    pooled = [int(r) for r in eng._pool]
    zeros = P.encrypt(pk, np.zeros(30))  # m = 0: the ciphertext is its obfuscator r itself
    assert len(eng._pool) == 10  # 30 taken, 10 left
    assert [int(c) for c in zeros.ciphertexts] == pooled[:30]
    assert [int(r) for r in eng._pool] == pooled[30:]
    x = np.linspace(-3, 3, 30)
    enc = P.encrypt(pk, x)  # 10 pooled, 20 fresh
    assert not eng._pool
    np.testing.assert_allclose(P.decrypt(sk, enc), x, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(P.decrypt(sk, zeros), np.zeros(30))
    more = threading.Thread(target=eng.precompute, args=(200,))
    more.start()
    encs = [P.encrypt(pk, x) for _ in range(5)]
    more.join()
    assert all(np.allclose(P.decrypt(sk, e), x, rtol=0, atol=1e-12) for e in encs)
    everything = [int(c) for e in [zeros, enc, *encs] for c in e.ciphertexts]
    assert len(set(everything)) == len(everything)
    eng._pool.clear()
