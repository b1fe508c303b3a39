"""Okamoto-Uchiyama (OU) encryption: keys from SecretFlow's HEU, batch arithmetic on gmpy2.

Final API
---------
::

    DEFAULT_BITS, MIN_SECURE_BITS, RANDOM_BITS (key and randomness sizes in bits)
    generate_keypair(n_bits, *, insecure_test_key=False, racers=None) -> (OUPublicKey, OUPrivateKey)
    OUPublicKey(n, g, h, plain_bits, *, insecure_test_key=False)
        .n .g .h .plain_bits .n_bits .fingerprint .max_int .byte_width .nsquare (= n, the ciphertext modulus)
        OUPublicKey.from_peer(n, g, h, plain_bits, *, insecure_test_key=False)   (CiphertextError)
    OUPrivateKey(public_key, p, q, t, gp_inv)
    encrypt(key, x, precision_bits) -> paillier.EncryptedArray   (ciphertexts in Z*_n)
    encrypt_ints(key, mantissas) -> list[mpz] (public or private key);  decrypt_ints(priv, cts) -> list[int] (signed)
    decrypt(priv, enc) -> np.ndarray float64 of enc.shape

Ciphertexts live in :class:`secureflhv.crypto.homomorphic.paillier.EncryptedArray` with an :class:`OUPublicKey`:
its homomorphic arithmetic (sums, products by plaintexts, ``dot``, validation of a peer's values) is
the same modular arithmetic, with modulus n instead of Paillier's n^2 (``OUPublicKey.nsquare`` names
the ciphertext modulus so that code applies unchanged); only encryption, plaintext addition and
decryption differ and live here.

Scheme (Okamoto & Uchiyama, "A new public-key cryptosystem as secure as factoring", Eurocrypt'98,
with the subgroup acceleration of Coron, Naccache & Paillier, "Accelerating Okamoto-Uchiyama's
public-key cryptosystem", Electronics Letters 35(4), 1999, as SecretFlow HEU implements it):
``n = p^2 q`` with |p| = |q| = k/3, ``p = t u + 1`` with t a prime of 2 * 112 = 224 bits (2048-bit
keys; 256 bits at 3072), ``G = g^u mod n``, ``H = g'^(n u) mod n``.  ``Enc(m) = G^m H^r mod n``;
``Dec(c) = L(c^t mod p^2) / L(G^t mod p^2) mod p`` with ``L(x) = (x - 1) / p``; plaintexts live in
Z_p, |m| < 2^plain_bits = 2^(|p| - 2) (HEU's bound, 2^681 or so at 2048 bits), negative m as
``G^-|m|``.  Additively homomorphic: ``Enc(a) Enc(b) = Enc(a + b)``, ``Enc(a)^k = Enc(k a)``.

Where each part comes from, and why: key generation (the primes, t, G, H) is HEU's
(``heu.phe.setup(SchemaType.OU, k)``, C++; at 2048 bits and more two runs race in child processes and
the first key is taken, see ``_race_keygen``); we read the key's integers from its serialisation and
check them (``p^2 q = n``, ``t | p - 1``, a test encryption decrypts). Encryption and decryption are the
formulas above on gmpy2 with fixed-base tables (as for Paillier, :mod:`paillier_engine`; the key holder
encrypts modulo p^2 and q and combines by the CRT: the same ciphertexts for ~30% less CPU), for two
measured reasons: HEU keeps ciphertexts in its own Montgomery representation (its serialised ciphertext
is not the OU integer, so our wire format and range checks could not apply to it), and its encryptor
draws the randomness exponent r with 110 bits at 2048-bit keys (80 at 1024): generic short-exponent
attacks (Pollard's kangaroo on ``c / G^m = H^r``) then cost ~2^55, below the key's 112 bits. We draw r
uniformly with ``RANDOM_BITS = 256`` bits from ``os.urandom`` (kangaroo 2^128; and r exceeds the 224-bit
order of H mod p^2, so H^r is uniform there). Measured against HEU's OU in the same run
(``benchmarks/paillier.py``, 2048 bits, one core, 2-core EPYC, gmpy2 on Debian's GMP, 2026-11-27): our
encryption runs at 0.49x HEU's with the public key (24.6k/s vs 50.1k/s: 256-bit instead of 110-bit r, and
Python-level table lookups) and 0.61x by the key holder's CRT (30.4k/s), decryption 1.54x (10.7k/s vs
6.9k/s, one batched gmpy2 powmod by t mod p^2) and addition 3.3x (839k/s vs 254k/s, no per-object binding
overhead); so ours is behind the interface, and HEU's faster encryption is not taken because of its short
randomness.

Security and key sizes: factoring n = p^2 q; no method is known that factors it faster than an RSA
modulus of the same size when |p| = |q| = k/3 (the p^r q lattice methods of Boneh-Durfee-Howgrave-
Graham, CRYPTO'99, need r ~ log p; ECM on a 683-bit factor is far out of reach), and discrete logs in
the order-t subgroup cost 2^(|t|/2) = 2^112.  So 2048-bit n gives ~112-bit security (NIST SP 800-57
level of 2048-bit RSA), the default and minimum; 3072 bits for ~128-bit security.  Keys below 2048
bits only through the explicit test-only setting.  IND-CPA under the p-subgroup assumption
(Okamoto-Uchiyama) plus the short-exponent assumption for r (as for Paillier's DJN variant).

What each role learns: as for Paillier, the key holder learns what it decrypts (so callers mask
first: :class:`secureflhv.crypto.homomorphic.backend.OUHE`); a public-key holder learns shapes and exponents only.
"""
from __future__ import annotations

