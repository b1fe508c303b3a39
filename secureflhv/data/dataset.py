"""The common in-memory table every loader returns and every partitioner/writer accepts."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np


class DataError(ValueError):
    """A data file is unreadable or lacks a requested column; the message names file and column."""


@dataclass
class Dataset:
    """A feature table with optional label, id, group and time columns (all row-aligned).

    Attributes:
        X: features, shape (n_rows, n_features), float32 (images) or float64 (tabular).
        y: labels, shape (n_rows,), integer class ids for classification sets; None when unlabelled.
        feature_names: one name per column of X.
        ids: row ids as strings, shape (n_rows,) (vertical jobs align parties on them with PSI); or None.
        groups: a natural id per row (writer, user, site) for ``feature_natural``; or None.
        times: a sortable time value per row for ``temporal``; or None.
        name: short dataset name for reports.
        label_names: human-readable class names indexed by label id; or None.
        categories: feature name -> its categories, for categorical features only; their values in
            ``X`` are indices into that list (as float64), NaN where missing.
    """

    X: np.ndarray
    y: np.ndarray | None = None
    feature_names: list[str] = field(default_factory=list)
    ids: np.ndarray | None = None
    groups: np.ndarray | None = None
    times: np.ndarray | None = None
    name: str = ""
    label_names: list[str] | None = None
    categories: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        X = np.asarray(self.X)
        if X.ndim == 1:
            X = X.reshape(-1, 1)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D (n_rows, n_features), got shape {X.shape}")
        self.X = X
        if not self.feature_names:
            self.feature_names = [f"x{i}" for i in range(X.shape[1])]
        self.feature_names = [str(c) for c in self.feature_names]
        if len(self.feature_names) != X.shape[1]:
            raise ValueError(f"feature_names has {len(self.feature_names)} names for {X.shape[1]} columns")
        n = X.shape[0]
        for attr in ("y", "ids", "groups", "times"):
            v = getattr(self, attr)
            if v is None:
                continue
            v = np.asarray(v)
            if v.shape != (n,):
                raise ValueError(f"{attr} must have shape ({n},), got {v.shape}")
            setattr(self, attr, v)

    def __len__(self) -> int:
        return self.X.shape[0]

    @property
    def n_rows(self) -> int:
        """Rows of ``X``."""
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        """Columns of ``X``."""
        return self.X.shape[1]

    def subset(self, rows) -> "Dataset":
        """Rows ``rows`` (index array or boolean mask), all row-aligned columns sliced alike."""
        rows = np.asarray(rows)
        pick = lambda v: None if v is None else v[rows]  # noqa: E731
        return replace(self, X=self.X[rows], y=pick(self.y), ids=pick(self.ids),
                       groups=pick(self.groups), times=pick(self.times))

    def select_columns(self, columns) -> "Dataset":
        """Feature columns by index; label/ids/groups/times kept."""
        columns = np.asarray(columns, dtype=np.int64)
        names = [self.feature_names[c] for c in columns]
        return replace(self, X=self.X[:, columns], feature_names=names,
                       categories={n: v for n, v in self.categories.items() if n in names})


def check_matrix(X, name: str, allow_nan: bool = False) -> np.ndarray:
    """``X`` as a finite float64 (rows, features) array, for a protocol's input.

    Raises ValueError naming ``name``: not 2-D, or NaN / infinite values (missing values are not
    supported by the protocols that call this). ``allow_nan``: NaN marks a missing value and passes
    (trees handle it); infinities are still rejected.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D (rows, features) array, got shape {X.shape}")
    if allow_nan:
        if np.isinf(X).any():
            raise ValueError(f"{name}: contains infinite values")
    elif not np.all(np.isfinite(X)):
        raise ValueError(f"{name}: contains NaN or infinite values (missing values are not supported)")
    return X
