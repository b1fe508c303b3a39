"""KKRT OT-extension primitives for private set intersection (no networking).

The protocol that uses these pieces is :mod:`secureflhv.vertical.psi_kkrt`; this module only computes.
Source: Kolesnikov, Kumaresan, Rosulek & Trieu, "Efficient Batched Oblivious PRF with Applications to
Private Set Intersection", ACM CCS 2016 (KKRT) -- section 3 (batched OPRF from OT extension with a
pseudo-random code), section 5 (PSI with cuckoo hashing). Semi-honest security, like the ECDH-PSI of
:mod:`secureflhv.crypto.ecdh_psi`. Roles: the **receiver** R (our PSI guest, set X) obtains, for each of
its ``m`` cuckoo bins j, the value F(j, r_j) of an OPRF on its bin content r_j; the **sender** S (a
PSI host, set Y) can evaluate F(j, .) anywhere but learns nothing about the r_j.

Pieces and their sources (no primitive is implemented here: AES from ``cryptography``, BLAKE2b from
``hashlib``, the group from libsodium through PyNaCl's ``nacl.bindings``):

* **Base OT** (:class:`BaseOtSender`, :class:`BaseOtReceiver`): Bellare & Micali, "Non-interactive
  oblivious transfer and applications", CRYPTO 1989, in the hashed-ElGamal form of Naor & Pinkas,
  "Efficient oblivious transfer protocols", SODA 2001 (section 3.1), random-OT variant: over the
  prime-order Ed25519 group (order l ~ 2**252, ~126-bit discrete-log security) with a public point
  Cp = from_uniform(H(session)) of unknown discrete log. For OT i the receiver, with choice bit s_i,
  picks scalar a_i and sends PK0_i where PK_{s_i} = g^a_i and PK_{1-s_i} = Cp - g^a_i (so
  PK0 + PK1 = Cp: it cannot know both discrete logs without knowing Cp's); the sender picks r_i,
  sends R_i = g^r_i and keeps k_b,i = H(i, b, R_i, PK_b,i, PK_b,i^r_i); the receiver computes
  k_{s_i},i = H(i, s_i, R_i, PK_{s_i}, R_i^a_i). The sender learns nothing about s_i (PK0_i is a
  uniform point either way); the receiver cannot compute k_{1-s_i} (CDH, H a random oracle).
  Received points must pass ``crypto_core_ed25519_is_valid_point`` (canonical, on the curve, in
  the prime-order subgroup, not of small order), else :class:`InvalidPointError`.
  Here (KKRT section 3 / IKNP) the roles flip: the PSI **host** is the base-OT receiver with
  ``BASE_OTS`` = 512 random choice bits s', the guest the base-OT sender.
* **Choice-bit swap** (:func:`random_bits`, :func:`swap_base_ot_keys`): the host picks s' itself, and
  IKNP is only as safe as s is random -- a host with s' = 0 gets Q = T, so that every bin "matches"
  whatever the guest holds. So after the base OTs, *once the host's points have arrived* (they fix
  which key of each pair it can compute), the guest draws 512 fresh bits delta from the OS, sends them
  and relabels its key pairs: (k0', k1')_i = (k_{delta_i}, k_{1-delta_i}). The key the host holds,
  k_{s'_i}, is then k'_{s'_i xor delta_i}: the extension runs with the effective choice bits
  s = s' xor delta, uniform and independent of anything the host chose (delta is uniform and drawn
  after s' was fixed). The host learns s, as in the honest protocol; nothing else changes (the same
  idea as the coin-tossed choice bits of actively secure OT extensions: Keller, Orsini & Scholl,
  "Actively secure OT extension with optimal overhead", CRYPTO 2015, section 3; and Orrù, Orsini &
  Scholl, "Actively secure 1-out-of-N OT extension with application to private set intersection",
  CT-RSA 2017, whose consistency check against a malicious *receiver* is not implemented here: see
  :mod:`secureflhv.vertical.psi_kkrt`).
* **OT extension** (IKNP, Ishai, Kilian, Nissim & Petrank, CRYPTO 2003, generalised by KKRT
  section 3 to codewords): with PRG G = AES-128-CTR keyed by a 16-byte seed, column i of the
  receiver's matrices is t^i = G(k0_i) and u^i = G(k0_i) xor G(k1_i) xor c^i where row j of C is
  the codeword C(r_j). Row j of the sender's matrix Q is q_j = t_j xor (C(r_j) AND s)
  (:func:`sender_rows`, :func:`receiver_rows`; tests check the identity). U travels row-wise
  (``m x 64`` bytes, the same matrix as KKRT's columns, transposed).
* **Pseudo-random code** (:class:`Prc`): C(x, i) = AES-128-ECB_K(x || 4i+0) || ... || AES_K(x || 4i+3),
  four blocks = ``CODE_BITS`` = 512 bits, with x a 15-byte hash of the ID and i the cuckoo hash
  index (3 for dummy bins, which never match a real item), K a fresh per-session key derived from
  the run's salt. Why this is a PRC in KKRT's sense (their definition 2: outputs of distinct inputs
  are far apart except with negligible probability): the four AES inputs are injective in (x, i),
  so for a random key and AES modelled as a PRP, the codewords of distinct inputs are independent
  uniform 512-bit strings; their Hamming distance is Binomial(512, 1/2) and falls below kappa = 128
  with probability < 2**-96 per pair (Chernoff, KL(1/4 || 1/2) = 0.189 bits/bit), < 2**-74 over
  the ~3 * 2**20 (bin, host item) pairs of a 1M-item run: comfortably inside the 2**-40 statistical
  bound; 512 = four AES blocks is also the width that keeps everything block-aligned.
* **OPRF output** (:func:`oprf_hash`): F(j, x) = BLAKE2b(key = session, digest_size = t)(j || q_j
  xor (C(x) AND s)), truncated to t bytes by BLAKE2b's digest size (at least 12). The
  receiver's own value for its bin content is BLAKE2b(j || t_j). With n_g guest items and 3 n_h
  host values a false match has probability <= 3 n_g n_h / 2**(8t): < 2**-86 for 1M x 1M and
  t = 16 (t = 12: < 2**-54), below the 2**-40 statistical bound KKRT section 5 asks for.
* **Cuckoo hashing** (:func:`hash_ids`, :func:`cuckoo_place`): 3 hash functions into
  :func:`cuckoo_bins` (n) = e n (+ slack, rounded to 128) bins, no stash, e = ``BIN_FACTOR`` = 1.48.
  Why 1.48: cryptoTools (the KKRT authors' library; SecretFlow's yacl copies it),
  ``CuckooIndex::selectParams`` without stash, fits the failure probability 2**-lambda of 3-hash
  cuckoo hashing as lambda = 240 e - log2(n) - 256 for n >= 512 (experimentally determined), i.e.
  e = 1.317 for lambda = 40 at n = 2**20. e = 1.48 gives lambda >= 74 up to the protocol's
  ``MAX_SET_SIZE`` (~2**24): a margin for a fit, at ~12% more bins. Below 512 items the fit's per-size
  lines ask for more room, which the 64 slack bins and the rounding to 128 give (lambda >= 48 by those
  lines for every n < 512; the worst case is n ~ 31). If placement fails anyway, the guest picks a fresh salt *before anything is sent*; that
  reveals only that the final salt places X, which changes the salt's distribution from uniform by at
  most the failure probability (statistical distance <= 2**-40).

Security model: semi-honest (KKRT) plus the choice-bit swap, which makes the host's choice bits uniform
even when the host deviates; a guest that deviates (crafts U) is not caught, see
:mod:`secureflhv.vertical.psi_kkrt` for what that allows and how jobs keep KKRT away from it.

Security parameters: computational kappa = 128 (AES-128 seeds and PRG, 512 base OTs so that at
least kappa bits of s mask every wrong codeword, BLAKE2b), statistical lambda = 40 (cuckoo failure,
PRC distance, truncation). Item hash width: 15 bytes, so two different IDs share a hash with
probability <= n_g n_h / 2**120 (< 2**-80 for 1M x 1M).

Shapes and dtypes: item hashes ``(n, 15) uint8``, bin candidates ``(n, 3) int64``, codewords and
matrix rows ``(m, 64) uint8`` (bit i of a row is bit i % 8 of byte i // 8), PRG columns
``(512, m / 8) uint8`` (bit j of a column is bit j % 8 of byte j // 8); ``m`` is a multiple of 128.
"""
from __future__ import annotations