import hashlib
import logging
import os
import types
from collections import OrderedDict

import gmpy2
import numpy as np
from gmpy2 import mpz

from ...compute import executor as _ex
from ...compute import pool as _par
from .paillier import EncryptedArray, FingerprintedKey, _SMALL_PRIMES, int_to_bytes
from .paillier_encoding import CiphertextError, DecryptedRangeError, encode_mantissas, ints_to_float
from .paillier_engine import FixedBaseTable, random_digits

log = logging.getLogger(__name__)

DEFAULT_BITS = 2048
MIN_SECURE_BITS = 2048
RANDOM_BITS = 256            # bits of the randomness exponent r (generic attacks: 2^(RANDOM_BITS/2))
TEST_MIN_BITS = 1024         # HEU refuses smaller OU keys (its 160-bit t needs |p| >= 320)
FP_DOMAIN = b"secureflhv/ou/public-key/v1"
_H_WINDOW, _G_WINDOW = 12, 10  # fixed-base windows: r (22 rows of 4096, ~26 MB at 2048 bits), m (69 rows of 1024, x2)
# A key's first H table has the window w = 10 (26 rows of 1,024: a third of the w = 12 table's build,
# ~0.09 s less per worker at 2048 bits, for 4 more multiplications per encryption); the w = 12 table
# follows after _H_LARGE_AFTER encryptions by the engine, when its build has paid for itself.
_H_WINDOW_FIRST, _H_LARGE_AFTER = 10, 20_000
_TABLE_MIN_BATCH = 16
PAR_ENCRYPT_MIN = 2048       # encryptions below which a batch runs inline (a worker's first batch
                             # under a key also builds its H table, ~0.15 s at 2048 bits)
PAR_DECRYPT_MIN = 32         # decryptions below which a batch runs inline (~0.15 ms each at 2048 bits,
                             # a pool task ~0.5 ms)
_CACHE_SIZE = 2


def key_fingerprint(n: int, g: int, h: int, plain_bits: int) -> bytes:
    """SHA-256 naming an OU public key: domain, then n, G, H (length-prefixed big-endian) and plain_bits."""
    d = hashlib.sha256(FP_DOMAIN)
    for v in (n, g, h):
        b = int_to_bytes(v)
        d.update(len(b).to_bytes(4, "big") + b)
    d.update(int(plain_bits).to_bytes(4, "big"))
    return d.digest()


def _check_size(n_bits: int, insecure_test_key: bool) -> None:
    if n_bits < MIN_SECURE_BITS:
        if not insecure_test_key:
            raise ValueError(f"OU modulus of {n_bits} bits is below the {MIN_SECURE_BITS}-bit minimum; "
                             "pass insecure_test_key=True only in tests")
        log.warning("using an INSECURE %d-bit OU key (test only)", n_bits)


