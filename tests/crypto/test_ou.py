"""Okamoto-Uchiyama backend: round trips, homomorphic identities, masking, wire validation (crypto.ou, he_ou)."""
import os

import gmpy2
import numpy as np
import pytest

from secureflhv.crypto.homomorphic import ou
from secureflhv.crypto.homomorphic import paillier as P
from secureflhv.crypto.homomorphic.backend import make_backend
from secureflhv.proto import messages_pb2
from secureflhv.transport import ProtocolError
from secureflhv.transport import he_codec as C

pytest.importorskip("heu", reason="sf-heu is a linux dependency of the OU scheme")


@pytest.fixture(scope="module")
def keys():
    P.set_workers(1)
    pub, priv = ou.generate_keypair(1024, insecure_test_key=True)
    yield pub, priv
    P.set_workers(None)


@pytest.fixture(scope="module")
def other_keys():
    return ou.generate_keypair(1024, insecure_test_key=True)


@pytest.fixture(scope="module")
def he():
    return make_backend("ou", 40, 32)


def q(x, bits):
    return np.ldexp(np.rint(np.ldexp(np.asarray(x, dtype=float), bits)), -bits)


EDGE = np.array([0.0, -0.0, 1.0, -1.0, 1e-9, -3.5e-7, 123456.789, -9.87654321e8, 2.0 ** 40, -(2.0 ** 60)])


def test_key_sizes_and_policy(keys):
    pub, priv = keys
    assert priv.p ** 2 * priv.q == pub.n and (priv.p - 1) % priv.t == 0
    assert priv.t.bit_length() == 160 and pub.plain_bits >= 330  # HEU's subgroup size at 1024 bits
    with pytest.raises(ValueError, match="2048-bit minimum"):
        ou.generate_keypair(1024)
    with pytest.raises(ValueError, match="at least 1024"):
        ou.generate_keypair(512, insecure_test_key=True)


def test_racing_key_generations_take_the_first_key_and_fall_back_when_every_racer_fails(caplog):
    """Two HEU key generations race in child processes: the winner is a complete, working key; when no
    racer succeeds (here: HEU refuses the size in both) the caller is told so and generates itself."""
    assert ou.keygen_racers(1024) == 1 and ou.keygen_racers(2048) == min(2, os.cpu_count())
    pub, priv = ou.generate_keypair(1024, insecure_test_key=True, racers=2)
    assert priv.p ** 2 * priv.q == pub.n and (priv.p - 1) % priv.t == 0
    probe = [0, 5, -7, 2 ** 200, -(2 ** 300)]
    assert ou.decrypt_ints(priv, ou.encrypt_ints(pub, probe)) == probe
    with caplog.at_level("WARNING", logger="secureflhv.crypto.homomorphic.ou"):
        assert ou._race_keygen(64, 2) is None  # below HEU's minimum: both children raise and exit
    assert "failed in every racer" in caplog.text


def test_round_trip_edge_values_public_and_private(keys, he):
    pub, priv = keys
    for key in (pub, priv):
        enc = he.encrypt(key, EDGE.reshape(2, 5))
        assert enc.shape == (2, 5) and enc.exponent == -40
        np.testing.assert_array_equal(he.decrypt(priv, enc), q(EDGE, 40).reshape(2, 5))
    np.testing.assert_array_equal(he.decrypt(priv, he.encrypt(pub, np.array([2.0 ** 250, -(2.0 ** 250)]))),
                                  [2.0 ** 250, -(2.0 ** 250)])
    with pytest.raises(OverflowError):
        he.encrypt(pub, np.array([2.0 ** (pub.plain_bits - 40)]))


def test_encryption_is_randomised_and_of_ou_form(keys, he):
    pub, priv = keys
    cts = [int(c) for c in he.encrypt(pub, np.zeros(40)).ciphertexts]  # 40: the table path too
    assert len(set(cts)) == 40 and all(0 < c < pub.n and gmpy2.gcd(c, pub.n) == 1 for c in cts)
    p2 = priv.p ** 2
    assert all(pow(c, priv.t, p2) == 1 for c in cts)  # Enc(0) = H^r: killed by t mod p^2


