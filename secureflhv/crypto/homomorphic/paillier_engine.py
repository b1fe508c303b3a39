"""Raw-integer Paillier engine on gmpy2: DJN fixed-base encryption, CRT decryption, multi-exponentiation.

Everything here works on plain ints / ``gmpy2.mpz`` (lists or numpy object arrays), never on phe
``EncryptedNumber`` objects.  The module-level ``task_*`` functions are what worker processes run
(see :mod:`secureflhv.compute.pool`); they take only integers and cache the derived
per-key tables in the worker.  The security argument is in :mod:`secureflhv.crypto.homomorphic.paillier`.

Sources: Damgård, Jurik, Nielsen, "A generalization of Paillier's public-key system with
applications to electronic voting", IJIS 2010, sec. 4 (h_s = h^n, short random exponent of
ceil(k/2) bits); Lim & Lee, CRYPTO'94 / Menezes et al. HAC 14.109 (fixed-base windowed tables: w = 10,
then w = 13 (public key) / 12 (CRT) for a key in heavy use, see ``window_bits`` and ``LARGE_TABLE_AFTER``);
Pippenger / bucket method (HAC 14.88 family) for the multi-exponentiation in ``dot``.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict, deque

import gmpy2
import numpy as np
from gmpy2 import mpz

from ...compute import pool as _pool

H_DOMAIN = b"secureflhv/paillier/djn-h/v1"
TABLE_MIN_BATCH = 64      # below this (and no table yet) a plain powmod per value is cheaper
# After this many encryptions under one key the small table is replaced by the large one: building
# it costs ~6x the small one (about 3 s of CPU at 2048 bits, w = 13), repaid after ~30,000 encryptions
# (24 fewer multiplications mod n^2, ~0.1 ms, per encryption); built at once for a batch whose share
# for this process is that large (``expected`` in ``encrypt``).
LARGE_TABLE_AFTER = 30_000
_CACHE_SIZE = 2           # engines (and their tables, tens to ~190 MB) kept per process


def alpha_bits(n_bits: int) -> int:
    """Bit length of the DJN random exponent alpha: ceil(k/2) for a k-bit modulus (DJN 2010, sec. 4)."""
    return (int(n_bits) + 1) // 2


def window_bits(n_bits: int, large: bool = False, crt: bool = False) -> int:
    """Fixed-base window: 2**w entries per digit of the ceil(k/2)-bit DJN exponent.

    Small (first) table: w=10, 103 digits and ~54 MB at 2048 bits. Large table (a key in heavy
    use), public key: w=13, 79 digits (23% fewer multiplications mod n^2 per encryption than w=10),
    ~360 MB at 2048 bits; the key holder's two CRT tables (``crt=True``, half-size entries): w=12,
    86 digits, ~190 MB for both. Measured with column-major evaluation (``pow_columns``) on a 2-core
    EPYC, same process: public w=13 vs w=12 +7% (2,412 vs 2,260/s), CRT w=13 vs w=12 only +4% for
    twice the memory, so CRT stays at w=12. 3072-bit keys (768-byte entries): w=11 / w=9.
    """
    if large:
        if n_bits > 2048:
            return 11
        return 12 if crt else 13
    return 10 if n_bits <= 2048 else 9


def derive_h(n) -> mpz:
    """Public DJN base h = -x^2 mod n with x = SHAKE-256(domain || counter || n) mod n.

    Deterministic from n alone (so phe-made keys work and nothing extra is sent); nobody, the key
    holder included, knows a relation between x and anything else (random-oracle argument).
    """
    n = mpz(n)
    nb = (n.bit_length() + 7) // 8
    n_bytes = int(n).to_bytes(nb, "big")
    for ctr in range(1 << 16):
        digest = hashlib.shake_256(H_DOMAIN + ctr.to_bytes(4, "big") + n_bytes).digest(nb + 32)
        x = mpz(int.from_bytes(digest, "big")) % n
        if x > 1 and gmpy2.gcd(x, n) == 1:
            return (-x * x) % n
    raise ValueError("could not derive the DJN base h from n")  # needs n with tiny factors: not a key


class FixedBaseTable:
    """Windowed fixed-base table: rows[i][j] = base^(j * 2^(w*i)) mod m.

    ``pow_digits(d)`` returns base^(sum_i d_i 2^(w i)) mod m with len(d)-1 multiplications.
    """

    def __init__(self, base, mod, exp_bits: int, w: int):
        self.mod, self.w = mpz(mod), int(w)
        self.n_digits = -(-int(exp_bits) // self.w)
        size, m = 1 << self.w, self.mod
        g = mpz(base) % m
        rows = []
        for _ in range(self.n_digits):
            row = [mpz(1), g]
            for _ in range(size - 2):
                row.append(row[-1] * g % m)
            rows.append(row)
            g = row[-1] * g % m  # g^(2^w)
        self.rows = rows

    def pow_digits(self, digits) -> mpz:
        """``base ** e mod m`` for the exponent whose base-``2**w`` digits (least significant first) are
        ``digits``: one table lookup and one multiplication per digit (Lim & Lee, CRYPTO'94).
        """
        m = self.mod
        it = zip(self.rows, digits)
        row, d = next(it)
        acc = row[d]
        for row, d in it:
            acc = acc * row[d] % m
        return acc

    def pow_many(self, digit_lists) -> list[mpz]:
        """``pow_digits`` of each digit list (the loop kept local: the hot path of encryption)."""
        m, rows = self.mod, self.rows
        r0, rest = rows[0], rows[1:]
        out = []
        for digits in digit_lists:
            acc = r0[digits[0]]
            for row, d in zip(rest, digits[1:]):
                acc = acc * row[d] % m
            out.append(acc)
        return out

    def random_columns(self, count: int) -> list[list[int]]:
        """Digits of ``count`` fresh uniform alphas, column-major: ``cols[i][j]`` is digit i of alpha j.

        Same distribution as :func:`random_digits` (os.urandom, n_digits * w bits per alpha).
        """
        return random_digits(self.n_digits, count, self.w)

    def seeded_columns(self, seed: bytes, count: int) -> list[list[int]]:
        """As :meth:`random_columns`, drawn from SHAKE-256(``seed``) (:func:`seeded_digits`): processes
        given the same secret seed and a table of the same window draw the same alphas."""
        return seeded_digits(seed, self.n_digits, count, self.w)

    def pow_columns(self, cols) -> list[mpz]:
        """``pow_digits`` of every alpha given column-major (see ``random_columns``).

        Digit position by digit position over the whole batch: each step reads one row of the table
        (2^w entries, ~2 MB at w = 12, 2048-bit keys) for every value, so the row stays in cache
        instead of one random row per multiplication; and a list comprehension per position keeps the
        interpreter overhead per multiplication low.  ~9% faster than ``pow_many`` at 2048 bits.
        """
        m, rows = self.mod, self.rows
        r0 = rows[0]
        accs = [r0[d] for d in cols[0]]
        for row, col in zip(rows[1:], cols[1:]):
            accs = [a * row[d] % m for a, d in zip(accs, col)]
        return accs


def random_digits(rows: int, cols: int, w: int) -> list[list[int]]:
    """A ``rows`` x ``cols`` grid (list of ``rows`` lists) of independent uniform base-2^w digits
    (os.urandom). Read by rows it is ``rows`` alphas of ``cols`` digits each (``pow_many``); with
    ``rows`` = the table's digit count it is the digit columns of ``cols`` alphas (``pow_columns``).

    digits * w >= alpha_bits (e.g. 86*12 = 1032 >= 1024): the few extra bits only lengthen the
    uniform exponent, which DJN's argument allows (any length >= ceil(k/2)).
    """
    return _digits(os.urandom(2 * rows * cols), rows, cols, w)


def _digits(raw: bytes, rows: int, cols: int, w: int) -> list[list[int]]:
    """``rows`` lists of ``cols`` base-2^w digits, each the low w bits of 16 bits of ``raw``."""
    arr = np.frombuffer(raw, dtype="<u2").reshape(rows, cols)
    return (arr & np.uint16((1 << w) - 1)).tolist()


def seeded_digits(seed: bytes, rows: int, cols: int, w: int) -> list[list[int]]:
    """As :func:`random_digits`, drawn from SHAKE-256(``seed``) instead of os.urandom: two processes
    given the same secret seed draw the same exponents (the key holder's CRT halves computed apart).
    SHAKE-256 is an extendable-output function usable as a PRG (NIST SP 800-185 / FIPS 202); with a
    256-bit uniformly random seed its output is indistinguishable from uniform."""
    return _digits(hashlib.shake_256(seed).digest(2 * rows * cols), rows, cols, w)


def random_alphas(count: int, bits: int) -> list[mpz]:
    """``count`` fresh uniformly random exponents of ``bits`` bits (os.urandom)."""
    nb = (bits + 7) // 8
    raw = os.urandom(nb * count)
    mask = (1 << bits) - 1
    return [mpz(int.from_bytes(raw[i * nb:(i + 1) * nb], "big") & mask) for i in range(count)]


class PublicEngine:
    """Public-key operations for modulus n (DJN encryption with h_s = h^n mod n^2)."""

    def __init__(self, n):
        self.n = mpz(n)
        self.n2 = self.n * self.n
        self.n_bits = self.n.bit_length()
        self.h_s = gmpy2.powmod(derive_h(self.n), self.n, self.n2)
        self.alpha_bits = alpha_bits(self.n_bits)
        self._table: FixedBaseTable | None = None
        self._large = False
        self._used = 0
        self._lock = threading.Lock()  # a background precompute and an encryption may build the table together
        self._pool: deque = deque()    # obfuscators computed ahead (precompute), each handed out once

    def _ensure_table(self) -> FixedBaseTable | None:
        """The fixed-base table for the usage so far (None while a plain powmod is cheaper)."""
        with self._lock:
            if self._table is None and self._used < TABLE_MIN_BATCH:
                return None
            if self._table is None or (not self._large and self._used >= LARGE_TABLE_AFTER):
                self._large = self._used >= LARGE_TABLE_AFTER
                w = window_bits(self.n_bits, self._large)
                self._table = None  # free the small table before building the large one
                self._table = FixedBaseTable(self.h_s, self.n2, self.alpha_bits, w)
            return self._table

    def prepare(self, large: bool = True) -> None:
        """Build the (large) table now, e.g. before a timed phase; encryption is the same either way."""
        self._used = max(self._used, LARGE_TABLE_AFTER if large else TABLE_MIN_BATCH)
        self._ensure_table()

    def precompute(self, count: int) -> int:
        """Compute obfuscators h_s^alpha (fresh random alphas) ahead until ``count`` wait in the pool, e.g. in a
        background thread while a service idles; an encryption takes pooled ones first, each exactly once, so
        ciphertexts stay fresh and answers do not change. Returns the pool's size."""
        need = count - len(self._pool)
        if need > 0:
            fresh = self._fresh(need, 0)
            self._pool.extend(fresh)  # deque.extend / popleft are atomic under the GIL
        return len(self._pool)

    def _fresh(self, count: int, expected: int) -> list[mpz]:
        self._used = max(self._used + count, expected)
        table = self._ensure_table()
        if table is None:
            return [gmpy2.powmod(self.h_s, a, self.n2) for a in random_alphas(count, self.alpha_bits)]
        return table.pow_columns(table.random_columns(count))

    def _obfuscators(self, count: int, expected: int = 0) -> list[mpz]:
        taken = []
        while len(taken) < count:
            try:
                taken.append(self._pool.popleft())
            except IndexError:
                break
        rest = count - len(taken)
        return taken + self._fresh(rest, expected) if rest else taken

    def encrypt(self, mantissas, expected: int = 0) -> list[mpz]:
        """c = (1 + m n) * h_s^alpha mod n^2, computed as r + n*(m r mod n) (one half-size product).

        ``expected``: encryptions this process is about to do in the current batch, this chunk included
        (a worker's share): from ``LARGE_TABLE_AFTER`` on, the large table is built before the first one
        rather than after ``LARGE_TABLE_AFTER`` of them (``scale.py``, two workers of 50,000 rows each:
        encryption 19.1 -> 17.1 s)."""
        n, n2 = self.n, self.n2
        out = []
        for m, r in zip(mantissas, self._obfuscators(len(mantissas), expected)):
            c = r + n * (m * r % n)
            out.append(c - n2 if c >= n2 else c)
        return out

    def add_plain(self, cts, mantissas) -> list[mpz]:
        """c * (1 + m n) mod n^2 == c + n*(m c mod n) mod n^2."""
        n, n2 = self.n, self.n2
        out = []
        for c, m in zip(cts, mantissas):
            r = c + n * (m * c % n)
            out.append(r - n2 if r >= n2 else r)
        return out


class PrivateEngine:
    """Key-holder operations with CRT over p^2 and q^2 (decryption; faster encryption)."""

    def __init__(self, p, q):
        p, q = mpz(p), mpz(q)
        if p == q:
            raise ValueError("p and q must differ")
        self.p, self.q = p, q
        self.n = p * q
        self.p2, self.q2 = p * p, q * q
        self.pm1, self.qm1 = p - 1, q - 1
        g = self.n + 1
        self.hp = gmpy2.invert((gmpy2.powmod(g, p - 1, self.p2) - 1) // p, p)
        self.hq = gmpy2.invert((gmpy2.powmod(g, q - 1, self.q2) - 1) // q, q)
        self.q_inv_p = gmpy2.invert(q, p)
        self.q2_inv_p2 = gmpy2.invert(self.q2, self.p2)
        pub = public_engine(self.n)
        self.hs_p, self.hs_q = pub.h_s % self.p2, pub.h_s % self.q2
        self.alpha_bits = pub.alpha_bits
        self._tables = [None, None]  # the fixed-base tables mod p^2 (half 0) and q^2 (half 1)
        self._large = [False, False]
        self._used = 0

    def table(self, half: int, large: bool) -> FixedBaseTable:
        """The fixed-base table of CRT half ``half`` (0: mod p^2, 1: mod q^2): the large one if asked
        for or already built, else the small one (built now if this process has none yet)."""
        t = self._tables[half]
        if t is None or (large and not self._large[half]):
            self._tables[half] = None  # free the small table before building the large one
            w = window_bits(self.n.bit_length(), large, crt=True)
            self._tables[half] = t = FixedBaseTable((self.hs_p, self.hs_q)[half], (self.p2, self.q2)[half],
                                                    self.alpha_bits, w)
            self._large[half] = large
        return t

    def _ensure_tables(self):
        """Both half-size fixed-base tables (mod p^2, q^2), grown like PublicEngine's."""
        if self._tables == [None, None] and self._used < TABLE_MIN_BATCH:
            return None
        large = self._used >= LARGE_TABLE_AFTER or any(self._large)  # one alpha's digits serve both: same w
        return self.table(0, large), self.table(1, large)

    def prepare(self, large: bool = True) -> None:
        """Build the (large) tables now (see PublicEngine.prepare)."""
        self._used = max(self._used, LARGE_TABLE_AFTER if large else TABLE_MIN_BATCH)
        self._ensure_tables()

    def decrypt(self, cts) -> list[mpz]:
        """Plaintext residues in [0, n) (Paillier decryption with CRT, phe's formula)."""
        p, q = self.p, self.q
        xp = gmpy2.powmod_base_list(cts, self.pm1, self.p2)
        xq = gmpy2.powmod_base_list(cts, self.qm1, self.q2)
        hp, hq, qinv = self.hp, self.hq, self.q_inv_p
        out = []
        for a, b in zip(xp, xq):
            mp = (a - 1) // p * hp % p
            mq = (b - 1) // q * hq % q
            out.append(mq + q * ((mp - mq) * qinv % p))
        return out

    def encrypt(self, mantissas, expected: int = 0) -> list[mpz]:
        """Same ciphertext distribution as PublicEngine.encrypt, with two half-size tables (CRT);
        ``expected`` as there."""
        self._used = max(self._used + len(mantissas), expected)
        tables = self._ensure_tables()
        if tables is None:
            alphas = random_alphas(len(mantissas), self.alpha_bits)
            rps = [gmpy2.powmod(self.hs_p, a, self.p2) for a in alphas]
            rqs = [gmpy2.powmod(self.hs_q, a, self.q2) for a in alphas]
        else:
            tp, tq = tables
            cols = tp.random_columns(len(mantissas))  # one alpha per value, used mod p^2 and mod q^2
            rps = tp.pow_columns(cols)
            rqs = tq.pow_columns(cols)
        return self.combine(self._with_message(0, mantissas, rps), self._with_message(1, mantissas, rqs))

    def _with_message(self, half: int, mantissas, rs) -> list[mpz]:
        """(1 + m n) r mod p^2 == r + p*(m q r mod p) since n = p q (and likewise mod q^2)."""
        a, b = (self.p, self.q) if half == 0 else (self.q, self.p)
        a2 = a * a
        out = []
        for m, r in zip(mantissas, rs):
            c = r + a * (m * b * r % a)
            out.append(c - a2 if c >= a2 else c)
        return out

    def encrypt_half(self, half: int, mantissas, cols, large: bool) -> list[mpz]:
        """CRT half ``half`` (0: mod p^2, 1: mod q^2) of the encryptions of ``mantissas`` whose DJN
        exponents are given as base-2^w digit columns ``cols`` (w of the ``large`` or small table,
        :meth:`FixedBaseTable.random_columns`); :meth:`combine` of the two halves, made with the same
        columns, is :meth:`encrypt`'s ciphertext. Only this half's table is built in this process.

        Returns len(mantissas) residues (mpz, in [0, p^2) or [0, q^2)). Raises ValueError when the
        columns are not one per digit of the table (a table of another window: the exponents differ).
        """
        table = self.table(half, large)
        if len(cols) != table.n_digits:
            raise ValueError(f"{len(cols)} digit columns for a table of {table.n_digits} digits")
        return self._with_message(half, mantissas, table.pow_columns(cols))

    def combine(self, cps, cqs) -> list[mpz]:
        """Ciphertexts in [0, n^2) from their residues mod p^2 (``cps``) and mod q^2 (``cqs``), two
        equal-length lists (CRT with the precomputed q^-2 mod p^2: one multiplication mod p^2 each)."""
        q2, p2, k = self.q2, self.p2, self.q2_inv_p2
        return [cq + q2 * ((cp - cq) * k % p2) for cp, cq in zip(cps, cqs)]


_PUB: OrderedDict = OrderedDict()
_PRIV: OrderedDict = OrderedDict()


def _cached(cache: OrderedDict, key, make):
    eng = cache.get(key)
    if eng is None:
        eng = make()
        cache[key] = eng
        while len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return eng


def public_engine(n) -> PublicEngine:
    """The :class:`PublicEngine` of modulus ``n``, cached per process (its tables are costly to build)."""
    n = int(n)
    return _cached(_PUB, n, lambda: PublicEngine(n))


def private_engine(p, q) -> PrivateEngine:
    """The :class:`PrivateEngine` of primes ``p``, ``q``, cached per process."""
    p, q = int(p), int(q)
    return _cached(_PRIV, (p, q), lambda: PrivateEngine(p, q))


# ------------------------------------------------------------------------------ exponentiation
def batch_invert(xs, mod) -> list[mpz]:
    """Modular inverses of all xs with one gmpy2.invert (Montgomery's trick, 3 mulmods per value)."""
    if not xs:
        return []
    prefix = [xs[0]]
    for x in xs[1:]:
        prefix.append(prefix[-1] * x % mod)
    inv = gmpy2.invert(prefix[-1], mod)
    out = [None] * len(xs)
    for i in range(len(xs) - 1, 0, -1):
        out[i] = inv * prefix[i - 1] % mod
        inv = inv * xs[i] % mod
    out[0] = inv
    return out


def powmod_elementwise(cts, exps, n2) -> list[mpz]:
    """[c_i ^ k_i mod n2]; negative k_i: (c_i^|k_i|)^-1, the inverses batched (one gmpy2.invert)."""
    n2 = mpz(n2)
    pm = gmpy2.powmod
    out = [pm(c, k, n2) if k > 1 else (c if k == 1 else pm(c, -k, n2)) for c, k in zip(cts, exps)]
    neg = [i for i, k in enumerate(exps) if k < 0]
    if neg:
        for i, v in zip(neg, batch_invert([out[i] for i in neg], n2)):
            out[i] = v
    return out


def _best_window(count: int, bits: int) -> int:
    return min(range(1, 17), key=lambda w: -(-bits // w) * (count + (2 << w)))


def multiexp(bases, exps: np.ndarray, n2) -> mpz:
    """prod_i bases[i] ^ exps[i] mod n2 for non-negative int64 exps (bucket / Pippenger method).

    Cost ~ ceil(b/w) * (len(bases) + 2^(w+1)) modular multiplications for b-bit exponents.
    """
    if len(bases) == 0:
        return mpz(1)
    bits = int(exps.max()).bit_length()
    if bits == 0:
        return mpz(1)
    w = _best_window(len(bases), bits)
    mask = (1 << w) - 1
    acc = None
    for k in reversed(range(-(-bits // w))):
        digits = ((exps >> (w * k)) & mask).tolist()
        buckets = [None] * (mask + 1)
        for c, d in zip(bases, digits):
            if d:
                b = buckets[d]
                buckets[d] = c if b is None else b * c % n2
        running = total = None  # total = prod_t buckets[t]^t via running suffix products
        for t in range(mask, 0, -1):
            b = buckets[t]
            if b is not None:
                running = b if running is None else running * b % n2
            if running is not None:
                total = running if total is None else total * running % n2
        if acc is not None:
            acc = gmpy2.powmod(acc, 1 << w, n2)
        if total is not None:
            acc = total if acc is None else acc * total % n2
    return mpz(1) if acc is None else acc


def signed_multiexp_columns(cts, E: np.ndarray, n2) -> list[mpz]:
    """For each column j: prod_i cts[i] ^ E[i, j] mod n2, E int64 (rows, d) of any sign.

    Rows are grouped by sign; the negative group's product is inverted once per column.
    """
    n2 = mpz(n2)
    arr = np.fromiter(cts, dtype=object, count=len(cts))
    out = []
    for j in range(E.shape[1]):
        col = E[:, j]
        pos, neg = col > 0, col < 0
        r = multiexp(arr[pos].tolist(), col[pos], n2)
        if neg.any():
            rn = multiexp(arr[neg].tolist(), -col[neg], n2)
            r = r * gmpy2.invert(rn, n2) % n2
        out.append(r)
    return out


def gmp_version() -> str:
    """``gmpy2 X on GMP Y``: the GMP under this engine (and phe) decides its speed; the one in gmpy2's
    wheel does modular exponentiation ~25% slower than Debian's on our 2-core EPYC (``make gmp``)."""
    return f"gmpy2 {gmpy2.version()} on {gmpy2.mp_version()}"


def to_blob(values, width: int) -> bytes:
    """Non-negative ints below 2^(8 width) as one string of ``width``-byte big-endian fields: how a batch
    of ciphertexts travels to the workers. 10,000 ciphertexts of 512 bytes: ~7 ms here and ~1 ms to
    pickle, against ~14 ms to pickle the list of mpz, for each task that gets it."""
    return b"".join([mpz(v).to_bytes(width, "big") for v in values])


def from_blob(blob: bytes, width: int) -> list[mpz]:
    """The ints of :func:`to_blob` (``len(blob)`` a multiple of ``width``)."""
    from_bytes = mpz.from_bytes
    return [from_bytes(blob[i:i + width], "big") for i in range(0, len(blob), width)]


# ------------------------------------------------------------------ worker-process entry points
def task_encrypt(n: int, expected: int, mantissas: list) -> list:
    """Worker task: ciphertexts (mpz mod n^2) of the integer ``mantissas`` under public key ``n``
    (``expected``: as :meth:`PublicEngine.encrypt`, the encryptions this worker is about to do).
    """
    return public_engine(n).encrypt(mantissas, expected)


def task_encrypt_crt(p: int, q: int, expected: int, mantissas: list) -> list:
    """Worker task: :func:`task_encrypt` by the key holder, through the CRT mod p^2 and q^2 (faster)."""
    return private_engine(p, q).encrypt(mantissas, expected)


def task_decrypt(p: int, q: int, cts: list) -> list:
    """Worker task: the plaintexts in Z_n (ints) of ``cts`` under the private key (p, q), by the CRT."""
    return private_engine(p, q).decrypt(cts)


def task_powmod(n2: int, cts: list, exps: list) -> list:
    """Worker task: ``cts[i] ** exps[i] mod n2`` for each i (a ciphertext times a plaintext constant)."""
    return powmod_elementwise(cts, exps, n2)


def task_mulmod(n2: int, a: list, b: list) -> list:
    """Worker task: ``a[i] * b[i] mod n2`` for each i (homomorphic addition of two ciphertext lists)."""
    n2 = mpz(n2)
    return [x * y % n2 for x, y in zip(a, b)]


def task_dot(n2: int, blob: bytes, width: int, E: np.ndarray) -> list:
    """:func:`signed_multiexp_columns` of ciphertexts sent as :func:`to_blob`."""
    return signed_multiexp_columns(from_blob(blob, width), E, n2)


def _warm_task(n, pq, large) -> None:
    if n is not None:
        public_engine(n).prepare(large)
    if pq is not None:
        private_engine(*pq).prepare(large)


def warm(n: int | None = None, pq: tuple | None = None, large: bool = True) -> float:
    """Start the pool and build, in every worker, the fixed-base tables of public key ``n`` and/or
    private key ``pq = (p, q)`` (``large``: the big tables a key in heavy use gets); returns the seconds
    it took (pool start-up plus table building, a one-off cost per pool and key)."""
    t0 = time.perf_counter()
    _pool.on_each_worker(_warm_task, None if n is None else int(n),
                         None if pq is None else (int(pq[0]), int(pq[1])), bool(large))
    return time.perf_counter() - t0
