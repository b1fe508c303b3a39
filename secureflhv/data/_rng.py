"""One random-number façade for every partitioner.

Two modes share the same partitioning algorithms; only the source of randomness differs:

* default: ``np.random.default_rng(seed)`` (PCG64), the modern NumPy generator;
* ``niid_bench_compat=True``: NumPy's legacy Mersenne-Twister ``RandomState(seed)`` plus Python's
  ``random.Random(seed)``. NIID-Bench (Li et al., ICDE 2022) seeds ``np.random.seed(s)`` and
  ``random.seed(s)`` and then calls the global legacy functions; a private ``RandomState(s)`` /
  ``random.Random(s)`` produces exactly the same streams without touching global state, so the
  partitioners reproduce NIID-Bench's draws call for call.
"""
from __future__ import annotations

import random
from numbers import Integral

import numpy as np


class PartitionRng:
    """Random source used by the partitioners (see module docstring for the two modes).

    Args:
        seed: a non-negative int, or (default mode only) an existing ``np.random.Generator``.
        niid_bench_compat: use NIID-Bench's legacy seeding (``RandomState`` + ``random.Random``).

    Raises:
        ValueError: negative / non-integer seed, or a Generator together with compat mode.
    """

    def __init__(self, seed=0, niid_bench_compat: bool = False):
        self.legacy = bool(niid_bench_compat)
        if isinstance(seed, np.random.Generator):
            if self.legacy:
                raise ValueError("seed: niid_bench_compat needs an int seed, not a Generator")
            self._gen = seed
            return
        if isinstance(seed, bool) or not isinstance(seed, Integral) or int(seed) < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        seed = int(seed)
        self.seed = seed
        if self.legacy:
            self._rs = np.random.RandomState(seed)
            self._py = random.Random(seed)
        else:
            self._gen = np.random.default_rng(seed)

    # --- numpy-side draws (NIID-Bench: np.random.*) -------------------------------------------
    def shuffle(self, a: np.ndarray) -> None:
        """Shuffle a 1-D array in place."""
        (self._rs if self.legacy else self._gen).shuffle(a)

    def permutation(self, n: int) -> np.ndarray:
        """A random permutation of ``range(n)`` (int64 (n,)) from the legacy or the modern generator."""
        return (self._rs if self.legacy else self._gen).permutation(n)

    def dirichlet(self, alpha: np.ndarray) -> np.ndarray:
        """One draw from Dirichlet(``alpha``): float64 of alpha's length, summing to 1."""
        return (self._rs if self.legacy else self._gen).dirichlet(alpha)

    def random(self, size=None) -> np.ndarray:
        """Uniform [0, 1) floats."""
        return self._rs.random_sample(size) if self.legacy else self._gen.random(size)

    def integers(self, low: int, high: int, size=None) -> np.ndarray:
        """Uniform ints in [low, high)."""
        return self._rs.randint(low, high, size) if self.legacy else self._gen.integers(low, high, size)

    def choice(self, n: int, size: int, replace: bool = False) -> np.ndarray:
        """``size`` indices drawn from ``range(n)`` (int64 (size,)), without replacement unless ``replace``."""
        return (self._rs if self.legacy else self._gen).choice(n, size=size, replace=replace)

    # --- python-side draws (NIID-Bench: random.randint, used by #C=k label choice) ------------
    def py_randint(self, low: int, high_inclusive: int) -> int:
        """Uniform int in [low, high_inclusive]; Python's ``random.randint`` in compat mode."""
        if self.legacy:
            return self._py.randint(low, high_inclusive)
        return int(self._gen.integers(low, high_inclusive + 1))

    def py_random(self) -> float:
        """One uniform [0, 1) float; Python's ``random.random`` in compat mode."""
        return self._py.random() if self.legacy else float(self._gen.random())