# ------------------------------------------------------------------------------------------ keys
class OUPublicKey(FingerprintedKey):
    """OU public key (n = p^2 q, G, H, plaintext bound 2^plain_bits).

    ``nsquare`` is the ciphertext modulus (n itself; named as Paillier's so that EncryptedArray's
    arithmetic applies). ``max_int``: the largest |plaintext| (2^plain_bits).
    """

    __slots__ = ("n", "g", "h", "plain_bits", "n_bits", "nsquare", "_n", "fingerprint", "max_int")
    scheme = "ou"

    def __init__(self, n, g, h, plain_bits: int, *, insecure_test_key: bool = False):
        n, g, h, plain_bits = int(n), int(g), int(h), int(plain_bits)
        if n < 3 or n % 2 == 0:
            raise ValueError("OU modulus must be an odd integer > 2")
        if not (1 < g < n and 1 < h < n):
            raise ValueError("OU bases G and H must lie in (1, n)")
        if not 16 <= plain_bits <= n.bit_length() // 3:  # HEU: 2^plain_bits <= p/4, |p| ~ k/3
            raise ValueError(f"OU plaintext bound 2^{plain_bits} does not fit a {n.bit_length()}-bit key")
        self.n, self.g, self.h, self.plain_bits = n, g, h, plain_bits
        self.n_bits = n.bit_length()
        _check_size(self.n_bits, insecure_test_key)
        self._n = mpz(n)
        self.nsquare = self._n
        self.fingerprint = key_fingerprint(n, g, h, plain_bits)
        self.max_int = 1 << plain_bits

    @property
    def byte_width(self) -> int:
        """Bytes of one serialised ciphertext (fixed width, big-endian): bytes of n."""
        return (self.n_bits + 7) // 8

    @classmethod
    def from_peer(cls, n: int, g: int, h: int, plain_bits: int, *, insecure_test_key: bool = False,
                  what: str = "OU public key") -> "OUPublicKey":
        """Validate a peer's key; raises CiphertextError (implausible modulus, bases not units, size)."""
        nm = mpz(n)
        if n < 3 or n % 2 == 0 or gmpy2.is_square(nm) or gmpy2.gcd(nm, _SMALL_PRIMES) != 1 or gmpy2.is_prime(nm):
            raise CiphertextError(f"{what}: n is not a plausible OU modulus")
        if not (1 < g < n and 1 < h < n) or gmpy2.gcd(mpz(g) * h % nm, nm) != 1:
            raise CiphertextError(f"{what}: G and H must be units in (1, n)")
        try:
            return cls(n, g, h, plain_bits, insecure_test_key=insecure_test_key)
        except ValueError as e:
            raise CiphertextError(f"{what} rejected: {e}") from None

    def add_plain_raw(self, cts, mantissas) -> list:
        """c * G^m mod n per pair (EncryptedArray's ``enc + plaintext``); OverflowError if |m| >= 2^plain_bits."""
        _check_range(self, mantissas)
        n = self._n
        return [c * gm % n for c, gm in zip(cts, engine(self).g_pow(mantissas))]


class OUPrivateKey:
    """OU private key: p, q, t (prime factor of p - 1 used as the decryption exponent), gp_inv."""

    __slots__ = ("public_key", "p", "q", "t", "gp_inv")

    def __init__(self, public_key: OUPublicKey, p, q, t, gp_inv):
        p, q, t, gp_inv = int(p), int(q), int(t), int(gp_inv)
        if p * p * q != public_key.n or (p - 1) % t or not 0 < gp_inv < p:
            raise ValueError("OU private key does not match its public key (p^2 q != n or t does not divide p - 1)")
        self.public_key, self.p, self.q, self.t, self.gp_inv = public_key, p, q, t, gp_inv

    def __repr__(self):
        return f"OUPrivateKey(for {self.public_key!r})"


def _unpack_msgpack_array(data: bytes) -> list:
    """The items of a msgpack fixarray of raw strings / binaries / small unsigned ints (HEU's key format).

    HEU serialises an MPInt as a raw string of its magnitude, little-endian; the trailing 8 bytes
    after the array are HEU's scheme tag. Raises ValueError for anything else.
    """
    if not data or not 0x90 <= data[0] <= 0x9F:
        raise ValueError("HEU key: not a msgpack array")
    count, i, out = data[0] & 0x0F, 1, []
    for _ in range(count):
        tag = data[i]
        if tag <= 0x7F:
            out.append(tag)
            i += 1
            continue
        if tag in (0xCC, 0xCD, 0xCE):
            size = {0xCC: 1, 0xCD: 2, 0xCE: 4}[tag]
            out.append(int.from_bytes(data[i + 1:i + 1 + size], "big"))
            i += 1 + size
            continue
        if 0xA0 <= tag <= 0xBF:
            ln, i = tag & 0x1F, i + 1
        elif tag in (0xD9, 0xC4):
            ln, i = data[i + 1], i + 2
        elif tag in (0xDA, 0xC5):
            ln, i = int.from_bytes(data[i + 1:i + 3], "big"), i + 3
        elif tag in (0xDB, 0xC6):
            ln, i = int.from_bytes(data[i + 1:i + 5], "big"), i + 5
        else:
            raise ValueError(f"HEU key: unexpected msgpack tag {tag:#x}")
        out.append(int.from_bytes(data[i:i + ln], "little"))
        i += ln
    return out


