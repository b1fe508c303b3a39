"""Preprocessing of tabular features for the linear and neural families: impute, one-hot, standardise.

A :class:`Preprocessor` is fitted once on training rows and then applied unchanged to every later table
(held-out rows, prediction jobs); it is saved with the model as JSON (:meth:`Preprocessor.to_dict`).

- numeric column: missing cells take the training mean; the column is standardised with the training
  mean and standard deviation (of the non-missing cells; a constant column keeps std 1); with
  ``missing_indicator`` a 0/1 column ``<name>=missing`` is added for each column that had missing cells
  in training.
- categorical column (codes into ``Dataset.categories``): missing cells take the most frequent training
  category; the codes become one 0/1 column per category, ``<name>=<category>``.

Two ways to fit, giving the same result:

- :meth:`Preprocessor.fit` — from the rows themselves (a vertical party: every column is its own and
  nothing leaves it);
- :meth:`Preprocessor.from_statistics` — from :func:`sufficient_statistics` summed over parties
  (horizontal clients: the sum travels through secure aggregation, so the server learns only the pooled
  counts, sums, sums of squares and category counts; no client's own statistics).
  Pooled mean and variance from sums agree with the pooled-data values to floating-point rounding.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _layout(feature_names: list[str], categories: dict[str, list[str]]) -> list[tuple[str, int]]:
    """(name, width) per column: numeric 3 (count, sum, sum of squares), categorical one per category."""
    return [(n, len(categories[n]) if n in categories else 3) for n in feature_names]


def sufficient_statistics(X: np.ndarray, feature_names: list[str],
                          categories: dict[str, list[str]]) -> np.ndarray:
    """Summable statistics of ``X`` (rows, features; NaN = missing), one float64 vector.

    Per numeric column: [non-missing count, sum, sum of squares]; per categorical column: the count of
    each category. The sum of these vectors over parties is the vector of the pooled rows.
    """
    X = np.asarray(X, dtype=np.float64)
    parts = []
    for j, (name, width) in enumerate(_layout(feature_names, categories)):
        col = X[:, j]
        ok = ~np.isnan(col)
        if name in categories:
            parts.append(np.bincount(col[ok].astype(np.int64), minlength=width)[:width].astype(np.float64))
        else:
            v = col[ok]
            parts.append(np.array([ok.sum(), v.sum(), (v * v).sum()], dtype=np.float64))
    return np.concatenate(parts) if parts else np.zeros(0)


@dataclass
class Preprocessor:
    """A fitted transform of a party's feature columns; see the module docstring.

    Attributes (one entry per input column, in order):
        feature_names: input column names; categories: vocabularies of the categorical ones.
        mean, std: per numeric column (NaN for categorical columns); mode: most frequent code per
        categorical column (NaN for numeric); indicator: whether an ``=missing`` column is added.
    """

    feature_names: list[str]
    categories: dict[str, list[str]]
    mean: np.ndarray
    std: np.ndarray
    mode: np.ndarray
    indicator: np.ndarray
    standardize: bool = True
    output_names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.mean, self.std, self.mode = (np.asarray(a, dtype=np.float64) for a in (self.mean, self.std, self.mode))
        self.indicator = np.asarray(self.indicator, dtype=bool)
        names = []
        for j, n in enumerate(self.feature_names):
            names += [f"{n}={c}" for c in self.categories[n]] if n in self.categories else [n]
            if self.indicator[j]:
                names.append(f"{n}=missing")
        self.output_names = names

    @classmethod
    def fit(cls, X: np.ndarray, feature_names: list[str], categories: dict[str, list[str]] | None = None, *,
            standardize: bool = True, missing_indicator: bool = False) -> "Preprocessor":
        """Fit on the rows of ``X`` (float64, NaN = missing). Raises ValueError for an all-missing column."""
        X = np.asarray(X, dtype=np.float64)
        categories = dict(categories or {})
        d = X.shape[1]
        mean, std, mode = np.full(d, np.nan), np.full(d, np.nan), np.full(d, np.nan)
        indicator = np.zeros(d, dtype=bool)
        # column-wise reductions of the 2-D array, bit for bit what plain standardisation computes
        col_mean, col_std = (X.mean(axis=0), X.std(axis=0)) if len(X) else (mean, std)
        for j, n in enumerate(feature_names):
            col = X[:, j]
            ok = ~np.isnan(col)
            if not ok.any():
                raise ValueError(f"feature {n!r} is missing in every training row")
            indicator[j] = missing_indicator and not ok.all()
            if n in categories:
                mode[j] = np.bincount(col[ok].astype(np.int64), minlength=len(categories[n])).argmax()
            else:
                mean[j], std[j] = (col_mean[j], col_std[j]) if ok.all() else (col[ok].mean(), col[ok].std())
        std[std == 0] = 1.0
        return cls(list(feature_names), categories, mean, std, mode, indicator, standardize)

    @classmethod
    def from_statistics(cls, stats: np.ndarray, feature_names: list[str], categories: dict[str, list[str]],
                        *, standardize: bool = True, missing_indicator: bool = False,
                        n_rows: int | None = None) -> "Preprocessor":
        """Fit from pooled :func:`sufficient_statistics` (summed over parties).

        ``n_rows`` (the pooled row count) enables the missing indicators: a column gets one when its
        non-missing count is below ``n_rows``. Raises ValueError for a vector of the wrong length or
        an all-missing column.
        """
        stats = np.asarray(stats, dtype=np.float64)
        layout = _layout(feature_names, categories)
        if stats.shape != (sum(w for _, w in layout),):
            raise ValueError(f"statistics have shape {stats.shape}, expected ({sum(w for _, w in layout)},)")
        d = len(feature_names)
        mean, std, mode = np.full(d, np.nan), np.full(d, np.nan), np.full(d, np.nan)
        indicator = np.zeros(d, dtype=bool)
        at = 0
        for j, (n, width) in enumerate(layout):
            s = stats[at:at + width]
            at += width
            count = s.sum() if n in categories else s[0]
            if count <= 0:
                raise ValueError(f"feature {n!r} is missing in every training row")
            indicator[j] = missing_indicator and n_rows is not None and count < n_rows
            if n in categories:
                mode[j] = float(np.argmax(s))
            else:
                mean[j] = s[1] / s[0]
                std[j] = np.sqrt(max(s[2] / s[0] - mean[j] ** 2, 0.0))
        std[std == 0] = 1.0
        return cls(list(feature_names), dict(categories), mean, std, mode, indicator, standardize)

    @property
    def identity_on_complete_numeric(self) -> bool:
        """True when the transform is plain standardisation (no categorical columns, no indicators)."""
        return not self.categories and not self.indicator.any()

    def transform(self, X: np.ndarray) -> np.ndarray:
        """``X`` (rows, len(feature_names)), NaN = missing → float64 (rows, len(output_names)).

        Raises ValueError on a column-count mismatch or a category code outside the vocabulary.
        """
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(self.feature_names):
            raise ValueError(f"expected {len(self.feature_names)} columns {self.feature_names[:5]}..., "
                             f"got shape {X.shape}")
        out = []
        for j, n in enumerate(self.feature_names):
            col = X[:, j]
            miss = np.isnan(col)
            if n in self.categories:
                k = len(self.categories[n])
                codes = np.where(miss, self.mode[j], col)
                if ((codes < 0) | (codes >= k) | (codes != np.round(codes))).any():
                    raise ValueError(f"feature {n!r}: category code outside 0..{k - 1}")
                out.append(np.eye(k)[codes.astype(np.int64)])
            else:
                v = np.where(miss, self.mean[j], col)
                if self.standardize:
                    v = (v - self.mean[j]) / self.std[j]
                out.append(v[:, None])
            if self.indicator[j]:
                out.append(miss[:, None].astype(np.float64))
        return np.hstack(out) if out else np.zeros((X.shape[0], 0))

    def to_dict(self) -> dict:
        """JSON-ready state (lists of floats; NaN written as None)."""
        clean = lambda a: [None if np.isnan(x) else float(x) for x in a]  # noqa: E731
        return {"feature_names": list(self.feature_names), "categories": self.categories,
                "mean": clean(self.mean), "std": clean(self.std), "mode": clean(self.mode),
                "indicator": [bool(b) for b in self.indicator], "standardize": self.standardize}

    @classmethod
    def from_dict(cls, d: dict) -> "Preprocessor":
        """Inverse of :meth:`to_dict`. Raises ValueError (naming the key) on a malformed state."""
        try:
            names = [str(n) for n in d["feature_names"]]
            back = lambda a: np.array([np.nan if x is None else float(x) for x in a])  # noqa: E731
            arrays = [back(d[k]) for k in ("mean", "std", "mode")]
            indicator = np.array(d["indicator"], dtype=bool)
            cats = {str(k): [str(c) for c in v] for k, v in d["categories"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed preprocessing state: {exc!r}") from None
        if any(len(a) != len(names) for a in (*arrays, indicator)) or set(cats) - set(names):
            raise ValueError("malformed preprocessing state: lengths or category names disagree")
        return cls(names, cats, *arrays, indicator, bool(d.get("standardize", True)))
