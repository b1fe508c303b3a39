"""Secure-aggregation primitives: PRG determinism, pairwise mask cancellation, AES-GCM tamper
detection, key agreement symmetry, Ed25519 and quantisation bounds."""
import numpy as np
import pytest

from secureflhv.crypto import secagg_primitives as sp
from secureflhv.crypto.quantise import QuantParams, choose_k_bits, dequantise, quantise, rounding_rng, to_signed


def test_prg_equal_for_equal_seeds_and_differs_otherwise():
    s1, s2 = sp.new_seed(), sp.new_seed()
    a, b, c = sp.prg(s1, 5000), sp.prg(s1, 5000), sp.prg(s2, 5000)
    assert a.dtype == np.uint64 and a.shape == (5000,)
    assert np.array_equal(a, b)
    assert np.mean(a == c) < 0.01
    # prefix property: a shorter stream is a prefix of the longer one
    assert np.array_equal(sp.prg(s1, 100), a[:100])
    # roughly uniform: top bit set about half the time
    assert 0.45 < np.mean(a >> np.uint64(63)) < 0.55
    with pytest.raises(ValueError):
        sp.prg(b"short", 10)


def test_pairwise_masks_cancel():
    ids = ["a", "b", "c", "d"]
    keys = {u: sp.KeyPair() for u in ids}
    d = 1000
    total = np.zeros(d, dtype=np.uint64)
    for u in ids:
        for v in ids:
            if u == v:
                continue
            seed = sp.derive_key(sp.agree(keys[u].private, keys[v].public), "mask", 1, *sorted((u, v)))
            p = sp.prg(seed, d)
            total = total + p if u < v else total - p
    assert not total.any()
    # and the agreed seed is symmetric but differs per pair
    s_ab = sp.derive_key(sp.agree(keys["a"].private, keys["b"].public), "mask", 1, "a", "b")
    s_ba = sp.derive_key(sp.agree(keys["b"].private, keys["a"].public), "mask", 1, "a", "b")
    s_ac = sp.derive_key(sp.agree(keys["a"].private, keys["c"].public), "mask", 1, "a", "c")
    assert s_ab == s_ba != s_ac


def test_aes_gcm_share_tampering_detected():
    key = sp.derive_key(sp.new_seed(), "enc")
    ad = sp.share_ad("job", 3, "a", "b")
    nonce, ct = sp.encrypt_share(key, b"share-bytes" * 12, ad)
    assert sp.decrypt_share(key, nonce, ct, ad) == b"share-bytes" * 12
    bad = bytearray(ct)
    bad[5] ^= 1
    for args in [(key, nonce, bytes(bad), ad), (key, nonce, ct, sp.share_ad("job", 4, "a", "b")),
                 (key, nonce, ct, sp.share_ad("job", 3, "c", "b")), (sp.new_seed(), nonce, ct, ad)]:
        with pytest.raises(sp.InvalidTag):
            sp.decrypt_share(*args)


def test_private_key_int_roundtrip_and_signatures():
    kp = sp.KeyPair()
    back = sp.private_from_int(sp.private_to_int(kp.private))
    assert back.public_key().public_bytes_raw() == kp.public
    sk = sp.SigningKey()
    sig = sk.sign(b"survivors a|b|c")
    assert sp.verify_signature(sk.public, sig, b"survivors a|b|c")
    assert not sp.verify_signature(sk.public, sig, b"survivors a|b")


def test_quantisation_sum_cannot_wrap_at_the_extremes():
    n, d, clip, scale, wmax = 7, 50, 2.0, 2.0 ** 16, 1000.0
    k = choose_k_bits(n, d, clip, scale, wmax)
    qp = QuantParams(clip, scale, wmax, k)
    for sign in (1.0, -1.0):
        acc = np.zeros(d + 2, dtype=np.uint64)
        for i in range(n):
            w, c = quantise(np.full(d, sign * 1e9), wmax, qp, rounding_rng(i, 0, "x"))
            assert c == d
            acc += w
        total, weight, clipped = dequantise(acc & qp.modulus_mask, qp)
        assert np.allclose(total, sign * n * wmax * clip, rtol=0, atol=n / scale)
        assert weight == pytest.approx(n * wmax) and clipped == n * d
    # one bit less would wrap: the extreme sum does not fit k-1 bits
    assert n * wmax * clip * scale >= 2 ** (k - 3)


def test_stochastic_rounding_unbiased_and_seeded():
    qp = QuantParams(1.0, 4.0, 10.0, 40)
    x = np.full(20000, 0.3)  # 0.3 * 4 = 1.2: rounds to 1 or 2
    a, _ = quantise(x, 1.0, qp, rounding_rng(5, 1, "c"))
    b, _ = quantise(x, 1.0, qp, rounding_rng(5, 1, "c"))
    c, _ = quantise(x, 1.0, qp, rounding_rng(6, 1, "c"))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    vals = to_signed(a, 40)[:-2]
    assert set(np.unique(vals)) == {1, 2}
    assert abs(vals.mean() - 1.2) < 0.02