import hashlib
import math
import os
from typing import Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from nacl import bindings as sodium

__all__ = [
    "DOMAIN", "BASE_OTS", "CODE_BITS", "CODE_BYTES", "SEED_BYTES", "ITEM_BYTES", "N_HASHES", "BIN_FACTOR",
    "POINT_BYTES", "DUMMY_INDEX", "base_ot_cp", "InvalidPointError", "CuckooError", "session_context", "cuckoo_bins",
    "BaseOtSender", "BaseOtReceiver", "prg_columns", "transpose_columns", "Prc", "hash_ids", "cuckoo_place",
    "receiver_rows", "sender_rows", "oprf_hash", "bits_to_mask", "mask_to_bits", "random_bits", "swap_base_ot_keys",
    "DELTA_BYTES", "guest_table", "guest_codewords", "guest_values",
    "host_values",
]

DOMAIN = b"secureflhv/psi/kkrt/v1"
BASE_OTS = 512               # = CODE_BITS: one base OT per codeword bit
CODE_BITS = 512
CODE_BYTES = CODE_BITS // 8
SEED_BYTES = 16              # AES-128 key of the PRG: kappa = 128
ITEM_BYTES = 15              # hash of an ID in an AES block (its last byte holds the code index)
N_HASHES = 3
BIN_FACTOR = 1.48            # bins per guest item: stash-less failure far below 2**-40 (module docstring)
DUMMY_INDEX = N_HASHES       # code index of dummy bins
POINT_BYTES = 32
DELTA_BYTES = BASE_OTS // 8  # the guest's swap bits delta on the wire
ROW_ALIGN = 128              # rows per AES-CTR block of a column: blocks start at counter offsets
_BLOCK_ROWS = 1 << 16        # rows per transposed block (~4 MiB per 512-column slice)
_CHUNK = 1 << 15             # items per vectorised PRC/hash chunk


