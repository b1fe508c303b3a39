"""ECDH-PSI primitives over Curve25519 (no networking).

The protocol that uses these pieces is :mod:`secureflhv.vertical.psi`; this module only computes.

Scheme (Meadows 1986, "A more efficient cryptographic matchmaking protocol for use in the absence
of a continuously available third party", IEEE S&P; Huberman, Franklin & Hogg 1999, "Enhancing
privacy and trust in electronic communities", ACM EC): each party hashes its IDs to points of a
group where the Decisional Diffie-Hellman problem is hard and raises them to a secret exponent.
Exponentiation commutes, so ``(H(x)^a)^b == (H(y)^b)^a`` exactly when ``x == y``, while a singly
blinded ``H(x)^a`` looks random to anyone without ``a``.

Group: Curve25519 (Bernstein 2006, "Curve25519: new Diffie-Hellman speed records", PKC 2006),
through libsodium's X25519 (``crypto_scalarmult``, via PyNaCl's ``nacl.bindings``; RFC 7748
section 5), which computes the u-coordinate of ``[clamp(k)] P``; it returns exactly the bytes
``cryptography``'s ``X25519PrivateKey.exchange`` does (tests check this), at ~9% less CPU per
call, because no key objects are built per point. Clamped
scalars are multiples of the cofactor 8 and u-only arithmetic ignores the sign of P, so for every
curve point ``X25519(a, X25519(b, u)) == X25519(b, X25519(a, u))`` -- the commutative blinding.

Hashing IDs to points (:func:`hash_to_point`): BLAKE2b-512 keyed with a per-job context
(:func:`hash_context`, from the job id and 32 random bytes chosen by the guest), over a one-byte
counter and the ID's UTF-8 bytes, each digest giving two 256-bit candidates; try-and-increment
(the MapToGroup method of Boneh, Lynn & Shacham, "Short signatures from the Weil pairing",
Asiacrypt 2001) keeps the first candidate u that is canonical (u < p), lies **on the curve** (Jacobi symbol of
u^3 + A u^2 + u is +1, computed with gmpy2) and is not one of the curve's low-order points.
Why not accept any 32-byte string as X25519 does: about half of all strings are points of the
*twist*, and blinding keeps a point on its own curve, so a receiver could read one bit of H(x)
from every blinded value -- across repeated runs with fresh salts that bit would narrow down the
guest's non-intersection IDs. Restricting H to the curve removes that leak (expected 2 tries).

Truncation: the doubly blinded values only need to be compared, so they travel truncated to
``truncate_bytes``. With n_g and n_h items, the chance that any two different IDs
collide is at most n_g * n_h / 2**(8 * truncate_bytes): for 1e6 x 1e6 and 16 bytes, < 3e-27
(12 bytes, the minimum accepted: < 1.3e-17).

Throughput: one X25519 call costs ~23-32 us on the 2-core reference machine (depending on its
load) and dominates (hashing to the curve ~5-6 us per ID, mostly GMP's Jacobi symbol);
:func:`blind` calls libsodium's ``crypto_scalarmult`` (the function behind PyNaCl's binding,
from PyNaCl's own cffi module) on pointers into one output buffer, ~1.5 us per call less than the
public binding, which is the fallback; :class:`PsiEngine` spreads chunks of IDs/points over a
process pool; the private scalar bytes go only to this party's own worker processes.

Why X25519 and not another well-kept group (same process, interleaved, CPU time per call, best
of 3, load ~1.5; ``benchmarks/psi.py --primitives`` repeats it): libsodium X25519 32.1 us,
``cryptography`` X25519 35.4 us, coincurve secp256k1 (parse + multiply + serialise) 38.7 us,
libsodium Ristretto255 (via rbcl or pysodium) ``crypto_scalarmult_ristretto255`` 50.3 us plus
13.7 us for ``crypto_core_ristretto255_from_hash`` -- libsodium's variable-base Edwards
multiplication is generic ref10 code, its X25519 ladder the optimised one. The protocol needs
2 (|X| + |Y|) scalar multiplications, so on 2 cores 1M x 1M costs at least
4M x ~23 us / 2 ~= 46 s for them alone on an idle machine.

Semi-honest model: received points are checked for length and canonical encoding
(:func:`check_points`) and low-order points are refused (:class:`LowOrderPointError`), but not
for curve membership; clamped scalars (multiples of the cofactor) keep small-subgroup inputs
from revealing anything about a scalar.
"""
from __future__ import annotations

