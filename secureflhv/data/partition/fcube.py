"""FCUBE: NIID-Bench's synthetic feature-imbalance data set (Li et al., ICDE 2022, section III-B).

Points lie in the cube [-1, 1]^3 and the label is decided by the plane x1 = 0 (label 0 for x1 > 0,
label 1 otherwise, as in NIID-Bench). The training set is built from the 4 pairs of octants that are
symmetric through the origin: for pair ``loc`` (0..3) a point (p1, p2, p3) with p1, p2, p3 ~ U[0, 1),
p2 negated when loc >= 2 and p3 negated when loc is odd, is emitted as-is (label 0) for even row
index and mirrored through the origin (label 1) for odd. Each octant pair thus holds both labels in
equal numbers; :func:`secureflhv.data.partition.samples.feature_synthetic` gives each party one pair.
The test set is uniform over the whole cube.
"""
from __future__ import annotations

import numpy as np

from .._rng import PartitionRng
from ..dataset import Dataset


def octant_pair(X: np.ndarray) -> np.ndarray:
    """Octant-pair id 0..3 of each row of an (n, 3) array: ``2*[x2*s < 0] + [x3*s < 0]`` with
    s = sign(x1) (x1 == 0 counts as positive), i.e. NIID-Bench's ``loc`` of the point or its mirror."""
    X = np.asarray(X, dtype=np.float64)
    s = np.where(X[:, 0] < 0, -1.0, 1.0)
    return (2 * (X[:, 1] * s < 0) + (X[:, 2] * s < 0)).astype(np.int64)


def make_fcube(n_train: int = 4000, n_test: int = 1000, seed=0, *,
               niid_bench_compat: bool = False) -> tuple[Dataset, Dataset]:
    """Generate FCUBE train and test sets.

    Args:
        n_train: training points, a multiple of 4 (NIID-Bench: 4000); n_train/4 per octant pair.
        n_test: uniform test points (NIID-Bench: 1000).
        seed: int seed. With ``niid_bench_compat`` the points come from ``random.Random(seed)`` in
            NIID-Bench's order (p1, p2, p3 per point; training set first), so they equal NIID-Bench's
            generated data after ``random.seed(seed)`` (up to its float32 cast).
    Returns: ``(train, test)`` Datasets with X float64 (n, 3), y int64, and train.groups = pair id.
    Raises: ValueError if n_train is not a positive multiple of 4 or n_test < 0.
    """
    if isinstance(n_train, bool) or not isinstance(n_train, (int, np.integer)) or n_train < 4 or n_train % 4:
        raise ValueError(f"n_train must be a positive multiple of 4, got {n_train!r}")
    if isinstance(n_test, bool) or not isinstance(n_test, (int, np.integer)) or n_test < 0:
        raise ValueError(f"n_test must be a non-negative int, got {n_test!r}")
    rng = PartitionRng(seed, niid_bench_compat)
    per = n_train // 4
    if rng.legacy:  # one scalar Python draw at a time, exactly NIID-Bench's order
        U = np.array([rng.py_random() for _ in range(3 * n_train)]).reshape(n_train, 3)
        T = np.array([rng.py_random() for _ in range(3 * n_test)]).reshape(n_test, 3) * 2 - 1
    else:
        U = rng.random((n_train, 3))
        T = rng.random((n_test, 3)) * 2 - 1
    loc = np.repeat(np.arange(4), per)
    U[:, 1] = np.where(loc > 1, -U[:, 1], U[:, 1])
    U[:, 2] = np.where(loc % 2 == 1, -U[:, 2], U[:, 2])
    odd = (np.arange(n_train) % per) % 2 == 1  # NIID-Bench alternates within each pair
    U[odd] = -U[odd]
    y_train = odd.astype(np.int64)
    y_test = (T[:, 0] <= 0).astype(np.int64)
    names = ["x1", "x2", "x3"]
    train = Dataset(U, y_train, names, groups=loc, name="fcube", label_names=["x1>0", "x1<=0"])
    test = Dataset(T, y_test, names, name="fcube_test", label_names=["x1>0", "x1<=0"])
    return train, test
