"""Shamir t-of-n over GF(2^521 - 1): any t shares reconstruct, t-1 shares do not."""
import itertools
import secrets

import pytest

from secureflhv.crypto import shamir


@pytest.mark.parametrize("n,t", [(5, 3), (7, 7), (4, 1), (10, 7)])
def test_any_t_shares_reconstruct(n, t):
    secret = secrets.randbits(256)
    shares = shamir.split(secret, range(1, n + 1), t)
    subsets = list(itertools.combinations(shares, t))[:40]
    for sub in subsets:
        assert shamir.reconstruct({x: shares[x] for x in sub}, t) == secret


@pytest.mark.parametrize("n,t", [(5, 3), (10, 7)])
def test_t_minus_1_shares_fail(n, t):
    secret = secrets.randbits(256)
    shares = shamir.split(secret, range(1, n + 1), t)
    sub = {x: shares[x] for x in list(shares)[:t - 1]}
    with pytest.raises(ValueError, match="needed"):
        shamir.reconstruct(sub, t)
    # Interpolating t-1 points as if the threshold were t-1 gives a wrong value (w.h.p. 1 - 1/p).
    assert shamir.reconstruct(sub, t - 1) != secret


def test_max_secret_and_bytes_roundtrip():
    secret = (1 << 256) - 1
    shares = shamir.split(secret, [1, 2, 3], 2)
    enc = {x: shamir.from_bytes(shamir.to_bytes(y)) for x, y in shares.items()}
    assert shamir.reconstruct(enc, 2) == secret
    with pytest.raises(ValueError):
        shamir.from_bytes(b"\xff" * shamir.SHARE_BYTES)  # >= p: not a field element
    with pytest.raises(ValueError):
        shamir.split(shamir.PRIME, [1, 2], 2)
    with pytest.raises(ValueError):
        shamir.split(1, [1, 1, 2], 2)