import hashlib
import multiprocessing
import os
from typing import Iterable, Sequence

import gmpy2
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from nacl.bindings import crypto_scalarmult
from nacl.exceptions import CryptoError

try:  # the libsodium function behind nacl.bindings.crypto_scalarmult, called on pointers into one buffer
    from nacl._sodium import ffi as _ffi, lib as _lib
    _raw_scalarmult = _lib.crypto_scalarmult
except (ImportError, AttributeError):  # pragma: no cover - a PyNaCl without its cffi module layout
    _ffi = _raw_scalarmult = None

__all__ = [
    "POINT_BYTES", "DEFAULT_TRUNCATE_BYTES", "MIN_TRUNCATE_BYTES", "DOMAIN",
    "LowOrderPointError", "new_scalar", "hash_context", "hash_to_point", "hash_to_points",
    "blind", "hash_and_blind", "check_points", "split_items", "find_duplicate", "match_positions",
    "PsiEngine",
]

POINT_BYTES = 32
DEFAULT_TRUNCATE_BYTES = 16
MIN_TRUNCATE_BYTES = 12
DOMAIN = b"secureflhv/psi/ecdh-x25519/v1"

_P = (1 << 255) - 19
_A = 486662  # Curve25519: v^2 = u^3 + A u^2 + u over GF(p)
_PM = gmpy2.mpz(_P)
_AM = gmpy2.mpz(_A)
# u-coordinates of the curve points of order 1, 2, 4, 8 (u = 0 has Jacobi symbol 0 and is excluded anyway)
_LOW_ORDER_U = frozenset({
    0, 1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
})
_MAX_TRIES = 256  # each try succeeds with probability ~1/2: failing 256 times has probability 2**-256
_CHUNK = 8192     # IDs or points per pool task: ~0.25-0.5 s of work, small enough to balance two workers


class LowOrderPointError(ValueError):
    """A point made X25519 fail: a low-order input (libsodium refuses it, or the output would be all-zero).

    Attributes:
        index: position of the offending 32-byte item in the input.
    """

    def __init__(self, index: int):
        super().__init__(f"item {index} is a low-order point (X25519 output is zero)")
        self.index = index

    def __reduce__(self):  # picklable across the process pool
        return (LowOrderPointError, (self.index,))


def new_scalar() -> bytes:
    """A fresh secret X25519 scalar (32 bytes, from the OS CSPRNG via ``cryptography``)."""
    return X25519PrivateKey.generate().private_bytes_raw()


def hash_context(job_id: str, salt: bytes) -> bytes:
    """The 32-byte BLAKE2b key that domain-separates :func:`hash_to_point` for one PSI run.

    Args:
        job_id: the job id (both parties know it).
        salt: random bytes chosen by the guest for this run (sent in the clear; it is not secret,
            it only makes the hash specific to the run).
    """
    job = job_id.encode("utf-8")
    return hashlib.sha256(DOMAIN + b"\0" + len(job).to_bytes(4, "big") + job + salt).digest()