def keygen_racers(n_bits: int) -> int:
    """How many key generations :func:`generate_keypair` races: one per core (at most 2) for keys of
    2048 bits and more (~1 s each, heavy-tailed), one below (milliseconds: a process would cost more)."""
    return min(2, os.cpu_count() or 1) if int(n_bits) >= MIN_SECURE_BITS else 1


def _keygen_racer(n_bits: int, conn) -> None:
    """One racer of :func:`_race_keygen` (a child process): HEU's key generation, its two serialisations."""
    from heu import phe as hphe

    kit = hphe.setup(hphe.SchemaType.OU, n_bits)
    conn.send_bytes(kit.public_key().serialize())
    conn.send_bytes(kit.secret_key().serialize())
    conn.close()


def _race_keygen(n_bits: int, racers: int) -> tuple[bytes, bytes] | None:
    """HEU's key generation in ``racers`` child processes at once; the first key wins, the others are
    killed. None if no racer could be started or every racer failed (the caller then generates in
    this process).

    Why: HEU's OU key generation takes 0.3-5 s at 2048 bits (median ~1 s, one core; measured 16 runs)
    because it draws candidates p = t u + 1, each with a fresh random 224-bit prime t and random u,
    until one is prime (``heu/library/algorithms/ou/key_generator.cc``); the first of two takes a
    median ~0.7 s and at most ~1.6 s. The key's distribution is unchanged: each racer is an
    independent run, and a rejection sampler's accepted candidate does not depend on how many
    candidates it rejected before, so which racer finishes first says nothing about its key.
    The children only send bytes (no pickle), which ``generate_keypair`` parses and checks.
    """
    from multiprocessing.connection import wait

    ctx = _par.mp_context()
    procs, pending = [], []
    try:
        for _ in range(int(racers)):
            recv_end, send_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_keygen_racer, args=(int(n_bits), send_end), daemon=True,
                               name="secureflhv-ou-keygen")
            proc.start()
            send_end.close()
            procs.append(proc)
            pending.append(recv_end)
    except Exception as exc:  # noqa: BLE001 - e.g. a daemonic caller may not start processes
        log.info("OU key generation: racer processes unavailable (%s); generating in this process", exc)
    try:
        while pending:
            for conn in wait(pending):
                try:
                    return conn.recv_bytes(), conn.recv_bytes()
                except (EOFError, OSError):  # this racer died; the others go on
                    pending.remove(conn)
        if procs:
            log.warning("OU key generation failed in every racer process; generating in this process")
        return None
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        for conn in pending:
            conn.close()


def generate_keypair(n_bits: int = DEFAULT_BITS, *, insecure_test_key: bool = False,
                     racers: int | None = None) -> tuple[OUPublicKey, OUPrivateKey]:
    """New OU key pair from HEU's key generator (n of about n_bits bits; HEU rounds |p|, |q| up).

    ``racers``: key generations run at once in child processes, the first key taken (default
    :func:`keygen_racers`; see :func:`_race_keygen`); 1 generates in this process.
    Raises ValueError below 2048 bits without ``insecure_test_key`` (and below 1024 bits at all:
    HEU's minimum); ImportError naming the package if sf-heu is not installed.
    """
    n_bits = int(n_bits)
    _check_size(n_bits, insecure_test_key)
    if n_bits < TEST_MIN_BITS:
        raise ValueError(f"OU keys need at least {TEST_MIN_BITS} bits (HEU's minimum), got {n_bits}")
    try:
        from heu import phe as hphe
    except ImportError as exc:  # pragma: no cover - sf-heu is a linux dependency
        raise ImportError("the OU scheme needs SecretFlow HEU: pip install 'sf-heu>=0.5.2b0'") from exc
    k = keygen_racers(n_bits) if racers is None else int(racers)
    keys = _race_keygen(n_bits, k) if k > 1 else None
    if keys is None:
        kit = hphe.setup(hphe.SchemaType.OU, n_bits)
        keys = kit.public_key().serialize(), kit.secret_key().serialize()
    n, g, h, plain_bits = _unpack_msgpack_array(keys[0])
    p, q, t, gp_inv, p2, _p_half, n2 = _unpack_msgpack_array(keys[1])
    if n2 != n or p2 != p * p:
        raise ValueError("HEU key: public and secret parts disagree")
    pub = OUPublicKey(n, g, h, plain_bits, insecure_test_key=insecure_test_key)
    priv = OUPrivateKey(pub, p, q, t, gp_inv)
    probe = [0, 1, -1, 123456789, -(1 << (plain_bits - 1))]
    if decrypt_ints(priv, encrypt_ints(pub, probe)) != probe:
        raise ValueError("HEU key: a test encryption did not decrypt (unexpected key format)")
    return pub, priv


