"""Fixed-point encoding and slot packing for Paillier plaintexts (pure integer maths, no keys).

Encoding (base 2, like phe's ``EncodedNumber`` but with base 2 instead of 16): a real value ``x`` is
stored as the integer mantissa ``m = round(x * 2**precision_bits)`` and the exponent
``e = -precision_bits`` so that ``x ~= m * 2**e``; the absolute rounding error is at most
``2**(e-1)``.  Negative mantissas live in the top of Z_n (``m mod n``).  As in phe, only
``|m| <= n // 3`` is a valid value: a decrypted residue in the gap ``(n//3, n - n//3)`` means a
homomorphic result overflowed and is refused with :class:`OverflowError` instead of being decoded
to a wrong number.

Packing (FATE / SecureBoost "cipher compression", here on the plaintext side): ``slots`` signed
fixed-point values share one plaintext, slot ``j`` occupying bits ``[j*s, (j+1)*s)``:
``P = sum_j m_j * 2**(j*s)`` as a *signed* integer (negative slots borrow from the slot above, and
:func:`unpack` undoes the borrows exactly).  The slot width ``s`` is chosen so that the sum of
``n_summands`` values, each ``|m| <= B`` (``B = ceil(value_bound * 2**precision_bits)``), still
satisfies ``|sum| < 2**(s-1)``: then no slot can carry into its neighbour.  A signed layout (instead
of adding a per-value offset) means decoding does not need the exact number of summands of every
element, only an upper bound, which is what histogram bins with different counts need.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class CiphertextError(ValueError):
    """A ciphertext or public key received from a peer is malformed or made under another key."""


class DecryptedRangeError(CiphertextError, OverflowError):
    """A decrypted value lies in the overflow gap: a peer's ciphertext was corrupted (or forged), or a
    homomorphic result overflowed. Both a :class:`CiphertextError` and an :class:`OverflowError`."""

DEFAULT_PRECISION_BITS = 40          # fraction bits of encrypted values (abs. error <= 2**-41)
DEFAULT_SCALAR_PRECISION_BITS = 32   # fraction bits of non-integral plaintext multipliers
DEFAULT_DOT_PRECISION_BITS = 24      # fraction bits of the plaintext matrix in dot()

_INT64_SAFE = 2 ** 62


def max_mantissa(n: int) -> int:
    """Largest |mantissa| representable under modulus ``n`` (phe's ``max_int`` convention)."""
    return int(n) // 3


def encode_mantissas(x, precision_bits: int, n: int) -> list[int]:
    """Encode an array as signed integer mantissas at exponent ``-precision_bits``.

    x: array-like of float/int/bool, any shape (flattened in C order).
    Returns a list of Python ints (signed; reduce mod n to get plaintexts).
    Raises ValueError on NaN/inf, OverflowError if some ``|m| > n // 3``.
    """
    a = np.asarray(x)
    flat = a.reshape(-1)
    if flat.dtype.kind in "iub":
        if precision_bits >= 0:
            vals = [int(v) << precision_bits for v in flat.tolist()]
        else:  # coarser than integers: round half to even like np.rint
            vals = [int(np.rint(math.ldexp(v, precision_bits))) for v in flat.tolist()]
    elif flat.dtype.kind == "f":
        flat = flat.astype(np.float64, copy=False)
        if not np.all(np.isfinite(flat)):
            raise ValueError("cannot encode NaN or infinite values")
        with np.errstate(over="ignore"):
            scaled = np.rint(np.ldexp(flat, precision_bits))
        if not np.all(np.isfinite(scaled)):
            raise OverflowError(f"value too large to encode at {precision_bits} fraction bits")
        if scaled.size == 0 or np.max(np.abs(scaled)) < _INT64_SAFE:
            vals = scaled.astype(np.int64).tolist()
        else:
            vals = [int(v) for v in scaled.tolist()]  # float -> int is exact
    elif flat.dtype.kind == "O":
        return encode_mantissas(flat.astype(np.float64), precision_bits, n)
    else:
        raise TypeError(f"cannot encode dtype {a.dtype}")
    limit = max_mantissa(n)
    if vals and max(max(vals), -min(vals)) > limit:
        big = max(vals, key=abs)
        raise OverflowError(
            f"value {math.ldexp(float(big), -precision_bits):.6g} needs {abs(big).bit_length()} bits at "
            f"{precision_bits} fraction bits; a {int(n).bit_length()}-bit key allows at most "
            f"{limit.bit_length()} bits (lower precision_bits or scale the data)")
    return vals


def decode_residues(raw, exponent: int, n: int) -> np.ndarray:
    """Decode plaintext residues in [0, n) at ``exponent`` into float64 (flat array).

    Raises DecryptedRangeError (an OverflowError) if a residue lies in the overflow gap (n//3, n - n//3).
    """
    n = int(n)
    half, limit = n // 2, max_mantissa(n)
    signed = [r if r <= half else r - n for r in raw]
    if signed and max(max(signed), -min(signed)) > limit:
        raise DecryptedRangeError("decrypted value out of the encodable range: a peer's ciphertext was corrupted, "
                                  "or a homomorphic result overflowed (too many additions/multiplications for "
                                  "this key and precision)")
    return ints_to_float(signed, exponent)


def ints_to_float(signed, exponent: int) -> np.ndarray:
    """Exactly-rounded float64 of ``m * 2**exponent`` for a list of (possibly huge) ints."""
    try:
        arr = np.array(signed, dtype=np.int64)
        if arr.size == 0 or np.max(np.abs(arr)) < 2 ** 53:
            return np.ldexp(arr.astype(np.float64), exponent)
    except OverflowError:
        pass
    out = np.empty(len(signed), dtype=np.float64)
    for i, m in enumerate(signed):
        m = int(m)
        bl = abs(m).bit_length()
        shift = max(0, bl - 64)  # keep 64 bits: float() then rounds once to 53 (ties are negligible)
        mm = (abs(m) >> shift) | (1 if shift and abs(m) & ((1 << shift) - 1) else 0)  # sticky bit
        try:
            out[i] = math.ldexp(float(mm if m >= 0 else -mm), exponent + shift)
        except OverflowError:
            out[i] = math.copysign(math.inf, m)
    return out


# --------------------------------------------------------------------------------------- packing
@dataclass(frozen=True)
class PackingSpec:
    """Layout of packed plaintexts.

    slots: values per plaintext; slot_bits: width ``s`` of one slot; precision_bits: fraction bits;
    slot_bound: ``B``, the largest |mantissa| one packed value may have.  ``capacity`` is the largest
    number of packed values that may be summed into one slot (``capacity * B < 2**(s-1)``).
    """
    slots: int
    slot_bits: int
    precision_bits: int
    slot_bound: int

    def __post_init__(self):
        if self.slots < 1 or self.slot_bits < 2 or self.slot_bound < 1:
            raise ValueError(f"invalid packing spec {self}")
        if self.capacity < 1:
            raise ValueError(f"slot_bits={self.slot_bits} cannot hold even one value of bound {self.slot_bound}")

    @property
    def exponent(self) -> int:
        """The fixed-point exponent of a packed value: ``-precision_bits``."""
        return -self.precision_bits

    @property
    def capacity(self) -> int:
        """The most packed values one slot may sum without overflow: ``(2**(s-1) - 1) // B``."""
        return ((1 << (self.slot_bits - 1)) - 1) // self.slot_bound

    @property
    def value_bound(self) -> float:
        """The largest |value| one packed value may have: ``B * 2**-precision_bits`` (float)."""
        return math.ldexp(self.slot_bound, -self.precision_bits)

    @classmethod
    def create(cls, key_bits: int, *, precision_bits: int, value_bound: float, n_summands: int,
               slots: int | None = None) -> "PackingSpec":
        """Spec for values with ``|v| <= value_bound`` of which up to ``n_summands`` get summed.

        slots: default (None) = as many as fit (:func:`slots_per_plaintext`); a larger request raises.
        """
        sbits = slot_bits_for(precision_bits, value_bound, n_summands)
        fit = (int(key_bits) - 2) // sbits
        if fit < 1:
            raise OverflowError(f"one slot of {sbits} bits does not fit a {key_bits}-bit key")
        if slots is None:
            slots = fit
        elif slots > fit:
            raise OverflowError(f"{slots} slots of {sbits} bits do not fit a {key_bits}-bit key (max {fit})")
        return cls(int(slots), sbits, int(precision_bits), slot_bound_for(value_bound, precision_bits))


def slot_bound_for(value_bound: float, precision_bits: int) -> int:
    """``B = ceil(value_bound * 2**precision_bits)`` (>= 1): the largest |mantissa| of one value."""
    if not (value_bound > 0 and math.isfinite(value_bound)):
        raise ValueError(f"value_bound must be positive and finite, got {value_bound}")
    return max(1, math.ceil(math.ldexp(value_bound, precision_bits)))


def slot_bits_for(precision_bits: int, value_bound: float, n_summands: int) -> int:
    """Slot width such that a sum of ``n_summands`` values with |v| <= value_bound cannot overflow."""
    if n_summands < 1:
        raise ValueError("n_summands must be >= 1")
    return (slot_bound_for(value_bound, precision_bits) * int(n_summands)).bit_length() + 1


def slots_per_plaintext(key_bits: int, precision_bits: int, value_bound: float, n_summands: int) -> int:
    """How many slots fit one plaintext of a ``key_bits``-bit key (0 if none fits).

    Two bits of the modulus are kept free so that every packed sum stays below n/2 in magnitude.
    """
    return max(0, (int(key_bits) - 2) // slot_bits_for(precision_bits, value_bound, n_summands))


def pack(values, spec: PackingSpec) -> np.ndarray:
    """Pack ``values`` of shape (..., spec.slots) into signed integers of shape (...,) (object array).

    Raises OverflowError if some |value| exceeds the spec's value_bound (after rounding).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim < 1 or v.shape[-1] != spec.slots:
        raise ValueError(f"pack: last axis must have {spec.slots} slots, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError("cannot pack NaN or infinite values")
    m = np.rint(np.ldexp(v, spec.precision_bits))
    if m.size and np.max(np.abs(m)) > spec.slot_bound:
        raise OverflowError(f"packed value {float(np.max(np.abs(v))):.6g} exceeds the slot bound "
                            f"{spec.value_bound:.6g} the packing was sized for")
    m = m.reshape(-1, spec.slots)
    if spec.slot_bound < _INT64_SAFE:
        cols = [m[:, j].astype(np.int64).astype(object) for j in range(spec.slots)]
    else:
        cols = [np.array([int(x) for x in m[:, j].tolist()], dtype=object) for j in range(spec.slots)]
    acc = cols[-1]
    for j in range(spec.slots - 2, -1, -1):  # Horner: P = (...(m_{S-1} << s) + m_{S-2}) << s ...) + m_0
        acc = (acc << spec.slot_bits) + cols[j]
    return acc.reshape(v.shape[:-1])


def unpack_ints(packed, spec: PackingSpec, summands: int = 1) -> list[list[int]]:
    """Split signed packed integers into per-slot signed mantissas (list of lists, slots each).

    Raises OverflowError if a slot exceeds ``summands * slot_bound`` or bits remain above the last
    slot: either means a sum overflowed the sizing (a result is refused, never silently wrong).
    """
    s = spec.slot_bits
    mask, top, full = (1 << s) - 1, 1 << (s - 1), 1 << s
    lim = int(summands) * spec.slot_bound
    out = []
    for p in packed:
        p = int(p)
        row = []
        for _ in range(spec.slots):
            v = p & mask
            if v >= top:
                v -= full
            if v > lim or -v > lim:
                raise OverflowError(f"packed slot value exceeds {summands} x slot bound: slot overflow")
            row.append(v)
            p = (p - v) >> s
        if p != 0:
            raise OverflowError("packed plaintext has bits above its last slot: slot overflow")
        out.append(row)
    return out


def unpack(packed, spec: PackingSpec, summands: int = 1) -> np.ndarray:
    """Inverse of :func:`pack`: signed packed ints of shape (...,) -> float64 (..., slots)."""
    arr = np.asarray(packed, dtype=object)
    rows = unpack_ints(arr.reshape(-1).tolist(), spec, summands)
    flat = [v for row in rows for v in row]
    return ints_to_float(flat, spec.exponent).reshape(arr.shape + (spec.slots,))
