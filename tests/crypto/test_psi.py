"""ECDH-PSI primitives (secureflhv.crypto.ecdh_psi) on real X25519 keys."""
import hashlib
import os
import random

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from secureflhv.crypto import ecdh_psi as psi

P = 2**255 - 19
A = 486662


def on_curve(u_bytes: bytes) -> bool:
    """Euler's criterion, independent of the gmpy2 Jacobi symbol the module uses."""
    u = int.from_bytes(u_bytes, "little")
    return u < P and pow((u * u * u + A * u * u + u) % P, (P - 1) // 2, P) == 1


def x25519(scalar: bytes, u: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(scalar).exchange(X25519PublicKey.from_public_bytes(u))


CTX = psi.hash_context("job-test", b"\x01" * 32)


def test_commutative_blinding_on_real_keys():
    a, b, c = psi.new_scalar(), psi.new_scalar(), psi.new_scalar()
    for ident in ["alice", "bob", "ÿ-unicode-ID-✓", ""]:
        u = psi.hash_to_point(ident, CTX)
        ab = x25519(a, x25519(b, u))
        assert ab == x25519(b, x25519(a, u))
        assert ab != x25519(c, x25519(a, u))  # another key gives another value
        assert psi.blind(psi.blind(u, b), a) == ab
    # the identity holds only because both sides hashed to the same point
    assert x25519(a, x25519(b, psi.hash_to_point("alice", CTX))) != x25519(b, x25519(a, psi.hash_to_point("bob", CTX)))


def test_hash_to_point_is_on_curve_deterministic_and_domain_separated():
    ids = [f"id-{i}" for i in range(300)]
    pts = psi.split_items(psi.hash_to_points(ids, CTX), 32)
    assert all(on_curve(p) for p in pts)
    assert len(set(pts)) == len(ids)
    assert pts[7] == psi.hash_to_point("id-7", CTX)
    other = psi.hash_to_points(ids, psi.hash_context("job-test", b"\x02" * 32))
    assert not set(pts) & set(psi.split_items(other, 32))
    assert psi.hash_context("job-a", b"s") != psi.hash_context("job-b", b"s")
    # about half of raw hashes are twist points: the curve restriction is doing real work
    raw = [hashlib.sha256(f"x{i}".encode()).digest() for i in range(400)]
    share = np.mean([on_curve(bytes(r[:31]) + bytes([r[31] & 0x7F])) for r in raw])
    assert 0.35 < share < 0.65


def test_blinded_points_stay_on_curve_and_hash_and_blind_agrees():
    k = psi.new_scalar()
    ids = [f"row{i}" for i in range(200)]
    blinded = psi.hash_and_blind(ids, CTX, k)
    assert blinded == psi.blind(psi.hash_to_points(ids, CTX), k)
    assert all(on_curve(p) for p in psi.split_items(blinded, 32))
    assert psi.blind(blinded, k, 12) == b"".join(p[:12] for p in psi.split_items(psi.blind(blinded, k), 32))


def test_libsodium_x25519_matches_cryptography_and_checks_scalar():
    """The engine (libsodium via PyNaCl) and ``cryptography`` compute the same X25519 bytes."""
    pts = psi.split_items(psi.hash_to_points([f"q{i}" for i in range(64)], CTX), 32)
    for _ in range(3):
        k = os.urandom(32)  # unclamped bytes: both libraries clamp the same way (RFC 7748)
        assert psi.blind(b"".join(pts), k) == b"".join(x25519(k, p) for p in pts)
        assert psi.hash_and_blind(["q5"], CTX, k) == x25519(k, pts[5])
    for bad in (b"\0" * 31, b"\0" * 33, bytearray(32)):
        with pytest.raises(ValueError, match="scalar must be 32 bytes"):
            psi.blind(pts[0], bad)
        with pytest.raises(ValueError, match="scalar must be 32 bytes"):
            psi.hash_and_blind(["a"], CTX, bad)


def test_raw_and_public_pynacl_paths_agree(monkeypatch):
    """blind() calls libsodium on pointers into one buffer; PyNaCl's public function is the fallback."""
    pts = psi.hash_to_points([f"r{i}" for i in range(40)], CTX)
    k = psi.new_scalar()
    raw16, raw = psi.blind(pts, k, 16), psi.blind(pts, k)
    assert raw == psi._blind_public(pts, k)
    monkeypatch.setattr(psi, "_raw_scalarmult", None)
    assert psi.blind(pts, k) == raw and psi.blind(pts, k, 16) == raw16
    assert raw16 == b"".join(p[:16] for p in psi.split_items(raw, 32))
    bad = bytearray(pts)
    bad[32 * 5:32 * 6] = (1).to_bytes(32, "little")
    with pytest.raises(psi.LowOrderPointError) as err:
        psi.blind(bytes(bad), k)
    assert err.value.index == 5


@pytest.mark.parametrize("low", [1, 325606250916557431795983626356110631294008115727848805560023387167927233504])
def test_low_order_point_is_named(low):
    pts = bytearray(psi.hash_to_points(["a", "b", "c"], CTX))
    pts[64:96] = low.to_bytes(32, "little")
    with pytest.raises(psi.LowOrderPointError) as err:
        psi.blind(bytes(pts), psi.new_scalar())
    assert err.value.index == 2
    with pytest.raises(ValueError):
        psi.blind(bytes(pts[:-1]), psi.new_scalar())


def test_check_points_rejects_malformed():
    good = psi.hash_to_points(["a", "b", "c"], CTX)
    assert psi.check_points(good, 3) == 3
    assert psi.check_points(b"") == 0
    with pytest.raises(ValueError, match="whole number"):
        psi.check_points(good[:-1])
    with pytest.raises(ValueError, match="expected 2"):
        psi.check_points(good, 2)
    top = bytearray(good)
    top[63] |= 0x80
    with pytest.raises(ValueError, match="item 1"):
        psi.check_points(bytes(top))
    with pytest.raises(ValueError, match="item 2"):
        psi.check_points(good[:64] + P.to_bytes(32, "little"))  # u == p: non-canonical zero
    assert psi.check_points((P - 1).to_bytes(32, "little")) == 1


def test_match_positions_and_collisions():
    rng = random.Random(3)
    theirs = [os.urandom(16) for _ in range(500)]
    shared = rng.sample(range(500), 120)
    mine = [theirs[j] for j in shared] + [os.urandom(16) for _ in range(300)]
    order = list(range(len(mine)))
    rng.shuffle(order)
    mine = [mine[i] for i in order]
    i_m, i_t = psi.match_positions(b"".join(mine), b"".join(theirs), 16)
    assert i_m.dtype == np.int64 and list(i_m) == sorted(i_m) and len(i_m) == 120
    assert all(mine[i] == theirs[j] for i, j in zip(i_m, i_t))
    with pytest.raises(ValueError, match="repeated"):
        psi.match_positions(b"".join(mine), b"".join(theirs + theirs[:1]), 16)
    e_m, e_t = psi.match_positions(b"", b"".join(theirs), 16)
    assert e_m.size == 0 and e_t.size == 0


def test_match_positions_prefix_collisions_are_exact(monkeypatch):
    """The sorted join keys on 8 bytes; equal keys with different tails must not match."""
    theirs = [os.urandom(12) for _ in range(50)]
    mine = [theirs[3][:8] + b"tail", theirs[7], os.urandom(12), theirs[40]]  # item 0: same key, other tail
    i_m, i_t = psi.match_positions(b"".join(mine), b"".join(theirs), 12)
    assert list(i_m) == [1, 3] and list(i_t) == [7, 40]
    # a key repeated inside one list (not a repeated value) takes the exact path, same answer
    calls = []
    exact = psi._match_positions_exact
    monkeypatch.setattr(psi, "_match_positions_exact", lambda *a: calls.append(1) or exact(*a))
    theirs2 = theirs + [theirs[7][:8] + b"zzzz"]
    i_m, i_t = psi.match_positions(b"".join(mine), b"".join(theirs2), 12)
    assert calls and list(i_m) == [1, 3] and list(i_t) == [7, 40]
    with pytest.raises(ValueError, match="at least 8"):
        psi.match_positions(b"", b"", 4)


def test_find_duplicate():
    assert psi.find_duplicate(["a", "b", "c"]) is None
    assert psi.find_duplicate([]) is None
    assert psi.find_duplicate(["a", "b", "a", "b", "b"]) == ("a", 3)


def test_engine_pool_gives_identical_output(monkeypatch):
    monkeypatch.setattr(psi, "_CHUNK", 700)  # several chunks per worker
    ids = [f"p{i}" for i in range(3000)]
    k = psi.new_scalar()
    serial = psi.hash_and_blind(ids, CTX, k)
    with psi.PsiEngine(2, min_parallel=1) as eng:
        assert eng.hash_and_blind(ids, CTX, k) == serial
        assert eng.blind(serial, k, 16) == psi.blind(serial, k, 16)
        bad = bytearray(serial)
        bad[32 * 2100:32 * 2101] = (1).to_bytes(32, "little")
        with pytest.raises(psi.LowOrderPointError) as err:
            eng.blind(bytes(bad), k)
        assert err.value.index == 2100  # index is global, not within the worker's chunk