def test_homomorphic_identities(keys, he):
    pub, priv = keys
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=6) * 100, rng.normal(size=6)
    ex, ey = he.encrypt(pub, x), he.encrypt(pub, y)
    dec = lambda e: he.decrypt(priv, e)  # noqa: E731
    np.testing.assert_array_equal(dec(ex + ey), q(x, 40) + q(y, 40))
    np.testing.assert_array_equal(dec(ex - ey), q(x, 40) - q(y, 40))
    np.testing.assert_array_equal(dec(-ex), -q(x, 40))
    np.testing.assert_array_equal(dec(he.add(ex, y)), q(x, 40) + q(y, 40))
    np.testing.assert_array_equal(dec(ex * np.arange(-3, 3)), q(x, 40) * np.arange(-3, 3))
    assert dec(ex.sum()) == pytest.approx(q(x, 40).sum(), abs=1e-9)
    X = rng.normal(size=(6, 3))
    np.testing.assert_allclose(dec(he.dot(X, ex)), q(X, 32).T @ q(x, 40), rtol=1e-12)
    A = he.encrypt(pub, rng.normal(size=(4, 3)))
    W, D = rng.normal(size=(3, 2)), rng.normal(size=(4, 2))
    a = dec(A)
    np.testing.assert_allclose(dec(he.matmul(A, W)), a @ q(W, 32), rtol=1e-9)
    np.testing.assert_allclose(dec(he.t_matmul(A, D)), a.T @ q(D, 32), rtol=1e-9)
    np.testing.assert_allclose(dec(he.matmul_t(D, he.encrypt(pub, W))), q(D, 32) @ q(W, 40).T, rtol=1e-9)


def test_parallel_dot_matches_inline(keys, he):
    pub, priv = keys
    rng = np.random.default_rng(2)
    A, W = he.encrypt(pub, rng.normal(size=(300, 4))), rng.normal(size=(4, 5))
    inline = he.decrypt(priv, he.matmul(A, W))
    P.set_workers(2)
    try:
        par = he.decrypt(priv, he.matmul(A, W))
    finally:
        P.set_workers(1)
    np.testing.assert_array_equal(par, inline)


def test_overflow_and_wrong_key_are_refused(keys, other_keys, he):
    pub, priv = keys
    e = he.encrypt(pub, np.array([2.0 ** (pub.plain_bits - 41)]))  # mantissa 2^(plain_bits - 1): the largest
    assert he.decrypt(priv, e)[0] == 2.0 ** (pub.plain_bits - 41)
    with pytest.raises(P.DecryptedRangeError):
        he.decrypt(priv, e + e)  # mantissa 2^plain_bits: overflowed, refused rather than decoded
    with pytest.raises(P.CiphertextError, match="different public key"):
        he.decrypt(other_keys[1], e)
    with pytest.raises(P.CiphertextError, match="different public keys"):
        e + he.encrypt(other_keys[0], np.array([1.0]))


