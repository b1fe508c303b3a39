"""Vertical (feature) partitioners: which columns and which ids each party holds.

A vertical job has one guest (holds the label) and H hosts (features only); see docs/architecture.md "Protocol roles".
Column schemes (Zhu et al. survey, section 4.2; SecureBoost / FATE practice):

* ``even``: columns in order, cut into H+1 near-equal contiguous blocks (guest first);
* ``random``: a seeded permutation of the columns cut into H+1 blocks;
* ``explicit``: the caller's column lists (indices or names), guest first;
* ``overlap``: a fraction ``shared_fraction`` of the columns (rounded) is held by every party, the
  rest is split at random as in ``random``.

Rows: the guest holds every row; with ``sample_overlap = r`` each host independently holds a random
``round(r * n)`` of the guest's ids, so ids must be aligned by PSI before training. Each party's rows
are shuffled independently (``shuffle_rows``), so row order carries no alignment either.
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from pathlib import Path

import numpy as np

from ..dataset import Dataset

VERTICAL_SCHEMES = ("even", "random", "explicit", "overlap")


@dataclass
class VerticalPartition:
    """Result of :func:`vertical_split`.

    Attributes:
        parties: party names, ``["guest", "host_1", ..., "host_H"]``.
        columns: per party, int64 indices of the dataset's columns it holds (ascending).
        column_names: per party, the matching feature names.
        rows: per party, int64 dataset row indices in that party's (shuffled) order.
        ids: per party, the string ids of those rows (same order as ``rows``).
        shared_columns: columns every party holds (``overlap`` scheme), else empty.
        label_party: name of the party holding the label (the guest).
    """

    parties: list[str]
    columns: list[np.ndarray]
    column_names: list[list[str]]
    rows: list[np.ndarray]
    ids: list[np.ndarray]
    shared_columns: np.ndarray
    label_party: str = "guest"

    def index(self, party) -> int:
        """The position of ``party`` (an index or a party name) in ``parties``; ValueError when unknown or
        out of range."""
        if isinstance(party, Integral):
            if not 0 <= party < len(self.parties):
                raise ValueError(f"party index {party} out of range [0, {len(self.parties)})")
            return int(party)
        if party not in self.parties:
            raise ValueError(f"party {party!r} unknown; parties are {self.parties}")
        return self.parties.index(party)

    def common_rows(self) -> np.ndarray:
        """Dataset rows held by every party (what a multi-party PSI must output), ascending."""
        out = np.sort(self.rows[0])
        for r in self.rows[1:]:
            out = np.intersect1d(out, r, assume_unique=True)
        return out

    def party_data(self, dataset: Dataset, party) -> Dataset:
        """The party's table: its rows (own order) and columns, its ids; y only at the guest."""
        i = self.index(party)
        sub = dataset.subset(self.rows[i]).select_columns(self.columns[i])
        sub.ids = self.ids[i]
        if self.parties[i] != self.label_party:
            sub.y = None
        sub.name = f"{dataset.name}:{self.parties[i]}" if dataset.name else self.parties[i]
        return sub


def default_ids(n_rows: int, prefix: str = "id") -> np.ndarray:
    """String ids ``id000000``, ``id000001``, ... (zero-padded so they sort like the rows)."""
    width = max(6, len(str(max(n_rows - 1, 0))))
    return np.char.add(prefix, np.char.zfill(np.arange(n_rows).astype(str), width))


def _resolve_columns(spec, names: list[str], party: str) -> np.ndarray:
    out = []
    for c in spec:
        if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
            if not 0 <= c < len(names):
                raise ValueError(f"columns for {party}: index {c} out of range [0, {len(names)})")
            out.append(int(c))
        elif isinstance(c, str):
            if c not in names:
                raise ValueError(f"columns for {party}: feature {c!r} not found")
            out.append(names.index(c))
        else:
            raise ValueError(f"columns for {party}: entries must be column indices or names, got {c!r}")
    if not out:
        raise ValueError(f"columns for {party}: empty column list")
    if len(set(out)) != len(out):
        raise ValueError(f"columns for {party}: duplicate columns")
    return np.array(sorted(out), dtype=np.int64)


def vertical_split(data, n_hosts: int, scheme: str = "even", seed: int = 0, *, columns=None,
                   shared_fraction: float = 0.0, sample_overlap: float = 1.0, shuffle_rows: bool = True,
                   ids=None, feature_names=None) -> VerticalPartition:
    """Split a table's columns over a guest and ``n_hosts`` hosts, and its rows by ``sample_overlap``.

    Args:
        data: a :class:`Dataset` or a 2-D feature array (then ``ids``/``feature_names`` optional).
        n_hosts: number of hosts H >= 1.
        scheme: ``even`` | ``random`` | ``explicit`` (needs ``columns``) | ``overlap``.
        seed: int seed for column/row randomness (``np.random.default_rng``).
        columns: explicit per-party column lists (H+1 lists of indices or names, guest first).
        shared_fraction: ``overlap`` only, in (0, 1]: fraction of columns every party holds.
        sample_overlap: in (0, 1]: fraction of the guest's ids each host holds.
        shuffle_rows: shuffle every party's row order independently.
        ids: string ids (default: the dataset's ids, else ``id000000``...).
    Raises: ValueError naming the parameter (n_hosts, scheme, columns, shared_fraction,
        sample_overlap) when out of range or when a party would get no column.
    """
    X, names, ids = _table(data, ids, feature_names)
    n, d = X.shape
    if isinstance(n_hosts, bool) or not isinstance(n_hosts, Integral) or n_hosts < 1:
        raise ValueError(f"n_hosts must be a positive int, got {n_hosts!r}")
    P = int(n_hosts) + 1
    if scheme not in VERTICAL_SCHEMES:
        raise ValueError(f"scheme {scheme!r} is unknown; choose one of {', '.join(VERTICAL_SCHEMES)}")
    if not (0 < float(sample_overlap) <= 1):
        raise ValueError(f"sample_overlap must be in (0, 1], got {sample_overlap!r}")
    if columns is not None and scheme != "explicit":
        raise ValueError(f"columns is only used with scheme='explicit' (got scheme={scheme!r})")
    rng = np.random.default_rng(seed)
    parties = ["guest"] + [f"host_{i}" for i in range(1, P)]
    if scheme == "explicit":
        cols, shared = _explicit_columns(columns, names, parties), np.zeros(0, dtype=np.int64)
    else:
        cols, shared = _scheme_columns(scheme, d, P, shared_fraction, rng)
    ids = default_ids(n) if ids is None else np.asarray(ids).astype(str)
    if ids.shape != (n,):
        raise ValueError(f"ids must have shape ({n},), got {ids.shape}")
    rows = _party_rows(n, P, sample_overlap, shuffle_rows, rng)
    return VerticalPartition(parties, cols, [[names[c] for c in cc] for cc in cols], rows,
                             [ids[r] for r in rows], shared)