def _hash_loop(ids: Iterable[str], context: bytes) -> bytes:
    """Hash every ID to a curve point; the 32-byte u-coordinates, concatenated.

    Candidate i of an ID is half i % 2 of BLAKE2b-512(key=context, counter i // 2 || UTF-8 ID),
    read as a little-endian integer: one hash call yields two tries.
    """
    base = hashlib.blake2b(key=context, digest_size=64)
    jacobi, mpz, from_bytes = gmpy2.jacobi, gmpy2.mpz, int.from_bytes
    P, A, low, p_int, mask = _PM, _AM, _LOW_ORDER_U, _P, (1 << 256) - 1
    counters = [bytes([c]) for c in range(_MAX_TRIES // 2)]
    out = []
    append = out.append
    for ident in ids:
        data = ident.encode("utf-8")
        for ctr in counters:
            h = base.copy()
            h.update(ctr)
            h.update(data)
            v = from_bytes(h.digest(), "little")
            # Each half is a candidate. Skip u >= p (non-canonical, probability ~2**-251), low-order
            # points, and twist points (Jacobi symbol of u^3 + A u^2 + u not +1).
            point = None
            for u in (v & mask, v >> 256):
                if u < p_int and u not in low:
                    x = mpz(u)
                    if jacobi(x * ((x + A) * x + 1), P) == 1:
                        point = u.to_bytes(32, "little")
                        break
            if point is not None:
                append(point)
                break
        else:
            raise RuntimeError(f"could not hash ID {ident!r} to a curve point in {_MAX_TRIES} tries")
    return b"".join(out)


def _check_scalar(scalar: bytes) -> None:
    # libsodium reads 32 bytes from the pointer it is given: never hand it anything shorter
    if type(scalar) is not bytes or len(scalar) != 32:
        raise ValueError(f"scalar must be 32 bytes, got {type(scalar).__name__} of length {len(scalar)}")


def hash_to_point(ident: str, context: bytes) -> bytes:
    """The 32-byte u-coordinate H(ident) of a Curve25519 point of large prime order.

    Deterministic given ``context`` (see :func:`hash_context`); independent of any secret, so two
    parties map equal IDs to equal points.
    """
    return _hash_loop([ident], context)


def hash_to_points(ids: Sequence[str], context: bytes) -> bytes:
    """:func:`hash_to_point` of each ID, concatenated (``32 * len(ids)`` bytes)."""
    return _hash_loop(ids, context)


def hash_and_blind(ids: Sequence[str], context: bytes, scalar: bytes) -> bytes:
    """``X25519(scalar, H(id))`` for each ID, concatenated (``32 * len(ids)`` bytes): H(id)^scalar.

    Raises:
        ValueError: ``scalar`` is not 32 bytes.
    """
    _check_scalar(scalar)  # before hashing: a bad scalar fails fast
    return blind(_hash_loop(ids, context), scalar)


def blind(points: bytes, scalar: bytes, out_bytes: int = POINT_BYTES) -> bytes:
    """``X25519(scalar, P)`` for each 32-byte point P in ``points``, each truncated to ``out_bytes``.

    Returns ``out_bytes * len(points) // 32`` bytes in input order.

    Raises:
        ValueError: ``len(points)`` is not a multiple of 32 or ``out_bytes`` not in [1, 32].
        LowOrderPointError: an input point has low order (names its index).
    """
    if len(points) % POINT_BYTES:
        raise ValueError(f"points must be a multiple of {POINT_BYTES} bytes, got {len(points)}")
    if not 1 <= out_bytes <= POINT_BYTES:
        raise ValueError(f"out_bytes must be in [1, {POINT_BYTES}], got {out_bytes}")
    _check_scalar(scalar)
    n = len(points) // POINT_BYTES
    if _raw_scalarmult is None:
        out = _blind_public(bytes(points), scalar)
    else:
        out = bytearray(len(points))
        dst, src, mult = _ffi.from_buffer(out), _ffi.from_buffer(points), _raw_scalarmult
        # one output buffer, pointers into it: no per-item bytes objects. Bounds: off + 32 <= len(points).
        for off in range(0, len(points), POINT_BYTES):
            if mult(dst + off, scalar, src + off):
                raise LowOrderPointError(off // POINT_BYTES)
    if out_bytes == POINT_BYTES:
        return bytes(out)
    import numpy as np  # local: keeps worker start-up light

    return np.frombuffer(out, dtype=np.uint8).reshape(n, POINT_BYTES)[:, :out_bytes].tobytes()


def _blind_public(points: bytes, scalar: bytes) -> bytes:
    """:func:`blind` through PyNaCl's public ``crypto_scalarmult`` (a bytes object per item)."""
    mult = crypto_scalarmult
    rng = range(0, len(points), POINT_BYTES)
    try:
        return b"".join([mult(scalar, points[i:i + POINT_BYTES]) for i in rng])
    except CryptoError:
        for i in rng:  # slow path, only to name the bad item
            try:
                mult(scalar, points[i:i + POINT_BYTES])
            except CryptoError:
                raise LowOrderPointError(i // POINT_BYTES) from None
        raise


def check_points(points: bytes, count: int | None = None) -> int:
    """Check a packed list of 32-byte u-coordinates received from a peer; return how many there are.

    Checks: length is a multiple of 32 (and equals ``32 * count`` when ``count`` is given) and every
    u-coordinate is canonical (< 2**255 - 19, top bit clear), as every honest X25519 output is.

    Raises:
        ValueError: naming the first offending item.
    """
    import numpy as np  # local: keeps worker start-up light

    if len(points) % POINT_BYTES:
        raise ValueError(f"{len(points)} bytes is not a whole number of {POINT_BYTES}-byte points")
    n = len(points) // POINT_BYTES
    if count is not None and n != count:
        raise ValueError(f"expected {count} points, got {n}")
    if n == 0:
        return 0
    arr = np.frombuffer(points, dtype=np.uint8).reshape(n, POINT_BYTES)
    # u >= p  <=>  top bit set, or u in [p, 2**255): bytes 1..30 all 0xff, byte 31 == 0x7f, byte 0 >= 0xed
    bad = (arr[:, 31] >= 0x80) | ((arr[:, 31] == 0x7F) & (arr[:, 1:31] == 0xFF).all(axis=1) & (arr[:, 0] >= 0xED))
    if bad.any():
        raise ValueError(f"item {int(np.argmax(bad))} is not a canonical Curve25519 u-coordinate")
    return n


def split_items(data: bytes, width: int) -> list[bytes]:
    """``data`` cut into ``len(data) // width`` items of ``width`` bytes."""
    return [data[i:i + width] for i in range(0, len(data), width)]


def find_duplicate(ids: Sequence[str]) -> tuple[str, int] | None:
    """``(an example duplicate, number of surplus copies)`` if ``ids`` has duplicates, else ``None``."""
    unique = set(ids)
    if len(unique) == len(ids):
        return None
    seen: set[str] = set()
    example = None
    for ident in ids:
        if ident in seen:
            example = ident
            break
        seen.add(ident)
    return example, len(ids) - len(unique)


def match_positions(mine: bytes, theirs: bytes, width: int):
    """Positions of equal items in two packed lists of ``width``-byte values.

    Returns ``(i_mine, i_theirs)``: two int64 numpy arrays of equal length, ``i_mine`` increasing,
    with ``mine[i_mine[k]] == theirs[i_theirs[k]]``.

    A numpy sorted join on each item's first 8 bytes (a uint64 key), confirmed on all ``width``
    bytes: ~0.3 core-s for 1M x 1M instead of ~1.5 s for a dict of 1M bytes objects. If a list
    repeats an 8-byte key (probability ~n^2 / 2**65 for honest values) it falls back to the exact
    dict join, which tells a real repeat from a shared prefix.

    Raises:
        ValueError: ``width`` < 8, a length that is not a multiple of ``width``, or a list that holds
            the same value twice (a truncation collision, probability <= n^2 / 2**(8*width); or a
            peer that broke the protocol).
    """
    import numpy as np

    if width < 8:
        raise ValueError(f"width must be at least 8 bytes, got {width}")
    if len(mine) % width or len(theirs) % width:
        raise ValueError(f"lengths {len(mine)} and {len(theirs)} are not multiples of {width}")
    m = np.frombuffer(mine, dtype=np.uint8).reshape(-1, width)
    t = np.frombuffer(theirs, dtype=np.uint8).reshape(-1, width)
    km = np.ascontiguousarray(m[:, :8]).view("<u8").ravel()
    kt = np.ascontiguousarray(t[:, :8]).view("<u8").ravel()
    ot, om = np.argsort(kt), np.argsort(km)
    st, sm = kt[ot], km[om]
    if (st[1:] == st[:-1]).any() or (sm[1:] == sm[:-1]).any():
        return _match_positions_exact(mine, theirs, width)
    if st.size == 0 or sm.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy()
    pos = np.minimum(np.searchsorted(st, sm), st.size - 1)  # sorted queries: a merge, cache-friendly
    hit = np.flatnonzero(st[pos] == sm)
    i_mine, i_theirs = om[hit], ot[pos[hit]]
    order = np.argsort(i_mine)
    i_mine, i_theirs = i_mine[order], i_theirs[order]
    same = (m[i_mine] == t[i_theirs]).all(axis=1)  # equal keys, unequal tails: not a match
    return i_mine[same].astype(np.int64), i_theirs[same].astype(np.int64)


def _match_positions_exact(mine: bytes, theirs: bytes, width: int):
    """:func:`match_positions` with a dict of ``bytes`` items (exact; used when 8-byte keys repeat)."""
    import numpy as np

    table = dict(zip(split_items(theirs, width), range(len(theirs) // width)))
    if len(table) != len(theirs) // width:
        raise ValueError("the peer's doubly blinded values contain a repeated value")
    mine_items = split_items(mine, width)
    if len(set(mine_items)) != len(mine_items):
        raise ValueError("our doubly blinded values contain a repeated value")
    get = table.get
    i_mine, i_theirs = [], []
    for i, item in enumerate(mine_items):
        j = get(item)
        if j is not None:
            i_mine.append(i)
            i_theirs.append(j)
    return np.asarray(i_mine, dtype=np.int64), np.asarray(i_theirs, dtype=np.int64)


# ---------------------------------------------------------------------------- process pool
def _task_hash_and_blind(args):
    ids, context, scalar = args
    return hash_and_blind(ids, context, scalar)


def _task_blind(args):
    points, scalar, out_bytes, offset = args
    try:
        return blind(points, scalar, out_bytes)
    except LowOrderPointError as exc:
        raise LowOrderPointError(offset + exc.index) from None


def default_workers() -> int:
    """CPUs this process may use (``os.sched_getaffinity`` where available)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS/Windows
        return max(1, os.cpu_count() or 1)


class PsiEngine:
    """Runs :func:`hash_and_blind` and :func:`blind` over a pool of this party's own processes.

    Args:
        workers: processes to use; ``None`` = :func:`default_workers`; ``1`` (or 0) = compute in
            this process. The pool uses the ``spawn`` start method (safe in processes with threads,
            e.g. gRPC) and is started lazily, only for inputs of at least ``min_parallel`` items.
        min_parallel: below this many items the work runs in-process (spawning costs ~0.3 s).

    Use as a context manager, or call :meth:`close`. Outputs are identical whatever ``workers`` is.
    """

    def __init__(self, workers: int | None = None, *, min_parallel: int = 20_000):
        self.workers = default_workers() if workers is None else max(1, int(workers))
        self.min_parallel = min_parallel
        self._pool = None

    def _get_pool(self):
        if self._pool is None:
            self._pool = multiprocessing.get_context("spawn").Pool(self.workers)
        return self._pool

    def start(self) -> "PsiEngine":
        """Start the pool now (e.g. while waiting for a peer) instead of on first use."""
        if self.workers > 1:
            self._get_pool()
        return self

    def _parallel(self, n: int) -> bool:
        return self.workers > 1 and n >= self.min_parallel

    def hash_and_blind(self, ids: Sequence[str], context: bytes, scalar: bytes) -> bytes:
        """Parallel :func:`hash_and_blind` (same output)."""
        ids = list(ids)
        if not self._parallel(len(ids)):
            return hash_and_blind(ids, context, scalar)
        tasks = [(ids[i:i + _CHUNK], context, scalar) for i in range(0, len(ids), _CHUNK)]
        return b"".join(self._get_pool().imap(_task_hash_and_blind, tasks))

    def blind(self, points: bytes, scalar: bytes, out_bytes: int = POINT_BYTES) -> bytes:
        """Parallel :func:`blind` (same output; the same errors)."""
        n = len(points) // POINT_BYTES
        if not self._parallel(n) or len(points) % POINT_BYTES:
            return blind(points, scalar, out_bytes)
        step = _CHUNK * POINT_BYTES
        tasks = [(points[i:i + step], scalar, out_bytes, i // POINT_BYTES) for i in range(0, len(points), step)]
        return b"".join(self._get_pool().imap(_task_blind, tasks))

    def close(self) -> None:
        """Stop this engine's worker processes (terminated and joined); a later batch runs without them."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
