"""The quadratic (Taylor) losses of vertical LR's three tasks: binary, multinomial and linear regression.

Every task's per-row loss is a quadratic in the row's scores z_i (K outputs; K = 1 for binary and
regression) with a constant Hessian, so a party can compute its share of the residual and of the loss
on ciphertexts (Paillier / OU are additively homomorphic)::

    loss_i = c0_i + a_i . z_i + 1/2 z_i^T H z_i,     d_i = dloss_i/dz_i = a_i + H z_i,
    H = h (I - beta 1 1^T)  (K x K)

* ``binary`` (Hardy et al. 2017, arXiv 1711.10677 eq. 3: the logistic loss expanded to second order
  at 0), y in {-1, +1}: c0 = log 2, a = -y/2, h = 1/4, beta = 0.
* ``multiclass``: the softmax cross-entropy ``-z_y + log sum_c exp(z_c)`` expanded to second order at
  z = 0 (the same expansion point as the binary case; for K = 2 and z = (0, wx) it *is* Hardy's binary
  loss): gradient softmax(0) - onehot(y) = 1/K - Y, Hessian diag(p) - p p^T at p = 1/K, so
  c0 = log K, a = 1/K - Y (one-hot Y), h = 1/K, beta = 1/K.
  Chosen over FATE's one-vs-rest (K independent binary Taylor models) because it is one jointly
  trained model whose probabilities are a softmax (they sum to 1 without renormalising K sigmoids),
  and because its residual needs only linear operations on ciphertexts (the coupling term
  ``rowsum(z)/K^2`` is a homomorphic sum), so it costs exactly what one-vs-rest costs: K encrypted
  columns per row. The Hessian is singular along 1 (softmax is shift-invariant); gradient descent from
  zero never moves along it (every class gradient sums to zero over classes).
* ``regression`` (FATE's hetero linear regression: residual d = wx - y, gradient X^T d / n):
  loss = 1/2 (z - y)^2, c0 = y^2/2, a = -y, h = 1, beta = 0. Exact (no approximation).

Prediction links: sigmoid (P(y=1)), softmax (class probabilities), identity (the value).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Task = Literal["binary", "multiclass", "regression"]
MAX_CLASSES = 256  # bound on the class count a guest may announce (it sizes every host's work)


@dataclass(frozen=True)
class TaylorLoss:
    """One task's quadratic loss with K outputs (see the module docstring).

    All row arrays are 2-D (n, K); :meth:`wire` / :meth:`flat` convert to the protocol's shapes
    ((n,) when K = 1, so the binary protocol's messages are unchanged).
    """

    task: str
    k: int

    def __post_init__(self):
        if self.task not in ("binary", "multiclass", "regression"):
            raise ValueError(f"task: {self.task!r} is not binary, multiclass or regression")
        if (self.k != 1) if self.task != "multiclass" else not 2 <= self.k <= MAX_CLASSES:
            raise ValueError(f"task {self.task!r}: {self.k} outputs (multiclass needs 2..{MAX_CLASSES} classes)")

    @property
    def h(self) -> float:
        """The Hessian's scale h: 1/4 binary, 1 regression, 1/K multiclass."""
        return {"binary": 0.25, "regression": 1.0}.get(self.task, 1.0 / self.k)

    @property
    def beta(self) -> float:
        """The Hessian's off-diagonal term: 1/K multiclass, else 0."""
        return 1.0 / self.k if self.task == "multiclass" else 0.0

    @property
    def cols(self) -> tuple:
        """Trailing shape of per-row values and of weights: () for K = 1, (K,) otherwise."""
        return () if self.k == 1 else (self.k,)

    def hessian(self) -> np.ndarray:
        """The K x K Hessian ``h (I - beta 1 1^T)`` of the quadratic loss in one row's scores."""
        return self.h * (np.eye(self.k) - self.beta * np.ones((self.k, self.k)))

    def targets(self, y) -> np.ndarray:
        """Labels -> float64 (n, K) targets T: binary ±1, multiclass one-hot, regression y.

        Raises ValueError for labels the task cannot take (naming ``y``)."""
        y = np.asarray(y).ravel()
        if self.task == "regression":
            t = y.astype(np.float64)
            if not np.all(np.isfinite(t)):
                raise ValueError("y: regression targets must be finite")
            return t[:, None]
        labels = set(np.unique(y).tolist())
        if self.task == "binary":
            if labels <= {0, 1}:
                return np.where(y == 1, 1.0, -1.0)[:, None]
            if labels <= {-1, 1}:
                return y.astype(np.float64)[:, None]
            raise ValueError(f"y: labels must be 0/1 or -1/+1, found {sorted(labels)[:5]}")
        if not all(float(v).is_integer() and 0 <= v < self.k for v in labels):
            raise ValueError(f"y: multiclass labels must be class ids 0..{self.k - 1}, found {sorted(labels)[:5]}")
        return np.eye(self.k)[y.astype(np.int64)]

    def const(self, T: np.ndarray) -> np.ndarray:
        """c0 per row, (n,)."""
        if self.task == "regression":
            return 0.5 * T[:, 0] ** 2
        return np.full(T.shape[0], math.log(2.0) if self.task == "binary" else math.log(self.k))

    def linear(self, T: np.ndarray) -> np.ndarray:
        """a per row, (n, K)."""
        if self.task == "binary":
            return -0.5 * T
        return -T if self.task == "regression" else 1.0 / self.k - T

    def residual(self, T: np.ndarray, z: np.ndarray) -> np.ndarray:
        """d = a + z H, (n, K)."""
        return self.linear(T) + z @ self.hessian()

    def row_losses(self, T: np.ndarray, z: np.ndarray) -> np.ndarray:
        """loss_i, (n,)."""
        return self.const(T) + np.sum(self.linear(T) * z, axis=1) + 0.5 * np.sum((z @ self.hessian()) * z, axis=1)

    def link(self, score: np.ndarray) -> np.ndarray:
        """Scores (m,) + cols -> predictions: P(y=1), class probabilities (m, K), or the value."""
        if self.task == "binary":
            return 1.0 / (1.0 + np.exp(-score))
        if self.task == "regression":
            return score
        e = np.exp(score - score.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def wire(self, a: np.ndarray) -> np.ndarray:
        """(n, K) -> the protocol's shape: (n,) when K = 1."""
        return a[:, 0] if self.k == 1 else a

    def rows(self, a: np.ndarray) -> np.ndarray:
        """The protocol's shape -> (n, K)."""
        return a.reshape(a.shape[0], self.k)