def arith_key(n: int):
    """What EncryptedArray arithmetic needs of an OU key in a worker process (the ciphertext modulus)."""
    return types.SimpleNamespace(nsquare=mpz(n), n=int(n))


# -------------------------------------------------------------------------------------- engine
class _Half:
    """Fixed-base tables of H (fresh randomness) and of G, G^-1 (the message) modulo one modulus: n for
    a public-key holder, p^2 or q for the key holder's CRT halves (built on first bulk use)."""

    def __init__(self, g, h, mod, plain_bits: int):
        self.mod = mpz(mod)
        self.g, self.h = mpz(g) % self.mod, mpz(h) % self.mod
        self.g_inv = gmpy2.invert(self.g, self.mod)
        self.plain_bits = plain_bits
        self.h_table = self._g_tables = None

    def h_table_of(self, w: int) -> FixedBaseTable:
        """The H table with window ``w`` or larger (replaced by a w table if smaller)."""
        cur = self.h_table
        if cur is None or cur.w < w:
            cur = self.h_table = FixedBaseTable(self.h, self.mod, RANDOM_BITS, w)
        return cur

    def _g_tables_for(self, bits: int):
        """G and G^-1 tables covering exponents of ``bits`` bits, grown on demand (at least doubling, up
        to plain_bits + 1): small messages (SecureBoost's packed (g, h), ~80 bits) need only their
        first rows, a ninth of the full tables' build time."""
        cur = self._g_tables  # (bits, G table, G^-1 table), replaced as one object: threads share engines
        if cur is None or cur[0] < bits:
            grown = bits if cur is None else max(bits, 2 * cur[0])
            g_bits = min(self.plain_bits + 1, max(grown, _G_WINDOW))
            cur = self._g_tables = (g_bits, FixedBaseTable(self.g, self.mod, g_bits, _G_WINDOW),
                                    FixedBaseTable(self.g_inv, self.mod, g_bits, _G_WINDOW))
        return cur[1], cur[2]

    def g_pow(self, mantissas: list[int]) -> list[mpz]:
        """G^m mod this half's modulus for signed ints |m| < 2^(plain_bits+1) (G^-1 for negative m);
        only m's own digits cost."""
        tp, tn = self._g_tables_for(max((abs(m).bit_length() for m in mantissas), default=1))
        m_, w, mask = self.mod, tp.w, (1 << tp.w) - 1
        rows_p, rows_n = tp.rows, tn.rows
        out = []
        for m in mantissas:
            rows = rows_p if m >= 0 else rows_n
            a, acc, i = abs(m), mpz(1), 0
            while a:
                d = a & mask
                if d:
                    acc = acc * rows[i][d] % m_
                a >>= w
                i += 1
            out.append(acc)
        return out