def test_wire_round_trip_and_rejections(keys, other_keys, he):
    pub, priv = keys
    wire = C.codec_for(he)
    kmsg = messages_pb2.PaillierPublicKey.FromString(wire.public_key_to_proto(pub).SerializeToString())
    assert wire.public_key_from_proto(kmsg, True) == pub
    with pytest.raises(ProtocolError, match="2048"):
        wire.public_key_from_proto(kmsg, False)
    bad = messages_pb2.PaillierPublicKey()
    bad.CopyFrom(kmsg)
    bad.plain_bits += 1
    with pytest.raises(ProtocolError, match="fingerprint"):
        wire.public_key_from_proto(bad, True)
    # a Paillier job receiving an OU key, and the other way round: a clear error, no crash
    with pytest.raises(ProtocolError, match="scheme 'ou'.*'paillier'"):
        C.codec_for(make_backend("paillier")).public_key_from_proto(kmsg, True)
    ppk, _ = P.generate_keypair(512, insecure_test_key=True)
    with pytest.raises(ProtocolError, match="scheme 'paillier'.*'ou'"):
        wire.public_key_from_proto(C.public_key_to_proto(ppk), True)

    x = np.array([[1.5, -2.0, 0.0], [3.0, 1e-6, -7.25]])
    msg = wire.to_proto(he.encrypt(pub, x))
    assert msg.byte_width == pub.byte_width == (pub.n.bit_length() + 7) // 8
    back = wire.from_proto(messages_pb2.EncryptedTensor.FromString(msg.SerializeToString()), pub, (2, 3), "u",
                           exponent=-40)
    np.testing.assert_array_equal(he.decrypt(priv, back), q(x, 40))
    with pytest.raises(ProtocolError, match="expected key|fingerprint"):
        wire.from_proto(msg, other_keys[0], (2, 3), "u", exponent=-40)
    with pytest.raises(ProtocolError, match="shape"):
        wire.from_proto(msg, pub, (3, 2), "u", exponent=-40)
    with pytest.raises(ProtocolError, match="exponent"):
        wire.from_proto(msg, pub, (2, 3), "u", exponent=-41)
    w = msg.byte_width

    def tamper(value):
        m = messages_pb2.EncryptedTensor()
        m.CopyFrom(msg)
        data = bytearray(m.ciphertexts)
        data[w:2 * w] = int(value).to_bytes(w, "big")
        m.ciphertexts = bytes(data)
        return m

    for value in (0, pub.n, priv.p * 12345, priv.q):  # outside (0, n), or not a unit mod n
        with pytest.raises(ProtocolError, match=r"ciphertexts\[1\]"):
            wire.from_proto(tamper(value), pub, (2, 3), "u", exponent=-40)
    packed = messages_pb2.EncryptedTensor()
    packed.CopyFrom(msg)
    packed.slots, packed.slot_bits = 20, 64  # 1,280 bits: more than the key's plaintexts hold
    with pytest.raises(ProtocolError, match="exceeds the OU key"):
        wire.from_proto(packed, pub, (2, 3), "u", exponent=-40)
    short = messages_pb2.EncryptedTensor()
    short.CopyFrom(msg)
    short.ciphertexts = short.ciphertexts[:-1]
    with pytest.raises(ProtocolError, match="bytes"):
        wire.from_proto(short, pub, (2, 3), "u", exponent=-40)


def test_masked_decryption_is_exact_and_checked(keys, other_keys, he):
    pub, priv = keys
    wire = C.codec_for(he)
    x = np.array([[0.5, -3.25], [1e-3, -7.0e5]])
    masked, mask = he.mask(pub, he.encrypt(pub, x))
    assert all(1 << (pub.plain_bits - 3) <= r < 1 << (pub.plain_bits - 2) for r in mask.r)
    enc = wire.from_proto(wire.to_proto(masked), pub, (2, 2), "masked", exponent=-40)
    mv = he.decrypt_masked(priv, enc, add=np.full((2, 2), -1.0))
    # what the key holder holds is m + r + t, r dominating: not the value
    assert all(v > 1 << (pub.plain_bits - 4) for v in mv.values)
    msg = wire.masked_to_proto(mv, priv)
    back = he.unmask(pub, wire.masked_from_proto(msg, pub, (2, 2), "dec", exponent=-40), mask)
    np.testing.assert_array_equal(back, q(x, 40) - 1.0)
    with pytest.raises(ProtocolError, match="expected key"):
        wire.masked_from_proto(msg, other_keys[0], (2, 2), "dec", exponent=-40)
    garbage = mv.values[:1] + [mv.values[1] + (1 << (pub.plain_bits - 10))] + mv.values[2:]
    forged = type(mv)(mv.key_fingerprint, mv.shape, mv.exponent, garbage)
    with pytest.raises(P.CiphertextError, match="statistically hidden range"):
        he.unmask(pub, forged, mask)
    with pytest.raises(P.CiphertextError, match="mask range"):  # unmasked values never leave the key holder
        he.decrypt_masked(priv, he.encrypt(pub, x))


