"""Server-side bounds on an unmasked sum: what honest, clipped inputs can never exceed.

Secure aggregation hides each input, so the server cannot check that a client clipped its update
before masking it; a client that skips clipping (or writes any word it likes into the ring) would move
the sum by up to 2^(k-1) per coordinate. Every honest input, however, satisfies (quantise.py,
stochastic rounding SR): weight word W = SR(w·scale) with 0 <= w <= max_weight, coordinate word
q_i = SR(w·clip(x_i)·scale) with |q_i| < clip·(W + 1) + 1, and a clipped count in [0, d]. Summed over
the n survivors, with S_W = Σ W:

    0 < S_W <= n·(max_weight·scale + 1)            (S_W = 0 allowed only with ``zero_weight_ok``)
    |S_i| <= clip·(S_W + n) + n   for every coordinate i
    0 <= S_clipped <= n·d

A sum outside these bounds comes from at least one dishonest input; the round is refused
(:class:`~.result.OutOfRangeRound`) and never used. Inside them, poisoning remains possible: a client
may send any clipped update with any weight up to ``max_weight`` (input-validity proofs, e.g. the
zero-knowledge range proofs of Bell et al., ACORN, USENIX Security 2023, would stop that; see
docs/security.md).
"""
from __future__ import annotations

import math

import numpy as np

from ..crypto.quantise import QuantParams, to_signed
from .result import OutOfRangeRound

_SLACK = 1e-12  # relative slack of the float bound (sums up to 2^62 are exact in float64 to 2^-53)


def range_violation(words: np.ndarray, qp: QuantParams, n: int, *, zero_weight_ok: bool = False) -> str | None:
    """Why a sum of ``n`` inputs (unsigned words (d+2,) reduced mod 2^k: coordinates, weight, clipped count)
    cannot come from honest clients, or None when it can. ``n = 1`` checks one input.

    The coordinates are compared as unsigned residues (|v| <= B  <=>  r <= B or r >= 2^k − B), two passes
    over the words without a signed or float copy: about 1.5 ms per million coordinates."""
    words = np.asarray(words)
    w_word, clipped = (int(v) for v in to_signed(words[-2:], qp.k_bits))
    d = words.size - 2
    w_max = n * (qp.max_weight * qp.scale + 1)
    if not (0 <= w_word <= w_max * (1 + _SLACK)) or (w_word == 0 and not zero_weight_ok):
        return (f"total weight {w_word / qp.scale:g} outside (0, {w_max / qp.scale:g}] "
                f"(n={n} inputs of weight <= max_weight={qp.max_weight:g})")
    if not 0 <= clipped <= n * d:
        return f"clipped count {clipped} outside [0, {n * d}] (n={n} inputs of {d} coordinates)"
    bound = math.floor((qp.clip * (w_word + n) + n) * (1 + _SLACK))
    modulus = 1 << qp.k_bits
    if 2 * bound >= modulus:   # every residue is within the bound
        return None
    coords = words[:-2]
    word = coords.dtype.type
    over = (coords > word(bound)) & (coords < word(modulus - bound))
    if over.any():
        i = int(np.argmax(over))
        value = int(to_signed(coords[i:i + 1], qp.k_bits)[0])
        return (f"{int(np.count_nonzero(over))} of {d} coordinates exceed Σw·clip (coordinate {i}: "
                f"|{value / qp.scale:g}| > {bound / qp.scale:g} = clip {qp.clip:g} × total weight "
                f"{w_word / qp.scale:g} + rounding): an input was not clipped")
    return None


def check_sum(words: np.ndarray, qp: QuantParams, n: int, round_id: int, *, zero_weight_ok: bool = False) -> None:
    """Raise :class:`OutOfRangeRound` when the unmasked sum of ``n`` survivors (words reduced mod 2^k)
    breaks the honest bounds."""
    why = range_violation(words, qp, n, zero_weight_ok=zero_weight_ok)
    if why is not None:
        raise OutOfRangeRound(f"round {round_id}: the unmasked sum of {n} clients is out of range, refused: {why}; "
                              f"at least one client sent an unclipped or forged input (secure aggregation cannot "
                              f"say which)")


def check_each(inputs: dict[str, np.ndarray], qp: QuantParams, round_id: int) -> None:
    """``plain_quantised`` sees each input: refuse the round naming every client whose own input (words
    (d+2,), any high bits beyond k ignored) breaks the bounds of one honest input (weight 0 allowed)."""
    mask = qp.word_dtype.type(qp.modulus_mask)
    offenders = {c: why for c, w in sorted(inputs.items())
                 if (why := range_violation(w & mask, qp, 1, zero_weight_ok=True)) is not None}
    if offenders:
        raise OutOfRangeRound(f"round {round_id}: out-of-range input from {sorted(offenders)}, refused: "
                              + "; ".join(f"{c}: {why}" for c, why in offenders.items()), offenders)
