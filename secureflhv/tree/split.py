"""Split gain, leaf weight and candidate validity shared by the federated trees (vertical and horizontal).

XGBoost's second-order formulas (Chen & Guestrin, "XGBoost: A Scalable Tree Boosting System", KDD 2016,
sec. 2.2, eqs. 5-7), for a node with gradient / hessian sums G, H split into (G_L, H_L), (G_R, H_R)::

    leaf weight  w* = -learning_rate * G / (H + lambda)                                  (eq. 5, times eta)
    gain         1/2 [G_L^2/(H_L + lambda) + G_R^2/(H_R + lambda) - G^2/(H + lambda)]   (eq. 7 without gamma)
    split        only if gain - gamma > 0 and H_L >= min_child_weight and H_R >= min_child_weight

Every role computes these in exactly this float order (the sums themselves are exact, see
:mod:`.params`), so the federated trees equal each other and the centralised twin bit for bit; do not
reorder the arithmetic. Nothing here guards H + lambda = 0 (lambda = 0 and a zero hessian sum): with
Python floats the division raises ZeroDivisionError, with numpy arrays it gives inf / nan and a
RuntimeWarning. :mod:`.reference` (the centralised twin) writes the same formulas on its own, on purpose.
"""
from __future__ import annotations

import numpy as np

from .params import SecureBoostParams


def split_gain(GL, HL, G, H, reg_lambda: float):
    """Gain of splitting a node into left (GL, HL) and right (G - GL, H - HL), without gamma (eq. 7).

    Args:
        GL, HL: float64 (c,) left gradient / hessian sums per candidate (or scalars).
        G, H: float, the node's sums.
        reg_lambda: lambda >= 0.

    Returns:
        float64 (c,) (a float for scalar GL, HL):
        ``0.5 * (GL^2 / (HL + lambda) + GR^2 / (HR + lambda) - G^2 / (H + lambda))``.
    """
    GR, HR = G - GL, H - HL
    return 0.5 * (GL * GL / (HL + reg_lambda) + GR * GR / (HR + reg_lambda) - G * G / (H + reg_lambda))


def leaf_weight(G, H, params: SecureBoostParams):
    """Leaf weight ``-learning_rate * G / (H + lambda)`` (eq. 5 times eta); G, H floats or float64 arrays."""
    return -params.learning_rate * G / (H + params.reg_lambda)


def valid_candidates(HL, H, min_child_weight: float, counts=None, n_rows: int | None = None) -> np.ndarray:
    """Which candidates may split: both children's hessian sums ``>= min_child_weight``.

    Args:
        HL: float64 (c,) left hessian sum per candidate; H: float, the node's.
        min_child_weight: the bound (inclusive, as in XGBoost).
        counts: optional int or integer-valued float (c + 1,): the node's row count per bin of one
            (virtual) column, candidate b = "bins 0..b go left". With it a candidate also needs rows in
            its own bin b (else it is the partition of an earlier candidate) and ``n_rows`` above the
            rows left of it (rows on the right).
        n_rows: the node's row count (needed with ``counts``).

    Returns:
        bool (c,).
    """
    ok = (HL >= min_child_weight) & (H - HL >= min_child_weight)
    if counts is not None:
        ok &= (counts[:-1] > 0) & (np.cumsum(counts)[:-1] < n_rows)
    return ok


def candidate_gains(GL, HL, G, H, params: SecureBoostParams, counts=None, n_rows: int | None = None):
    """Gain per candidate with -inf where :func:`valid_candidates` fails; None when none is valid.

    Shapes as in :func:`split_gain` and :func:`valid_candidates`; the caller takes the first maximum
    (``np.argmax``) for XGBoost's tie-break in candidate order. The gains are computed only when some
    candidate is valid.
    """
    ok = valid_candidates(HL, H, params.min_child_weight, counts, n_rows)
    if not ok.any():
        return None
    return np.where(ok, split_gain(GL, HL, G, H, params.reg_lambda), -np.inf)


def beats_gamma(gain: float, params: SecureBoostParams) -> bool:
    """Whether a node splits on a candidate of this gain: ``gain - gamma > 0`` (False for a NaN gain)."""
    return gain - params.gamma > 0