def test_parallel_encryption_decrypts(keys, monkeypatch):
    """Batches above PAR_ENCRYPT_MIN are encrypted by the workers (their own tables and randomness)."""
    pub, priv = keys
    monkeypatch.setattr(ou, "PAR_ENCRYPT_MIN", 8)
    ms = [0, 1, -1, 5, -(1 << 70), (1 << 200) + 3] * 6
    P.set_workers(2)
    try:
        cts = ou.encrypt_ints(pub, ms)
    finally:
        P.set_workers(1)
    assert ou.decrypt_ints(priv, cts) == ms
    assert len(set(cts)) == len(cts)  # fresh randomness in every worker and chunk


def test_the_first_h_table_is_small_and_the_large_one_follows_after_heavy_use(keys, monkeypatch):
    """A key's first H table has the window _H_WINDOW_FIRST (cheap to build for the first batch); after
    _H_LARGE_AFTER encryptions the engine holds the _H_WINDOW table; ciphertexts of both decrypt."""
    pub, priv = keys
    monkeypatch.setattr(ou, "_H_LARGE_AFTER", 40)
    eng = ou._Engine(pub)
    ms = [0, 1, -1, 7, -(1 << 60), (1 << 100) + 5] * 4
    first = eng.encrypt(ms)
    assert eng._h_table.w == ou._H_WINDOW_FIRST < ou._H_WINDOW
    second = eng.encrypt(ms)
    assert eng._h_table.w == ou._H_WINDOW
    assert ou.decrypt_ints(priv, first) == ou.decrypt_ints(priv, second) == ms
    assert len(set(first + second)) == 2 * len(ms)


def test_key_holder_encryption_by_the_crt_is_the_public_formula(keys, monkeypatch):
    """The key holder's engine (halves mod p^2 and q) gives exactly G^m H^r mod n for the same r, for
    either window; encrypt_ints with the private key decrypts, inline and on the workers (which also
    decrypt)."""
    pub, priv = keys
    ms = [0, 1, -1, 7, -(1 << 60), (1 << 100) + 5, pub.max_int - 1, 1 - pub.max_int] * 4
    crt, public = ou._Engine(pub, priv.p, priv.q), ou._Engine(pub)
    for w in (ou._H_WINDOW_FIRST, ou._H_WINDOW):
        monkeypatch.setattr(ou, "_H_WINDOW_FIRST", w)
        rows = -(-ou.RANDOM_BITS // w)
        cols = [[int(x) for x in col] for col in np.random.default_rng(w).integers(0, 1 << w, (rows, len(ms)))]
        r = [sum(cols[i][j] << (w * i) for i in range(rows)) for j in range(len(ms))]
        expect = [pow(pub.g, m, pub.n) * pow(pub.h, rj, pub.n) % pub.n for m, rj in zip(ms, r)]
        assert crt.encrypt(ms, cols) == public.encrypt(ms, cols) == expect
        assert crt._h_table.w == w
    inline = ou.encrypt_ints(priv, ms)
    monkeypatch.setattr(ou, "PAR_ENCRYPT_MIN", 8)
    monkeypatch.setattr(ou, "PAR_DECRYPT_MIN", 8)
    P.set_workers(2)
    try:
        pooled = ou.encrypt_ints(priv, ms)
        pooled_plain = ou.decrypt_ints(priv, pooled)
    finally:
        P.set_workers(1)
    assert ou.decrypt_ints(priv, inline) == pooled_plain == ms
    assert len(set(inline + pooled)) == 2 * len(ms)
