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

import numpy as np

from ..crypto.quantise import QuantParams, to_signed
from .result import OutOfRangeRound

_SLACK = 1e-12  # relative: the float64 image of sums up to 2^62 is exact to 2^-53


def range_violation(words: np.ndarray, qp: QuantParams, n: int, *, zero_weight_ok: bool = False) -> str | None:
    """Why a sum of ``n`` inputs (uint words (d+2,) mod 2^k: coordinates, weight, clipped count) cannot
    come from honest clients, or None when it can. ``n = 1`` checks one input."""
    s = to_signed(words, qp.k_bits).astype(np.float64)
    coords, w_word, clipped = s[:-2], s[-2], s[-1]
    d = coords.size
    w_max = n * (qp.max_weight * qp.scale + 1)
    if not (0 <= w_word <= w_max * (1 + _SLACK)) or (w_word == 0 and not zero_weight_ok):
        return (f"total weight {w_word / qp.scale:g} outside (0, {w_max / qp.scale:g}] "
                f"(n={n} inputs of weight <= max_weight={qp.max_weight:g})")
    if not 0 <= clipped <= n * d:
        return f"clipped count {clipped:g} outside [0, {n * d}] (n={n} inputs of {d} coordinates)"
    bound = qp.clip * (w_word + n) + n
    over = np.abs(coords) > bound * (1 + _SLACK)
    if over.any():
        i = int(np.argmax(over))
        return (f"{int(over.sum())} of {d} coordinates exceed Σw·clip (coordinate {i}: |{coords[i] / qp.scale:g}| > "
                f"{bound / qp.scale:g} = clip {qp.clip:g} × total weight {w_word / qp.scale:g} + rounding): "
                f"an input was not clipped")
    return None


def check_sum(words: np.ndarray, qp: QuantParams, n: int, round_id: int, *, zero_weight_ok: bool = False) -> None:
    """Raise :class:`OutOfRangeRound` when the unmasked sum of ``n`` survivors breaks the honest bounds."""
    why = range_violation(words, qp, n, zero_weight_ok=zero_weight_ok)
    if why is not None:
        raise OutOfRangeRound(f"round {round_id}: the unmasked sum of {n} clients is out of range, refused: {why}; "
                              f"at least one client sent an unclipped or forged input (secure aggregation cannot "
                              f"say which)")


def check_each(inputs: dict[str, np.ndarray], qp: QuantParams, round_id: int, *, zero_weight_ok: bool = False) -> None:
    """``plain_quantised`` sees each input: refuse the round naming every client whose own input (words
    (d+2,)) breaks the bounds (weight 0 allowed per input), then check the sum as :func:`check_sum`."""
    offenders = {c: why for c, w in sorted(inputs.items())
                 if (why := range_violation(w, qp, 1, zero_weight_ok=True)) is not None}
    if offenders:
        raise OutOfRangeRound(f"round {round_id}: out-of-range input from {sorted(offenders)}, refused: "
                              + "; ".join(f"{c}: {why}" for c, why in offenders.items()), offenders)
    total = sum(inputs.values(), np.zeros_like(next(iter(inputs.values())))) & qp.modulus_mask
    check_sum(total, qp, len(inputs), round_id, zero_weight_ok=zero_weight_ok)
