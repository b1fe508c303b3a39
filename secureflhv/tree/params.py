"""Hyperparameters, objectives and the fixed-point grid of gradients shared by every SecureBoost role.

Objectives (XGBoost's definitions, Chen & Guestrin, KDD 2016, sec. 2.2; xgboost/src/objective):

* ``binary`` (binary:logistic): p = sigmoid(margin), g = p - y, h = max(p (1 - p), 1e-16);
  base margin = logit(mean y).
* ``multiclass`` (multi:softprob): p = softmax(margins), g_k = p_k - [y = k],
  h_k = max(2 p_k (1 - p_k), 1e-16) (XGBoost's factor 2); one tree per class per round; base margin 0.
* ``regression`` (reg:squarederror): g = margin - y, h = 1; base margin = mean y.

Split gain and leaf weight (XGBoost, eqs. 6 and 7), for a node with sums G, H split into (G_L, H_L),
(G_R, H_R)::

    gain = 1/2 [G_L^2/(H_L + lambda) + G_R^2/(H_R + lambda) - G^2/(H + lambda)]
    split only if gain - gamma > 0, H_L >= min_child_weight and H_R >= min_child_weight
    leaf weight = -learning_rate * G / (H + lambda)

Fixed-point grid: every role rounds g and h to integers ``round(v * 2**p)`` before summing (the
vertical guest must, to encrypt them; the horizontal clients do, so that secure aggregation sums them
exactly). ``p`` (:func:`precision_bits_for`) is chosen so that any sum over all rows stays below 2^52 in
magnitude: sums of these integers are then exact in int64 *and* in float64, so every role (and the
centralised twin, :mod:`secureflhv.tree.reference`) obtains bit-identical histogram sums whatever the
order of additions, which is what makes the federated trees equal the centralised ones exactly.
The rounding error of one g is at most 2^-(p+1); p = 24 up to 16M rows with |g| <= 1, about the
precision of XGBoost's float32 gradient pairs (and fewer bits per slot keep the packed ciphertexts,
and the hosts' cipher compression, small: 39-bit slots for 10k rows, 25 candidates per ciphertext).
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field

from ..params import EarlyStopping, HEKeyParams

Objective = Literal["binary", "multiclass", "regression"]
MAX_PRECISION_BITS = 24
SUM_BITS = 52          # |any sum of quantised g or h over all rows| < 2**SUM_BITS
H_EPS = 1e-16


class SecureBoostParams(HEKeyParams, EarlyStopping):
    """Hyperparameters of (federated) histogram GBDT; identical at every party of a job.

    Field names follow XGBoost where one exists (``max_depth``, ``learning_rate`` = eta,
    ``reg_lambda`` = lambda, ``gamma`` = min_split_loss, ``min_child_weight``, ``max_bin``,
    ``early_stopping_rounds``). The vertical guest's key: :class:`~secureflhv.params.HEKeyParams`; early
    stopping (:class:`~secureflhv.params.EarlyStopping`) monitors the validation loss
    (``validation_fraction`` of the job), and the model keeps the rounds up to the best.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    objective: Objective = "binary"
    n_classes: int = Field(default=2, ge=2, description="classes (multiclass only)")
    n_trees: int = Field(default=10, ge=1, description="boosting rounds (multiclass: n_classes trees each)")
    max_depth: int = Field(default=5, ge=1, le=16)
    learning_rate: float = Field(default=0.3, gt=0, le=1)
    reg_lambda: float = Field(default=1.0, ge=0)
    gamma: float = Field(default=0.0, ge=0)
    min_child_weight: float = Field(default=1.0, ge=0)
    max_bin: int = Field(default=32, ge=2, le=256)
    shuffle_seed: int | None = Field(default=None, ge=1,
                                     description="seed of the hosts' candidate shuffle (tests); None: OS randomness")
    sketch_bins: int = Field(default=2048, ge=16, le=1 << 16,
                             description="horizontal binning: cells of the public grid whose counts are summed")

    @property
    def trees_per_round(self) -> int:
        """Trees grown per boosting round: one per class for multiclass (softmax), else one."""
        return self.n_classes if self.objective == "multiclass" else 1


# ----------------------------------------------------------------------------------- objectives
def check_labels(y, params: SecureBoostParams) -> np.ndarray:
    """Validate labels for the objective; returns float64 (n,). ValueError names the problem."""
    y = np.asarray(y).ravel()
    if params.objective == "regression":
        y = y.astype(np.float64)
        if not np.all(np.isfinite(y)):
            raise ValueError("y: regression labels must be finite")
        return y
    labels = set(np.unique(y).tolist())
    allowed = set(range(2 if params.objective == "binary" else params.n_classes))
    if not labels <= allowed:
        raise ValueError(f"y: {params.objective} labels must be in {sorted(allowed)}, found {sorted(labels)[:6]}")
    return y.astype(np.float64)