class _Engine:
    """Encryption under one key, with fixed-base tables: modulo n (public key), or modulo p^2 and q
    combined by the CRT (the key holder, ``p`` and ``q`` given: the same G^m H^r, ~30% less CPU).

    The key holder's ciphertexts have exactly the public formula's distribution: one r per ciphertext,
    its digits shared by both halves, so ``c mod p^2 = G^m H^r mod p^2`` and ``c mod q = G^m H^r mod q``
    determine ``c = G^m H^r mod n``."""

    def __init__(self, pub: OUPublicKey, p: int | None = None, q: int | None = None):
        self.n = pub._n
        self.g, self.h = mpz(pub.g), mpz(pub.h)
        self.plain_bits = pub.plain_bits
        if p is None:
            self.halves = [_Half(self.g, self.h, self.n, self.plain_bits)]
        else:
            p2, q = mpz(p) ** 2, mpz(q)
            self.halves = [_Half(self.g, self.h, p2, self.plain_bits), _Half(self.g, self.h, q, self.plain_bits)]
            self._p2, self._q, self._p2_inv = p2, q, gmpy2.invert(p2, q)
        self._used = 0

    @property
    def _h_table(self):
        return self.halves[0].h_table

    def encrypt(self, mantissas: list[int], cols=None) -> list[mpz]:
        """G^m H^r mod n per signed int m, r uniform of RANDOM_BITS bits (os.urandom); ``cols``: r's
        base-2^w digits, column-major (:func:`random_digits`; tests give their own)."""
        count = len(mantissas)
        self._used += count
        if cols is None and self._h_table is None and self._used < _TABLE_MIN_BATCH:
            n, nb = self.n, RANDOM_BITS // 8
            raw = os.urandom(nb * count)
            rs = [int.from_bytes(raw[i * nb:(i + 1) * nb], "big") for i in range(count)]
            return [gmpy2.powmod(self.g, m, n) * gmpy2.powmod(self.h, r, n) % n for m, r in zip(mantissas, rs)]
        w = _H_WINDOW if self._used >= _H_LARGE_AFTER else _H_WINDOW_FIRST
        tables = [half.h_table_of(w) for half in self.halves]
        if cols is None:
            cols = random_digits(tables[0].n_digits, count, tables[0].w)
        res = [[a * b % half.mod for a, b in zip(half.g_pow(mantissas), table.pow_columns(cols))]
               for half, table in zip(self.halves, tables)]
        if len(res) == 1:
            return res[0]
        p2, q, inv = self._p2, self._q, self._p2_inv
        return [cp + p2 * ((cq - cp) * inv % q) for cp, cq in zip(res[0], res[1])]

    def g_pow(self, mantissas) -> list[mpz]:
        """G^m mod n (public engine), the small-batch path without tables as for ``encrypt``."""
        mantissas = [int(m) for m in mantissas]
        if self._h_table is None and self._used + len(mantissas) < _TABLE_MIN_BATCH:
            n, g, gi = self.n, self.g, self.halves[0].g_inv
            return [gmpy2.powmod(g if m >= 0 else gi, abs(m), n) for m in mantissas]
        return self.halves[0].g_pow(mantissas)


_ENGINES: OrderedDict = OrderedDict()


def engine(pub: OUPublicKey, priv: "OUPrivateKey | None" = None) -> _Engine:
    """The cached engine of ``pub`` (tables built once per key and process); with ``priv`` the key
    holder's CRT engine."""
    key = (pub.fingerprint, priv is not None)
    eng = _ENGINES.get(key)
    if eng is None:
        eng = _ENGINES[key] = _Engine(pub) if priv is None else _Engine(pub, priv.p, priv.q)
        while len(_ENGINES) > _CACHE_SIZE:
            _ENGINES.popitem(last=False)
    else:
        _ENGINES.move_to_end(key)
    return eng


def _check_range(pub: OUPublicKey, mantissas) -> None:
    if mantissas and max(abs(int(m)) for m in mantissas) >= pub.max_int:
        raise OverflowError(f"OU plaintext needs more than the key's {pub.plain_bits} bits")


def encrypt_ints(key, mantissas) -> list[mpz]:
    """G^m H^r mod n for each signed int m (|m| < 2^plain_bits), fresh r each. OverflowError beyond.

    ``key``: an :class:`OUPublicKey`, or the :class:`OUPrivateKey` (the same ciphertexts computed by
    the CRT, see :class:`_Engine`). Large batches run on the executor's workers
    (:mod:`secureflhv.compute.executor`), each drawing its own r from os.urandom."""
    priv = key if isinstance(key, OUPrivateKey) else None
    pub = priv.public_key if priv else key
    mantissas = [int(m) for m in mantissas]
    _check_range(pub, mantissas)
    # one chunk per worker: a table's rows stay in cache across a longer batch (417 rows a chunk
    # cost 25% more per encryption than 3,336 at 2048 bits), and every encryption costs the same
    parts = _ex.parallel_chunks(len(mantissas), PAR_ENCRYPT_MIN, per_worker=1)
    if parts == 1:
        return engine(pub, priv).encrypt(mantissas)
    chunks = [(c,) for c in _par.split(mantissas, parts)]
    crt = (priv.p, priv.q) if priv else (0, 0)
    res = _ex.run(task_encrypt_ints, (pub.n, pub.g, pub.h, pub.plain_bits, *crt), chunks)
    return [c for r in res for c in r]


