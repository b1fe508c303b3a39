"""Shamir t-of-n secret sharing over the prime field GF(p), p = 2^521 - 1 (a Mersenne prime).

Used by secure aggregation (Bonawitz et al., CCS 2017, Sec. 3.1 and Fig. 4, "ShareKeys") to share
256-bit secrets (the self-mask seed b_u and the X25519 mask key s_u^SK); p > 2^256 so every secret is a
field element. Shamir, "How to share a secret", CACM 1979.

Security: any t-1 shares are independent of the secret (information-theoretic); coefficients come
from :mod:`secrets`. Share x-coordinates are 1..n (never 0, which is the secret).

No crypto library offers Shamir sharing, so this is the textbook construction; it uses Python's
arbitrary-precision ints (pow(a, -1, p) for inverses). It is not constant time (secrets are random
one-time values held in memory by the parties anyway).
"""
from __future__ import annotations

import secrets as _secrets
from typing import Mapping, Sequence

PRIME = (1 << 521) - 1
SHARE_BYTES = 66  # ceil(521 / 8)


def split(secret: int, xs: Sequence[int], threshold: int, prime: int = PRIME) -> dict[int, int]:
    """Share ``secret`` (0 <= secret < prime) among points ``xs`` (distinct, in [1, prime)).

    Returns: {x: f(x)} with f a random polynomial of degree threshold-1 and f(0) = secret.
    Raises: ValueError for a secret out of range, threshold not in [1, len(xs)], bad/duplicate xs.
    """
    if not 0 <= secret < prime:
        raise ValueError("secret must be in [0, prime)")
    xs = [int(x) for x in xs]
    if len(set(xs)) != len(xs) or any(not 0 < x < prime for x in xs):
        raise ValueError(f"share points must be distinct and in [1, prime): {xs}")
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold {threshold} must be in [1, {len(xs)}]")
    coeffs = [secret] + [_secrets.randbelow(prime) for _ in range(threshold - 1)]
    out = {}
    for x in xs:
        acc = 0
        for c in reversed(coeffs):  # Horner
            acc = (acc * x + c) % prime
        out[x] = acc
    return out


def reconstruct(shares: Mapping[int, int], threshold: int, prime: int = PRIME) -> int:
    """f(0) by Lagrange interpolation from ``threshold`` of ``shares`` ({x: y}).

    Raises: ValueError when fewer than ``threshold`` shares are given (t-1 shares determine nothing).
    """
    if len(shares) < threshold:
        raise ValueError(f"{len(shares)} shares given, {threshold} needed to reconstruct")
    pts = sorted(shares.items())[:threshold]
    xs = [x for x, _ in pts]
    if len(set(xs)) != len(xs) or any(not 0 < x < prime for x in xs):
        raise ValueError(f"share points must be distinct and in [1, prime): {xs}")
    secret = 0
    for i, (xi, yi) in enumerate(pts):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * (-xj) % prime
                den = den * (xi - xj) % prime
        secret = (secret + yi * num * pow(den, -1, prime)) % prime
    return secret


def to_bytes(value: int) -> bytes:
    """A field element (share value or secret) as ``SHARE_BYTES`` big-endian bytes."""
    return int(value).to_bytes(SHARE_BYTES, "big")


def from_bytes(data: bytes, prime: int = PRIME) -> int:
    """Decode a share value; raises ValueError if not SHARE_BYTES long or not < prime."""
    if len(data) != SHARE_BYTES:
        raise ValueError(f"share value has {len(data)} bytes, expected {SHARE_BYTES}")
    v = int.from_bytes(data, "big")
    if v >= prime:
        raise ValueError("share value is not a field element")
    return v