class InvalidPointError(ValueError):
    """A received group element is not a valid prime-order Ed25519 point.

    Attributes:
        index: position of the offending 32-byte point in its list.
    """

    def __init__(self, index: int, what: str = "point"):
        super().__init__(f"{what} {index} is not a valid prime-order Ed25519 point")
        self.index = index


class CuckooError(RuntimeError):
    """Cuckoo placement did not finish within its round limit (retry with a fresh salt)."""


def session_context(job_id: str, salt: bytes) -> bytes:
    """The 32-byte BLAKE2b key of one KKRT-PSI run, from the job id and the guest's random salt.

    Every key of the run (ID hash, base-OT point Cp, PRC key, OPRF hash) is derived from it with
    a distinct label, so a fresh salt makes all of them fresh.
    """
    job = job_id.encode("utf-8")
    return hashlib.blake2b(DOMAIN + b"\0" + len(job).to_bytes(4, "big") + job + bytes(salt),
                           digest_size=32).digest()


def _derive(context: bytes, label: bytes, size: int = 32) -> bytes:
    return hashlib.blake2b(label, key=context, digest_size=size).digest()


def cuckoo_bins(n: int) -> int:
    """Number of cuckoo bins for ``n`` guest items: ceil(1.48 n) + 64 slack, rounded up to 128.

    Both parties compute it from the set size in the hello, so it is never sent. The slack makes
    small tables fail rarely; at 1M items it is noise.
    """
    if n < 0:
        raise ValueError(f"set size must be >= 0, got {n}")
    m = math.ceil(BIN_FACTOR * n) + 64
    return -(-m // ROW_ALIGN) * ROW_ALIGN


# ------------------------------------------------------------------------------- base OT
def _random_scalar() -> bytes:
    # 64 uniform bytes reduced mod l: statistically uniform scalar (bias < 2**-259)
    while True:
        s = sodium.crypto_core_ed25519_scalar_reduce(os.urandom(64))
        if any(s):
            return s


def base_ot_cp(context: bytes) -> bytes:
    """The base OTs' public point Cp of unknown discrete log: libsodium's Elligator map of a session hash (cofactor cleared)."""
    return sodium.crypto_core_ed25519_from_uniform(_derive(context, b"base-ot/Cp"))


def _check_point_list(points: bytes, count: int, what: str) -> list[bytes]:
    if len(points) != count * POINT_BYTES:
        raise ValueError(f"{what}: {len(points)} bytes, expected {count} points of {POINT_BYTES} bytes")
    items = [bytes(points[i:i + POINT_BYTES]) for i in range(0, len(points), POINT_BYTES)]
    valid = sodium.crypto_core_ed25519_is_valid_point
    for i, p in enumerate(items):
        if not valid(p):
            raise InvalidPointError(i, what)
    return items


def _ot_key(context: bytes, i: int, bit: int, r_point: bytes, pk: bytes, shared: bytes) -> bytes:
    h = hashlib.blake2b(key=context, digest_size=SEED_BYTES, person=b"kkrt-base-ot")
    h.update(i.to_bytes(4, "little") + bytes([bit]) + r_point + pk + shared)
    return h.digest()


class BaseOtSender:
    """Sender of ``count`` random base OTs (the PSI guest): gets both keys k0_i, k1_i of every OT.

    Args:
        context: :func:`session_context` of the run.
        count: number of OTs (``BASE_OTS`` in the protocol).

    Use: send :meth:`points` (``count`` 32-byte points R_i = g^r_i); on the receiver's points PK0,
    :meth:`keys` returns ``(k0, k1)``, two ``(count, 16) uint8`` arrays. Learns nothing about the
    receiver's choice bits.
    """

    def __init__(self, context: bytes, count: int = BASE_OTS):
        self.context, self.count = context, count
        self._r = [_random_scalar() for _ in range(count)]
        self._R = [sodium.crypto_scalarmult_ed25519_base_noclamp(r) for r in self._r]
        self._cp = base_ot_cp(context)

    def points(self) -> bytes:
        """The ``count`` 32-byte points R_i = g^r_i, concatenated, to send to the receiver."""
        return b"".join(self._R)

    def keys(self, receiver_points: bytes) -> tuple[np.ndarray, np.ndarray]:
        """Both keys of every OT from the receiver's PK0 points.

        Raises:
            ValueError: wrong length; :class:`InvalidPointError` for an invalid PK0_i or an
                invalid PK1_i = Cp - PK0_i (e.g. PK0_i = Cp), naming i.
        """
        pk0 = _check_point_list(receiver_points, self.count, "base-OT receiver point")
        mult, sub, valid = (sodium.crypto_scalarmult_ed25519_noclamp, sodium.crypto_core_ed25519_sub,
                            sodium.crypto_core_ed25519_is_valid_point)
        k0 = np.empty((self.count, SEED_BYTES), np.uint8)
        k1 = np.empty((self.count, SEED_BYTES), np.uint8)
        for i, (r, R, p0) in enumerate(zip(self._r, self._R, pk0)):
            p1 = sub(self._cp, p0)
            if not valid(p1):
                raise InvalidPointError(i, "base-OT receiver point (Cp - PK0)")
            k0[i] = np.frombuffer(_ot_key(self.context, i, 0, R, p0, mult(r, p0)), np.uint8)
            k1[i] = np.frombuffer(_ot_key(self.context, i, 1, R, p1, mult(r, p1)), np.uint8)
        return k0, k1


class BaseOtReceiver:
    """Receiver of ``count`` random base OTs (the PSI host) with choice bits ``choices``.

    Args:
        context: :func:`session_context` of the run.
        choices: ``(count,) bool`` choice bits s (the OT-extension secret; random in the protocol).

    Use: send :meth:`points` (PK0_i); on the sender's points R, :meth:`keys` returns the
    ``(count, 16) uint8`` keys k_{s_i},i. Learns nothing about the other key of each OT.
    """

    def __init__(self, context: bytes, choices: np.ndarray):
        choices = np.asarray(choices, dtype=bool)
        self.context, self.count, self.choices = context, choices.size, choices
        cp = base_ot_cp(context)
        self._a = [_random_scalar() for _ in range(self.count)]
        self._pk_own = [sodium.crypto_scalarmult_ed25519_base_noclamp(a) for a in self._a]
        sub = sodium.crypto_core_ed25519_sub
        # PK0 = g^a for s = 0, Cp - g^a for s = 1 (then PK1 = Cp - PK0 = g^a): uniform either way
        self._pk0 = [sub(cp, p) if s else p for p, s in zip(self._pk_own, choices.tolist())]

    def points(self) -> bytes:
        """The ``count`` 32-byte points PK0_i, concatenated, to send to the sender."""
        return b"".join(self._pk0)

    def keys(self, sender_points: bytes) -> np.ndarray:
        """k_{s_i},i for every OT from the sender's points R_i.

        Raises:
            ValueError: wrong length; :class:`InvalidPointError` naming an invalid R_i.
        """
        R = _check_point_list(sender_points, self.count, "base-OT sender point")
        mult = sodium.crypto_scalarmult_ed25519_noclamp
        out = np.empty((self.count, SEED_BYTES), np.uint8)
        for i, (a, Ri, pk, s) in enumerate(zip(self._a, R, self._pk_own, self.choices.tolist())):
            out[i] = np.frombuffer(_ot_key(self.context, i, int(s), Ri, pk, mult(a, Ri)), np.uint8)
        return out


def random_bits(count: int = BASE_OTS) -> np.ndarray:
    """``(count,) bool`` uniform bits from the OS CSPRNG (``count`` a multiple of 8): the host's s', the guest's delta."""
    return mask_to_bits(np.frombuffer(os.urandom(count // 8), np.uint8), count)


def swap_base_ot_keys(k0: np.ndarray, k1: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The guest's choice-bit swap (module docstring): ``(k0', k1')`` with k'_b,i = k_{b xor delta_i},i.

    Args:
        k0, k1: ``(count, 16) uint8`` both keys of every base OT (:meth:`BaseOtSender.keys`).
        delta: ``(count,) bool`` fresh random bits, drawn after the receiver's points arrived.

    Returns:
        two new ``(count, 16) uint8`` arrays. A receiver with choice bits s' holds k'_{s' xor delta}:
        the OT extension then runs with choice bits s' xor delta, which is uniform.
    """
    d = np.asarray(delta, dtype=bool).reshape(-1, 1)
    if d.shape[0] != k0.shape[0] or k0.shape != k1.shape:
        raise ValueError(f"delta has {d.shape[0]} bits for {k0.shape[0]} and {k1.shape[0]} key pairs")
    return np.where(d, k1, k0), np.where(d, k0, k1)


# --------------------------------------------------------------------------- OT extension
def prg_columns(seeds: np.ndarray, start_row: int, rows: int) -> np.ndarray:
    """G(seed_i) restricted to bits [start_row, start_row + rows) of every column: ``(k, rows/8) uint8``.

    G is AES-128-CTR keyed by the 16-byte seed, counter starting at 0 (big-endian block counter),
    so a block of rows starting at a multiple of 128 is a contiguous slice of the same stream.
    """
    if start_row % ROW_ALIGN or rows % ROW_ALIGN:
        raise ValueError(f"start_row and rows must be multiples of {ROW_ALIGN}, got {start_row}, {rows}")
    seeds = np.ascontiguousarray(seeds, dtype=np.uint8)
    iv = (start_row // ROW_ALIGN).to_bytes(16, "big")
    zeros = bytes(rows // 8)
    out = np.empty((seeds.shape[0], rows // 8), np.uint8)
    for i in range(seeds.shape[0]):
        enc = Cipher(algorithms.AES(seeds[i].tobytes()), modes.CTR(iv)).encryptor()
        out[i] = np.frombuffer(enc.update(zeros), np.uint8)
    return out


_S7, _S14, _S28 = np.uint64(7), np.uint64(14), np.uint64(28)
_M7, _M14, _M28 = np.uint64(0x00AA00AA00AA00AA), np.uint64(0x0000CCCC0000CCCC), np.uint64(0x00000000F0F0F0F0)


def transpose_columns(cols: np.ndarray) -> np.ndarray:
    """Bit-transpose ``(k, r/8) uint8`` columns into ``(r, k/8) uint8`` rows (k, r multiples of 8).

    Row j bit i == column i bit j (little-endian bit order in each byte). Byte-level reshapes put
    every 8x8 bit block into one uint64, transposed there by three delta swaps (Knuth, TAOCP 7.1.3;
    Warren, "Hacker's Delight" section 7-3) -- ~4x faster than ``np.unpackbits``/``packbits``.
    """
    k, rb = cols.shape
    if k % 8:
        raise ValueError(f"number of columns must be a multiple of 8, got {k}")
    # x[j, c] = the 8 bytes cols[8c .. 8c+7, j] (byte r holds bit b of item 8j+b for column 8c+r)
    x = np.ascontiguousarray(cols.reshape(k // 8, 8, rb).transpose(2, 0, 1)).view("<u8").reshape(rb, k // 8)  # masks assume little-endian
    t = (x ^ (x >> _S7)) & _M7
    x = x ^ t ^ (t << _S7)
    t = (x ^ (x >> _S14)) & _M14
    x = x ^ t ^ (t << _S14)
    t = (x ^ (x >> _S28)) & _M28
    x = x ^ t ^ (t << _S28)
    # now byte b of x[j, c] holds bit r = column 8c+r of item 8j+b
    return np.ascontiguousarray(x.view(np.uint8).reshape(rb, k // 8, 8).transpose(0, 2, 1)).reshape(rb * 8, k // 8)


def bits_to_mask(bits: np.ndarray) -> np.ndarray:
    """``(k,) bool`` bits as a ``(k/8,) uint8`` row mask (bit i is bit i % 8 of byte i // 8)."""
    return np.packbits(np.asarray(bits, dtype=np.uint8), bitorder="little")


def mask_to_bits(mask, count: int) -> np.ndarray:
    """Inverse of :func:`bits_to_mask`: ``(count,) bool`` from ``count / 8`` packed bytes (bytes or uint8 array)."""
    data = np.frombuffer(bytes(mask), np.uint8) if not isinstance(mask, np.ndarray) else mask
    if data.size * 8 != count:
        raise ValueError(f"{data.size} bytes for {count} bits")
    return np.unpackbits(data, bitorder="little").astype(bool)


def receiver_rows(k0: np.ndarray, k1: np.ndarray, codewords: np.ndarray,
                  start_row: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The receiver's (guest's) OT-extension step for ``m`` rows (``m`` = len(codewords), a multiple of 128).

    Args:
        k0, k1: ``(512, 16) uint8`` base-OT keys (this party was the base-OT sender).
        codewords: ``(m, 64) uint8``, row j = C(r_{start_row + j}).
        start_row: the matrix row of ``codewords[0]`` (a multiple of 128): rows ``[start_row,
            start_row + m)`` of the full matrices, so that a matrix can be computed (and sent) in parts.

    Returns:
        ``(T, U)``: ``(m, 64) uint8`` each; T row j = t_j (the receiver keeps it: its OPRF value
        is H(j || t_j)), U row j = t_j xor G(k1)_j xor C(r_j) (sent to the sender).
    """
    m = codewords.shape[0]
    if m % ROW_ALIGN or codewords.shape[1] * 8 != k0.shape[0]:
        raise ValueError(f"codewords must be (multiple of {ROW_ALIGN}, {k0.shape[0] // 8}), got {codewords.shape}")
    T = np.empty_like(codewords)
    U = np.empty_like(codewords)
    for a in range(0, m, _BLOCK_ROWS):
        rows = min(_BLOCK_ROWS, m - a)
        g0 = prg_columns(k0, start_row + a, rows)
        T[a:a + rows] = transpose_columns(g0)
        g0 ^= prg_columns(k1, start_row + a, rows)
        np.bitwise_xor(transpose_columns(g0), codewords[a:a + rows], out=U[a:a + rows])
    return T, U


def sender_rows(keys: np.ndarray, choices: np.ndarray, U: np.ndarray, start_row: int = 0,
                out: np.ndarray | None = None) -> np.ndarray:
    """The sender's (host's) OT-extension step: Q with row j = q_j = t_j xor (C(r_j) AND s).

    Args:
        keys: ``(512, 16) uint8`` base-OT keys k_{s_i},i (this party was the base-OT receiver).
        choices: ``(512,) bool`` the base-OT choice bits s.
        U: ``(m, 64) uint8`` rows ``[start_row, start_row + m)`` of the receiver's matrix.
        start_row: the matrix row of ``U[0]`` (a multiple of 128), for a matrix received in parts.
        out: optional ``(m, 64) uint8`` array to write Q into (e.g. a slice of the full Q).

    Returns:
        ``(m, 64) uint8`` (``out`` if given): column i of Q is G(k_{s_i}) xor s_i u^i, i.e. row-wise
        G-rows xor (U AND s).
    """
    m = U.shape[0]
    if m % ROW_ALIGN or U.shape[1] * 8 != keys.shape[0] or start_row % ROW_ALIGN:
        raise ValueError(f"U must be (multiple of {ROW_ALIGN}, {keys.shape[0] // 8}) from a row multiple of "
                         f"{ROW_ALIGN}, got {U.shape} from row {start_row}")
    mask = bits_to_mask(choices)
    Q = np.empty_like(U) if out is None else out
    if Q.shape != U.shape or Q.dtype != np.uint8:
        raise ValueError(f"out must be a {U.shape} uint8 array, got {Q.shape} {Q.dtype}")
    for a in range(0, m, _BLOCK_ROWS):
        rows = min(_BLOCK_ROWS, m - a)
        np.bitwise_and(U[a:a + rows], mask, out=Q[a:a + rows])
        Q[a:a + rows] ^= transpose_columns(prg_columns(keys, start_row + a, rows))
    return Q


# ------------------------------------------------------------------------ code and hashes
class Prc:
    """The pseudo-random code C(x, i) = AES-128-ECB_K(x || 4i) || ... || AES_K(x || 4i+3) (512 bits).

    Args:
        context: :func:`session_context`; the AES key K is derived from it (fresh per run).

    See the module docstring for why this is a pseudo-random code in KKRT's sense.
    """

    def __init__(self, context: bytes):
        self._key = _derive(context, b"prc-key", 16)

    def encode(self, items: np.ndarray, index) -> np.ndarray:
        """Codewords of ``(n, 15) uint8`` item hashes with code index ``index`` (int or ``(n,)`` ints 0..3).

        Returns ``(n, 64) uint8``.
        """
        n = items.shape[0]
        blocks = np.empty((n, 4, 16), np.uint8)
        blocks[:, :, :ITEM_BYTES] = items[:, None, :]
        blocks[:, :, ITEM_BYTES] = (np.asarray(index, dtype=np.uint8) * 4).reshape(-1, 1) + np.arange(4, dtype=np.uint8)
        enc = Cipher(algorithms.AES(self._key), modes.ECB()).encryptor()
        out = np.empty(n * CODE_BYTES + 15, np.uint8)  # update_into wants block_size - 1 spare bytes
        written = enc.update_into(blocks.reshape(-1), out)
        return out[:written].reshape(n, CODE_BYTES)


def hash_ids(ids: Sequence[str], context: bytes, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Item hashes and cuckoo bin candidates of every ID.

    One BLAKE2b-320 (key derived from ``context``) per ID's UTF-8 bytes: bytes 0..14 are the item
    hash, bytes 16..39 three little-endian uint64 reduced mod ``bins`` (bias <= bins / 2**64).

    Returns:
        ``(items (n, 15) uint8, candidates (n, 3) int64)``.
    """
    base = hashlib.blake2b(key=_derive(context, b"id-hash"), digest_size=40)
    out = []
    append = out.append
    for ident in ids:
        h = base.copy()
        h.update(ident.encode("utf-8"))
        append(h.digest())
    d = np.frombuffer(b"".join(out), np.uint8).reshape(-1, 40)
    cand = (np.ascontiguousarray(d[:, 16:]).view("<u8") % np.uint64(max(bins, 1))).astype(np.int64)
    return np.ascontiguousarray(d[:, :ITEM_BYTES]), cand.reshape(-1, N_HASHES)


def cuckoo_place(candidates: np.ndarray, bins: int, rng: np.random.Generator | None = None,
                 max_rounds: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    """Place every item in one of its candidate bins, at most one item per bin (no stash).

    Parallel random-walk insertion (all unplaced items write themselves into their current bin at
    once; whoever is not in the table afterwards -- lost a write race or was evicted -- moves on to
    a uniformly random other one of its hash functions), vectorised with numpy.

    Args:
        candidates: ``(n, 3) int64`` bin candidates from :func:`hash_ids`.
        bins: number of bins.
        rng: randomness of the walk (default: fresh from the OS).
        max_rounds: give up after this many rounds.

    Returns:
        ``(table (bins,) int64`` item index per bin or -1, ``index (n,) int8`` the hash function used).

    Raises:
        CuckooError: some item is still unplaced after ``max_rounds`` rounds.
    """
    rng = rng if rng is not None else np.random.default_rng()
    n = candidates.shape[0]
    table = np.full(bins, -1, np.int64)
    index = np.zeros(n, np.int8)
    pending = np.arange(n, dtype=np.int64)
    for _ in range(max_rounds):
        if pending.size == 0:
            return table, index
        b = candidates[pending, index[pending]]
        old = table[b]
        table[b] = pending                  # repeated bins: one writer survives
        won = table[b] == pending
        evicted = old[won]                  # one previous occupant per written bin
        pending = np.concatenate([pending[~won], evicted[evicted >= 0]])
        step = rng.integers(1, N_HASHES, size=pending.size, dtype=np.int8)
        index[pending] = (index[pending] + step) % N_HASHES
    if pending.size == 0:
        return table, index
    raise CuckooError(f"{pending.size} of {n} items unplaced in {bins} bins after {max_rounds} rounds")


def oprf_hash(context: bytes, bin_index: np.ndarray, rows: np.ndarray, out_bytes: int) -> bytes:
    """F values: BLAKE2b(key = session, digest_size = out_bytes)(uint32 j || row) for every row.

    Args:
        bin_index: ``(n,)`` ints, the bin j of each row (< 2**32).
        rows: ``(n, 64) uint8``: t_j at the receiver, q_j xor (C(y) AND s) at the sender.
        out_bytes: t, 1..64.

    Returns:
        ``n * out_bytes`` bytes, in input order.
    """
    n = rows.shape[0]
    if not 1 <= out_bytes <= 64:
        raise ValueError(f"out_bytes must be in [1, 64], got {out_bytes}")
    buf = np.empty((n, 4 + CODE_BYTES), np.uint8)
    buf[:, :4] = np.asarray(bin_index, dtype="<u4").reshape(n, 1).view(np.uint8)
    buf[:, 4:] = rows
    data = buf.tobytes()
    base = hashlib.blake2b(key=_derive(context, b"oprf"), digest_size=out_bytes)
    w = 4 + CODE_BYTES
    out = []
    append = out.append
    for off in range(0, len(data), w):
        h = base.copy()
        h.update(data[off:off + w])
        append(h.digest())
    return b"".join(out)


# ------------------------------------------------------------------- per-role compositions
def guest_table(ids: Sequence[str], job_id: str, *, max_tries: int = 8,
                rng: np.random.Generator | None = None):
    """Choose the run's salt and cuckoo-hash the guest's IDs under it (before anything is sent).

    A failed placement (probability ~2**-40 at the recommended sizes) draws a fresh salt; see the
    module docstring for what that reveals.

    Returns:
        ``(salt (32 bytes), context, items (n, 15) uint8, candidates (n, 3) int64,
        table (m,) int64, index (n,) int8)`` with ``m = cuckoo_bins(len(ids))``.

    Raises:
        CuckooError: ``max_tries`` salts failed (practically impossible).
    """
    m = cuckoo_bins(len(ids))
    for _ in range(max_tries):
        salt = os.urandom(32)
        context = session_context(job_id, salt)
        items, cand = hash_ids(ids, context, m)
        try:
            table, index = cuckoo_place(cand, m, rng)
        except CuckooError:
            continue
        return salt, context, items, cand, table, index
    raise CuckooError(f"cuckoo hashing of {len(ids)} IDs into {m} bins failed under {max_tries} salts")


def guest_codewords(prc: Prc, items: np.ndarray, table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``(m, 64) uint8``: row j = C(item in bin j, its hash index), or C(random, DUMMY_INDEX) if empty."""
    m = table.shape[0]
    occupied = table >= 0
    src = np.empty((m, ITEM_BYTES), np.uint8)
    src[occupied] = items[table[occupied]]
    src[~occupied] = np.frombuffer(os.urandom(ITEM_BYTES * int((~occupied).sum())), np.uint8).reshape(-1, ITEM_BYTES)
    code_index = np.full(m, DUMMY_INDEX, np.uint8)
    code_index[occupied] = index[table[occupied]]
    out = np.empty((m, CODE_BYTES), np.uint8)
    for a in range(0, m, _CHUNK):
        out[a:a + _CHUNK] = prc.encode(src[a:a + _CHUNK], code_index[a:a + _CHUNK])
    return out


def guest_values(context: bytes, T: np.ndarray, candidates: np.ndarray, index: np.ndarray, out_bytes: int) -> bytes:
    """The guest's OPRF value of each of its items, in its row order: H(j || t_j) for its bin j.

    Returns ``n * out_bytes`` bytes.
    """
    n = candidates.shape[0]
    j = candidates[np.arange(n), index.astype(np.int64)]
    return b"".join(oprf_hash(context, j[a:a + _CHUNK], T[j[a:a + _CHUNK]], out_bytes) for a in range(0, n, _CHUNK))


def host_values(context: bytes, Q: np.ndarray, choices: np.ndarray, items: np.ndarray, candidates: np.ndarray,
                out_bytes: int) -> bytes:
    """The host's OPRF values F(h_k(y), y || k) for every item y (its row order) and k = 0, 1, 2.

    Value ``3 * row + k`` is at bytes ``[(3 row + k) t, (3 row + k + 1) t)``; it equals the guest's
    value of y exactly when the guest placed y in bin h_k(y) with hash function k.

    Returns ``3 * n * out_bytes`` bytes.
    """
    prc = Prc(context)
    mask = bits_to_mask(choices)
    n = items.shape[0]
    ks = np.tile(np.arange(N_HASHES, dtype=np.uint8), min(n, _CHUNK))
    out = []
    for a in range(0, n, _CHUNK):
        it, cd = items[a:a + _CHUNK], candidates[a:a + _CHUNK]
        c = len(it)
        code = prc.encode(np.repeat(it, N_HASHES, axis=0), ks[:c * N_HASHES])
        j = cd.reshape(-1)
        code &= mask
        code ^= Q[j]
        out.append(oprf_hash(context, j, code, out_bytes))
    return b"".join(out)