def task_encrypt_ints(n: int, g: int, h: int, plain_bits: int, p: int, q: int, mantissas: list) -> list[mpz]:
    """Worker side of :func:`encrypt_ints` (the caller checked the range; the engine is cached per key;
    p = q = 0: the public key's engine, else the key holder's CRT engine)."""
    pub = types.SimpleNamespace(_n=mpz(n), g=g, h=h, plain_bits=plain_bits,
                                fingerprint=key_fingerprint(n, g, h, plain_bits))
    priv = types.SimpleNamespace(p=p, q=q) if p else None
    return engine(pub, priv).encrypt(mantissas)


def decrypt_ints(priv: OUPrivateKey, cts) -> list[int]:
    """Signed plaintexts in (-p/2, p/2) of raw ciphertexts (c^t mod p^2); batches of PAR_DECRYPT_MIN
    and more on the executor's workers."""
    cts = list(cts)
    parts = _ex.parallel_chunks(len(cts), PAR_DECRYPT_MIN)
    if parts == 1:
        return task_decrypt_ints(priv.p, priv.t, priv.gp_inv, cts)
    res = _ex.run(task_decrypt_ints, (priv.p, priv.t, priv.gp_inv), [(c,) for c in _par.split(cts, parts)])
    return [m for r in res for m in r]


def task_decrypt_ints(p: int, t: int, gp_inv: int, cts: list) -> list[int]:
    """:func:`decrypt_ints` of one batch in this process (a batched gmpy2 powmod by t mod p^2)."""
    p = mpz(p)
    p2 = p * p
    xs = gmpy2.powmod_base_list([mpz(c) % p2 for c in cts], mpz(t), p2)
    gi, half = mpz(gp_inv), p // 2
    out = []
    for x in xs:
        m = (x - 1) // p * gi % p
        out.append(int(m - p if m > half else m))
    return out


def encrypt(key, x, precision_bits: int) -> EncryptedArray:
    """Encrypt an array (any shape) at exponent -precision_bits under an OU key (public or private).

    Raises OverflowError if a value needs plain_bits bits or more at this precision.
    """
    pub = key.public_key if isinstance(key, OUPrivateKey) else key
    a = np.asarray(x)
    m = encode_mantissas(a, precision_bits, 3 * pub.max_int)  # its limit n//3 becomes 2^plain_bits
    cts = np.empty(len(m), dtype=object)
    cts[:] = encrypt_ints(key, m)
    return EncryptedArray(pub, cts.reshape(a.shape), -precision_bits)


def _same_key(priv: OUPrivateKey, enc: EncryptedArray) -> None:
    if enc.public_key != priv.public_key:
        raise CiphertextError("EncryptedArray was made under a different public key than this OU private key")


def decrypt_signed(priv: OUPrivateKey, enc: EncryptedArray) -> list[int]:
    """Signed plaintext integers of every ciphertext of ``enc`` (C order), undecoded."""
    _same_key(priv, enc)
    return decrypt_ints(priv, enc.ciphertexts.reshape(-1).tolist())


def decrypt(priv: OUPrivateKey, enc: EncryptedArray) -> np.ndarray:
    """Decrypt to float64 of enc.shape.

    Raises CiphertextError for another key; DecryptedRangeError if a plaintext left the encodable
    range (|m| >= 2^plain_bits: a homomorphic result overflowed, or a peer's ciphertext was forged).
    """
    if enc.packing is not None:
        raise TypeError("OU: packed ciphertexts are not supported by this backend")
    vals = decrypt_signed(priv, enc)
    limit = priv.public_key.max_int
    if vals and max(abs(v) for v in vals) >= limit:
        raise DecryptedRangeError("decrypted OU value out of the encodable range: a peer's ciphertext was "
                                  "corrupted, or a homomorphic result overflowed")
    return ints_to_float(vals, enc.exponent).reshape(enc.shape)