def base_margin(y: np.ndarray, params: SecureBoostParams) -> np.ndarray:
    """Initial margin per output: (1,) binary/regression, (n_classes,) multiclass."""
    if params.objective == "multiclass":
        return np.zeros(params.n_classes)
    return base_margin_from_sums(float(np.sum(y)), len(y), params)


def base_margin_from_sums(label_sum: float, n: int, params: SecureBoostParams) -> np.ndarray:
    """The initial margin from the label sum over ``n`` rows: zeros (K,) for multiclass, the mean for
    regression, the log-odds of the mean (clipped to [1e-6, 1 - 1e-6]) for binary; float64 (outputs,).
    """
    if params.objective == "multiclass":
        return np.zeros(params.n_classes)
    mean = label_sum / n
    if params.objective == "regression":
        return np.array([mean])
    p = min(max(mean, 1e-6), 1 - 1e-6)
    return np.array([math.log(p / (1 - p))])


def gradients(margin: np.ndarray, y: np.ndarray, params: SecureBoostParams) -> tuple[np.ndarray, np.ndarray]:
    """g, h of shape (n, outputs) for margins (n, outputs) and labels (n,)."""
    if params.objective == "binary":
        p = 1.0 / (1.0 + np.exp(-margin[:, 0]))
        return (p - y)[:, None], np.maximum(p * (1.0 - p), H_EPS)[:, None]
    if params.objective == "regression":
        return (margin[:, 0] - y)[:, None], np.ones((len(y), 1))
    p = softmax(margin)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(y)), y.astype(np.int64)] = 1.0
    return p - onehot, np.maximum(2.0 * p * (1.0 - p), H_EPS)


def softmax(margin: np.ndarray) -> np.ndarray:
    """Row-wise softmax of float64 margins (n, K), shifted by each row's maximum for stability."""
    z = margin - margin.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def transform(margin: np.ndarray, params: SecureBoostParams) -> np.ndarray:
    """Predictions from margins (n, outputs): P(y=1) (n,), class probabilities (n, K), or values (n,)."""
    if params.objective == "binary":
        return 1.0 / (1.0 + np.exp(-margin[:, 0]))
    if params.objective == "multiclass":
        return softmax(margin)
    return margin[:, 0].copy()


def loss(margin: np.ndarray, y: np.ndarray, params: SecureBoostParams) -> float:
    """Mean validation loss: logloss, multi-class logloss, or RMSE."""
    if params.objective == "binary":
        p = np.clip(transform(margin, params), 1e-15, 1 - 1e-15)
        return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    if params.objective == "multiclass":
        p = np.clip(softmax(margin), 1e-15, 1.0)
        return float(-np.mean(np.log(p[np.arange(len(y)), y.astype(np.int64)])))
    return float(np.sqrt(np.mean((margin[:, 0] - y) ** 2)))


# ----------------------------------------------------------------------------- fixed-point grid
def bound_log2(g: np.ndarray, h: np.ndarray) -> int:
    """Smallest e >= 0 with max(|g|, |h|) <= 2**e (the bound the packing is sized for; public)."""
    m = float(max(np.max(np.abs(g), initial=0.0), np.max(np.abs(h), initial=0.0)))
    return max(0, math.ceil(math.log2(m))) if m > 1 else 0


def precision_bits_for(n_rows: int, log2_bound: int) -> int:
    """Fraction bits p such that n_rows * 2**log2_bound * 2**p <= 2**SUM_BITS (capped at 24).

    Raises ValueError when fewer than 8 fraction bits would remain (values or row count too large).
    """
    p = SUM_BITS - int(log2_bound) - max(1, int(n_rows) - 1).bit_length()
    p = min(MAX_PRECISION_BITS, p)
    if p < 8:
        raise ValueError(f"{n_rows} rows with |g| up to 2^{log2_bound} leave only {p} fraction bits; "
                         "scale the regression target down")
    return p


def quantise(v: np.ndarray, precision_bits: int) -> np.ndarray:
    """int64 mantissas round(v * 2**p) (round half to even)."""
    return np.rint(np.ldexp(np.asarray(v, dtype=np.float64), precision_bits)).astype(np.int64)


def dequantise(m, precision_bits: int) -> np.ndarray:
    """float64 m * 2**-p (exact for |m| < 2**53)."""
    return np.ldexp(np.asarray(m, dtype=np.float64), -precision_bits)