def _table(data, ids, feature_names) -> tuple[np.ndarray, list[str], object]:
    """(X, feature names, ids or None) of a :class:`Dataset` or a 2-D array."""
    if isinstance(data, Dataset):
        return data.X, list(data.feature_names), data.ids if ids is None else ids
    X = np.asarray(data)
    if X.ndim != 2:
        raise ValueError(f"data must be a Dataset or a 2-D array, got shape {X.shape}")
    names = list(feature_names) if feature_names is not None else [f"x{i}" for i in range(X.shape[1])]
    return X, names, ids


def _explicit_columns(columns, names: list[str], parties: list[str]) -> list[np.ndarray]:
    P = len(parties)
    if columns is None or len(columns) != P:
        raise ValueError(f"columns must give {P} column lists (guest + {P - 1} hosts), got "
                         f"{None if columns is None else len(columns)}")
    return [_resolve_columns(c, names, p) for c, p in zip(columns, parties)]


def _scheme_columns(scheme: str, d: int, P: int, shared_fraction: float, rng) -> tuple[list[np.ndarray], np.ndarray]:
    """Per-party columns and the shared ones for ``even`` / ``random`` / ``overlap`` (module docstring)."""
    shared = np.zeros(0, dtype=np.int64)
    order = np.arange(d)
    if scheme == "overlap":
        if not (0 < float(shared_fraction) <= 1):
            raise ValueError(f"shared_fraction must be in (0, 1] for scheme='overlap', got {shared_fraction!r}")
        n_shared = max(1, int(round(shared_fraction * d)))
        order = rng.permutation(d)
        shared, order = np.sort(order[:n_shared]), order[n_shared:]
        if n_shared < d and d - n_shared < P:
            raise ValueError(f"n_hosts={P - 1}: {d - n_shared} unshared columns cannot give each of "
                             f"{P} parties one; lower shared_fraction or n_hosts")
    else:
        if shared_fraction:
            raise ValueError(f"shared_fraction is only used with scheme='overlap' (got scheme={scheme!r})")
        if d < P:
            raise ValueError(f"n_hosts={P - 1}: {d} columns cannot give each of {P} parties one")
        if scheme == "random":
            order = rng.permutation(d)
    cols = [np.sort(np.concatenate([shared, blk])).astype(np.int64) for blk in np.array_split(order, P)]
    return cols, shared


def _party_rows(n: int, P: int, sample_overlap: float, shuffle_rows: bool, rng) -> list[np.ndarray]:
    """Guest: every row; each host: a random ``round(sample_overlap * n)`` of them; optionally shuffled."""
    rows = [np.arange(n, dtype=np.int64)]
    m = int(round(float(sample_overlap) * n))
    for _ in range(1, P):
        rows.append(np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64) if m < n
                    else np.arange(n, dtype=np.int64))
    if shuffle_rows:
        rows = [r[rng.permutation(r.shape[0])] for r in rows]
    return rows


def write_vertical_csvs(dataset: Dataset, vpart: VerticalPartition, out_dir, *, id_column: str = "id",
                        label_column: str = "y", fmt: str = "csv") -> dict[str, Path]:
    """Write one file per party: ``<party>.csv`` (or ``.parquet``) with the id column first, the
    party's feature columns, and (guest only) the label column last. Floats are written with full
    round-trip precision. Returns {party name: path}. Raises ValueError if ``id_column`` or
    ``label_column`` collides with a feature name, or the guest has no labels to write."""
    import pandas as pd

    if fmt not in ("csv", "parquet"):
        raise ValueError(f"fmt must be 'csv' or 'parquet', got {fmt!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for i, party in enumerate(vpart.parties):
        sub = vpart.party_data(dataset, i)
        for role, c in (("id_column", id_column), ("label_column", label_column)):
            if c in sub.feature_names:
                raise ValueError(f"{role} {c!r} collides with a feature column of {party}")
        frame = {id_column: sub.ids}
        frame.update({name: sub.X[:, j] for j, name in enumerate(sub.feature_names)})
        if party == vpart.label_party:
            if sub.y is None:
                raise ValueError("the dataset has no labels for the guest (label_column)")
            frame[label_column] = sub.y
        df = pd.DataFrame(frame)
        path = out_dir / f"{party}.{fmt}"
        if fmt == "csv":
            df.to_csv(path, index=False, float_format="%.17g")
        else:
            df.to_parquet(path, index=False)
        paths[party] = path
    return paths
