"""Reading big CSV / Parquet tables in row batches, and quantile bin edges from a sketch.

For a party whose table does not fit in memory: :func:`iter_row_batches` yields pandas frames of at most
``batch_rows`` rows (peak memory set by ``batch_rows``, not by the table), and :func:`sketch_cuts` finds
per-column quantile bin edges in two passes over the batches with a fixed-size histogram sketch
(``sketch_bins`` equal cells between each column's min and max; the edges are exact to one cell),
in the manner of the weighted quantile sketch of XGBoost (Chen & Guestrin, KDD 2016, sec. 3.3).
Memory: O(batch_rows x columns + sketch_bins x columns).

Used by the jobs (``data.max_memory_mb``): :func:`load_table_batched` builds a party's table batch by
batch (no whole-table DataFrame), and :func:`batched_quantile_cuts` gives SecureBoost exactly the
in-memory quantile cuts from row batches (radix selection), so a streamed job trains the same model.
A vertical party reads its table in two passes (``secureflhv.runtime.job.data_prep.prepare_vertical``):
:func:`load_ids_batched` (the id and label columns only) for PSI, then ``load_table_batched(rows=psi.rows)``,
which copies each batch's common rows straight to their aligned places. Its peak is then the aligned
matrix (common rows x features x 8 bytes), plus the whole table's ids and labels, plus one batch (its
pandas frame, parsed float64 copy and reader buffers: about 3 x ``batch_rows`` x columns x 8 bytes; for
Parquet the row groups it spans) — never the whole table's matrix. Both readers read one batch at a time:
a CSV in ``pandas.read_csv`` chunks, a Parquet file row group by row group without pre-buffering.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np


def _parquet():
    """Parquet read row group by row group: pyarrow's default pre-buffering fetches a whole file's
    column chunks ahead (a 0.9 GB file: 0.9 GB in pyarrow's pool, whatever the batch size)."""
    import pyarrow.dataset as pads

    return pads.ParquetFileFormat(default_fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=False))


class _ParquetRowGroups:
    """A Parquet file as pandas frames of at most ``batch_rows`` rows, one at a time. pyarrow's dataset
    scanner pre-buffers a file's column chunks and reads row groups ahead of a slow consumer (measured:
    0.5-0.9 GB of a 0.9 GB file in pyarrow's pool while parsing 33 MB batches); ``ParquetFile.iter_batches``
    without pre-buffering holds the row groups of the batch it is building."""

    def __init__(self, path: Path):
        import pyarrow.parquet as pq

        self._file = pq.ParquetFile(str(path), pre_buffer=False)

    def header(self):
        """An empty frame with the file's columns and types."""
        return self._file.schema_arrow.empty_table().to_pandas()

    def count_rows(self) -> int:
        return int(self._file.metadata.num_rows)

    def frames(self, batch_rows: int, columns=None):
        return (b.to_pandas() for b in self._file.iter_batches(batch_size=batch_rows, columns=columns) if b.num_rows)


class _CsvChunks:
    """A CSV file as pandas frames of at most ``batch_rows`` rows, read as ``load_table`` reads it whole
    (``pandas.read_csv``: ``strings`` as text, the rest inferred, pandas' empty-cell strings missing), so
    each value is parsed by the same parser, bit for bit. pandas reads synchronously (one chunk at a
    time); pyarrow's CSV scanner reads ahead of a slow consumer (measured: 209 MB decoded of a 600 MB
    file at once)."""

    def __init__(self, path: Path, strings=(), *, all_text: bool = False):
        self._path, self._dtype = path, str if all_text else {c: str for c in strings}

    def header(self):
        import pandas as pd

        return pd.read_csv(self._path, nrows=0, dtype=self._dtype, keep_default_na=True)

    def count_rows(self) -> int:
        import pyarrow.dataset as pads

        return int(pads.dataset(str(self._path), format="csv").count_rows())

    def frames(self, batch_rows: int, columns=None):
        import pandas as pd

        with pd.read_csv(self._path, dtype=self._dtype, keep_default_na=True, chunksize=batch_rows,
                         usecols=columns) as reader:
            yield from (f for f in reader if len(f))


def _source(path: Path, strings=()):
    """:class:`_CsvChunks` for a ``.csv`` / ``.txt`` file, else :class:`_ParquetRowGroups`."""
    return _CsvChunks(path, strings) if path.suffix.lower() in (".csv", ".txt") else _ParquetRowGroups(path)


def _dataset(path):
    import pyarrow.dataset as pads

    path = Path(path)
    suffix = path.suffix.lower() if path.is_file() else ""
    return pads.dataset(str(path), format="csv" if suffix in (".csv", ".txt") else _parquet())


def iter_row_batches(path, batch_rows: int = 65_536, columns: list[str] | None = None) -> Iterator:
    """pandas DataFrames of at most ``batch_rows`` rows of the table at ``path``, in file order.

    ``path``: a ``.csv`` file, a Parquet file, or a folder of Parquet files. Raises ValueError for
    ``batch_rows < 1`` and for a column the table lacks (naming it).
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    ds = _dataset(path)
    if columns is not None:
        missing = [c for c in columns if c not in ds.schema.names]
        if missing:
            raise ValueError(f"{path}: no column(s) {missing}; columns: {ds.schema.names}")
    for batch in ds.to_batches(columns=columns, batch_size=batch_rows):
        if batch.num_rows:
            yield batch.to_pandas()


def iter_text_batches(path, batch_rows: int) -> Iterator:
    """pandas DataFrames of at most ``batch_rows`` rows of a CSV / Parquet table, in file order, as
    ``pandas.read_csv(path, dtype=str)`` / ``pandas.read_parquet`` would give them whole: a CSV's cells as
    text (pandas' empty-cell strings as missing), a Parquet file's typed values; one batch in memory at a
    time. For checking cells (preflight). Raises ValueError for ``batch_rows < 1``."""
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    path = Path(path)
    csv = path.suffix.lower() in (".csv", ".txt")
    yield from (_CsvChunks(path, all_text=True) if csv else _ParquetRowGroups(path)).frames(batch_rows)


def sketch_cuts(path, columns: list[str], max_bin: int, *, sketch_bins: int = 2048,
                batch_rows: int = 65_536) -> dict[str, np.ndarray]:
    """Per column, up to ``max_bin - 1`` ascending inner bin edges at equal-count quantiles.

    Two passes over :func:`iter_row_batches` (min/max, then counts per sketch cell); missing values
    (NaN) are ignored. Edges are sketch-cell boundaries, so each quantile is within one cell
    (``(max - min) / sketch_bins``) of the exact one. A constant or empty column gets no edges.
    """
    lo = {c: np.inf for c in columns}
    hi = {c: -np.inf for c in columns}
    for frame in iter_row_batches(path, batch_rows, columns):
        for c in columns:
            v = frame[c].to_numpy(np.float64)
            if np.isfinite(v).any():
                lo[c], hi[c] = min(lo[c], np.nanmin(v)), max(hi[c], np.nanmax(v))
    counts = {c: np.zeros(sketch_bins, dtype=np.int64) for c in columns}
    for frame in iter_row_batches(path, batch_rows, columns):
        for c in columns:
            if not hi[c] > lo[c]:
                continue
            v = frame[c].to_numpy(np.float64)
            v = v[np.isfinite(v)]
            cell = np.minimum(((v - lo[c]) / (hi[c] - lo[c]) * sketch_bins).astype(np.int64), sketch_bins - 1)
            counts[c] += np.bincount(cell, minlength=sketch_bins)
    cuts = {}
    for c in columns:
        total = counts[c].sum()
        if not hi[c] > lo[c] or total == 0:
            cuts[c] = np.empty(0)
            continue
        cum = np.cumsum(counts[c])
        targets = total * np.arange(1, max_bin) / max_bin
        cells = np.unique(np.searchsorted(cum, targets, side="left"))
        cells = cells[cells < sketch_bins - 1]
        cuts[c] = lo[c] + (cells + 1) * (hi[c] - lo[c]) / sketch_bins
    return cuts


# ------------------------------------------------------------------ exact quantiles in bounded memory
def _keys(v32: np.ndarray) -> np.ndarray:
    """Order-preserving uint32 keys of float32 values (no NaN): key order = numeric order."""
    bits = (v32 + np.float32(0.0)).view(np.uint32)  # + 0.0: -0.0 becomes +0.0 (they compare equal)
    return np.where(bits & np.uint32(0x80000000), ~bits, bits | np.uint32(0x80000000))


def _from_keys(keys: np.ndarray) -> np.ndarray:
    keys = np.asarray(keys, dtype=np.uint32)
    bits = np.where(keys & np.uint32(0x80000000), keys & np.uint32(0x7FFFFFFF), ~keys)
    return bits.astype(np.uint32).view(np.float32)


def batched_quantile_cuts(batches, n_columns: int, max_bin: int) -> list[np.ndarray]:
    """Per column the cuts of ``secureflhv.tree.binning.quantile_cuts``, exactly, in bounded memory.

    ``batches``: a callable returning a fresh iterator of float arrays (rows, n_columns) (e.g. row
    batches of a matrix or of a table); it is iterated 4 times. The rule is the in-memory one, on the
    float32 values with NaN ignored: at most ``max_bin`` distinct values -> every distinct value but the
    smallest; else the distinct values among the order statistics ``v[k * n // max_bin]``
    (k = 1 .. max_bin - 1) that exceed the minimum. The order statistics are found exactly by radix
    selection on the values' 32-bit keys, 8 bits per pass (cf. the quantile sketch of Chen & Guestrin,
    KDD 2016, sec. 3.3; here no approximation is needed since the data can be read several times).

    Memory: one batch plus O(n_columns x max_bin x 256) counters, whatever the number of rows.
    Raises ValueError on infinite values or a batch with another number of columns.
    """
    d = int(n_columns)
    n, distinct, top = _first_pass(batches, d, max_bin)
    # the ranks to select: per column the minimum (rank 0) and v[k * n // max_bin]
    ranks = [np.concatenate([[0], (np.arange(1, max_bin, dtype=np.int64) * n[j]) // max_bin])
             if distinct[j] is None and n[j] else np.empty(0, dtype=np.int64) for j in range(d)]
    prefix = _radix_select(batches, d, ranks, top)
    return [_column_cuts(n[j], distinct[j], prefix[j]) for j in range(d)]


def _column_keys(batches, d: int):
    """(j, uint32 keys of column j's non-NaN float32 values) for every batch and column.

    Raises ValueError on a batch that is not (rows, d) or holds an infinite value."""
    for batch in batches():
        B = np.asarray(batch, dtype=np.float64)
        if B.ndim != 2 or B.shape[1] != d:
            raise ValueError(f"batch of shape {B.shape}, expected (rows, {d})")
        if np.isinf(B).any():
            raise ValueError("features contain infinite values")
        B32 = B.astype(np.float32)
        for j in range(d):
            v = B32[:, j]
            yield j, _keys(v[~np.isnan(v)])


def _first_pass(batches, d: int, max_bin: int):
    """Per column: the count of non-NaN values (int64, (d,)); its distinct float32 values while there
    are at most ``max_bin`` of them, else None; the counts of the keys' first byte (int64, (d, 256))."""
    n = np.zeros(d, dtype=np.int64)
    distinct: list[np.ndarray | None] = [np.empty(0, dtype=np.float32) for _ in range(d)]
    top = np.zeros((d, 256), dtype=np.int64)
    for j, k in _column_keys(batches, d):
        n[j] += len(k)
        top[j] += np.bincount(k >> np.uint32(24), minlength=256)
        if distinct[j] is not None:
            u = np.union1d(distinct[j], _from_keys(np.unique(k)))
            distinct[j] = u if len(u) <= max_bin else None
    return n, distinct, top


def _descend(prefix: np.ndarray, left: np.ndarray, counts) -> None:
    """Fix the next byte of every selected rank of a column from its group's byte counts (in place:
    ``prefix`` gains the byte, ``left`` becomes the rank within the narrower group)."""
    for t in range(len(prefix)):
        cum = np.cumsum(counts[t])
        b = int(np.searchsorted(cum, left[t], side="right"))
        left[t] -= int(cum[b - 1]) if b else 0
        prefix[t] = (prefix[t] << 8) | b


def _byte_counts(k: np.ndarray, shift: int, groups: np.ndarray, prefix: np.ndarray) -> np.ndarray:
    """Counts (len(prefix), 256) of the key byte at ``shift`` among the keys ``k`` whose higher bits
    equal each rank's known ``prefix`` (``groups``: the sorted distinct prefixes)."""
    hi = (k >> np.uint32(shift + 8)).astype(np.int64)
    pos = np.searchsorted(groups, hi)
    hit = (pos < len(groups)) & (groups[np.minimum(pos, len(groups) - 1)] == hi)
    byte = ((k[hit] >> np.uint32(shift)) & np.uint32(0xFF)).astype(np.int64)
    per_group = np.bincount(pos[hit] * 256 + byte, minlength=len(groups) * 256).reshape(-1, 256)
    return per_group[np.searchsorted(groups, prefix)]


def _radix_select(batches, d: int, ranks: list, top: np.ndarray) -> list:
    """Per column the uint32 keys (as int64) of the values at ``ranks[j]`` in sorted order, found
    byte by byte (3 more passes over ``batches`` after the first byte's counts ``top``)."""
    prefix = [np.zeros(len(r), dtype=np.int64) for r in ranks]  # known high key bits of each rank
    left = [r.copy() for r in ranks]                              # rank within its prefix group
    for j in range(d):
        _descend(prefix[j], left[j], [top[j]] * len(ranks[j]))
    for shift in (16, 8, 0):
        counts = [np.zeros((len(r), 256), dtype=np.int64) for r in ranks]
        groups = [np.unique(p) for p in prefix]
        for j, k in _column_keys(batches, d):
            if len(ranks[j]):
                counts[j] += _byte_counts(k, shift, groups[j], prefix[j])
        for j in range(d):
            _descend(prefix[j], left[j], counts[j])
    return prefix


def _column_cuts(n: int, distinct, prefix: np.ndarray) -> np.ndarray:
    """One column's cuts (float64) from its value count, distinct values (or None) and selected keys."""
    if n == 0:
        return np.zeros(0)
    if distinct is not None:
        return np.sort(distinct)[1:].astype(np.float64)
    vals = _from_keys(prefix.astype(np.uint32))
    cuts = np.unique(vals[1:])
    return cuts[cuts > vals[0]].astype(np.float64)


def row_batches(X: np.ndarray, rows: np.ndarray, batch_rows: int):
    """A callable giving an iterator of ``X[rows]`` in batches of ``batch_rows`` rows (for
    :func:`batched_quantile_cuts`: never more than one batch copied at a time)."""
    rows = np.asarray(rows, dtype=np.int64)
    step = max(1, int(batch_rows))
    return lambda: (X[rows[i:i + step]] for i in range(0, len(rows), step))


# ------------------------------------------------------------------ a table read in row batches
def table_bytes(path) -> int:
    """The in-memory size to compare with a memory budget: a CSV's file size; a Parquet table's
    rows x columns x 8 bytes (its values as float64), read from the file's metadata."""
    path = Path(path)
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        meta = pq.read_metadata(path)
        return int(meta.num_rows) * int(meta.num_columns) * 8
    return path.stat().st_size


def _table_source(path: Path, *, id_column, parsed):
    """Row batches of ``path`` read as ``load_table`` reads the whole file (CSV: the id and categorical
    columns as text)."""
    strings = [c for c in (id_column,) if c is not None]
    if parsed is not None:
        strings += [c for c, s in parsed.columns.items() if s.kind in ("categorical", "id")]
    return _source(path, strings)


@contextmanager
def _reading(path: Path):
    """pandas' / pyarrow's own exception types as DataError naming the file (DataError, FileNotFoundError
    pass)."""
    from .loaders import DataError

    try:
        yield
    except (DataError, FileNotFoundError):
        raise
    except Exception as exc:  # pandas and pyarrow raise their own exception types
        raise DataError(f"cannot read {path} in row batches: {exc}") from exc


def _parsed_batches(source, path: Path, batch_rows: int, *, columns=None, **parse):
    """``(first row, Dataset)`` for each non-empty batch of ``source`` (only ``columns`` when given), parsed
    as ``load_table`` parses a table (``parse``: its id / label / feature columns and parsed schema).

    One batch (and for Parquet the row groups it spans) in memory at a time. Errors name the table's
    rows. Raises DataError when label names or categories inferred from the values differ between
    batches, and (after the last batch) SchemaError for a schema column empty in every row.
    """
    from .loaders import DataError, _frame_to_dataset
    from .schema import SchemaError

    first, at, present = None, 0, None
    for frame in source.frames(batch_rows, columns):
        part = _frame_to_dataset(frame, path, group_column=None, time_column=None, name=path.stem,
                                 batch_start=at, **parse)
        if first is None:
            first = part
            present = np.zeros(part.n_features, dtype=bool)
        elif (part.label_names, part.categories) != (first.label_names, first.categories):
            raise DataError(f"{path}: label names or categories differ between row batches; declare them "
                            f"in the data schema to read this table in batches")
        present |= ~np.isnan(part.X).all(axis=0)
        yield at, part
        at += part.n_rows
    declared = parse["schema"].columns if parse.get("schema") is not None else {}
    for name, seen in zip(first.feature_names, present) if first is not None else ():
        if name in declared and not seen:  # what load_table checks on the whole column
            raise SchemaError(f"{path}: column {name!r} is empty in every row (all values missing)")


def _opened(path, batch_rows: int, id_column, label_column, feature_columns, schema):
    """Checks the arguments; returns (path, row-batch source, keyword arguments of the per-batch parse)."""
    from .schema import parse_schema

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    parsed = parse_schema(schema, f"{path} schema") if schema is not None else None
    parse = dict(id_column=id_column, label_column=label_column, feature_columns=feature_columns, schema=parsed)
    with _reading(path):
        source = _table_source(path, id_column=id_column if id_column is not None else
                               getattr(parsed, "id_column", None), parsed=parsed)
    return path, source, parse


def _whole_ids_and_labels(path: Path, id_column, ids: list, ys: list):
    """The ids (duplicates refused) and labels of the whole table from its batches' parts; labels that
    are all whole numbers become int64 (the rule of ``load_table``, on the whole column)."""
    from .loaders import DataError

    ids_all = np.concatenate(ids) if ids else None
    if ids_all is not None and np.unique(ids_all).shape[0] != ids_all.shape[0]:
        raise DataError(f"{path}: id column {id_column!r} has duplicate ids")
    y = np.concatenate(ys) if ys else None
    if y is not None and y.dtype.kind == "f" and np.all(y == np.round(y)):
        y = y.astype(np.int64)
    return ids_all, y


def load_ids_batched(path, batch_rows: int, *, id_column: str | None = None, label_column: str | None = None,
                     feature_columns: list[str] | None = None, schema=None):
    """Pass 1 of a streamed vertical preparation: the ids (and labels) of a CSV / Parquet table, read
    ``batch_rows`` rows at a time and only from those columns.

    Returns a :class:`~secureflhv.data.Dataset` with no feature columns (``X`` of shape (rows, 0)) whose
    ``ids``, ``y`` and ``label_names`` are those :func:`load_table_batched` would give. The header is
    checked as ``load_table`` checks it (missing id / label / feature / schema columns); the feature
    cells themselves are parsed (and their errors raised) by :func:`load_table_batched`, the second pass.
    Memory: the ids and labels plus one batch of those two columns. Raises as :func:`load_table_batched`.
    """
    from .dataset import Dataset
    from .loaders import DataError, _frame_to_dataset

    path, source, parse = _opened(path, batch_rows, id_column, label_column, feature_columns, schema)
    parsed = parse["schema"]
    id_column = id_column if id_column is not None or parsed is None else parsed.id_column
    label_column = label_column if label_column is not None or parsed is None else parsed.label_column
    keys = [c for c in (id_column, label_column) if c is not None]
    with _reading(path):
        # the header, parsed as a table with no rows: the same errors as load_table for absent columns
        _frame_to_dataset(source.header(), path, group_column=None, time_column=None,
                          name=path.stem, **parse)
        from .schema import TableSchema

        only = TableSchema(columns={c: parsed.columns[c] for c in keys if c in parsed.columns}) \
            if parsed is not None else None
        ids, ys, n, first = [], [], 0, None
        for _, part in _parsed_batches(source, path, batch_rows, columns=keys, id_column=id_column,
                                       label_column=label_column, feature_columns=[], schema=only):
            if first is None:
                first = part
            n += part.n_rows
            if part.ids is not None:
                ids.append(part.ids)
            if part.y is not None:
                ys.append(part.y)
    if first is None:
        raise DataError(f"{path}: the table has no rows")
    ids_all, y = _whole_ids_and_labels(path, id_column, ids, ys)
    return Dataset(np.empty((n, 0)), y, [], ids=ids_all, name=path.stem, label_names=first.label_names)


def _sorted_rows(path: Path, rows):
    """``rows`` as int64 (-1,), the stable permutation sorting it, and the sorted rows (a batch's rows
    are then one slice). Raises DataError on a negative row."""
    from .loaders import DataError

    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    order = np.argsort(rows, kind="stable")
    srt = rows[order]
    if len(rows) and srt[0] < 0:
        raise DataError(f"{path}: negative row {srt[0]}")
    return rows, order, srt


def load_table_batched(path, batch_rows: int, *, id_column: str | None = None, label_column: str | None = None,
                       feature_columns: list[str] | None = None, schema=None, rows=None):
    """What :func:`secureflhv.data.load_table` returns for a CSV / Parquet file, read ``batch_rows`` rows at a time.

    The whole table is never a DataFrame: each batch is parsed like ``load_table`` parses the table
    (CSV: ``pandas.read_csv`` chunks, the id column and categorical columns as text; Parquet: row groups
    by ``pyarrow.parquet.ParquetFile.iter_batches``) and copied into the preallocated feature matrix.

    ``rows`` (int array, each in ``[0, table rows)``): return only those rows, in that order — the
    dataset ``t`` with ``t.X == whole.X[rows]``, ``t.y == whole.y[rows]``, ``t.ids == whole.ids[rows]``
    (the labels' dtype and the duplicate-id check are decided on the whole table, as without ``rows``).
    Each batch's rows that are in ``rows`` are copied straight to their places, so the whole matrix
    never exists (a vertical party passes its PSI rows: pass 2 of a streamed preparation).

    Peak memory: the matrix (``len(rows)`` or all rows x features x 8 bytes), the ids and labels of the
    whole table, plus one batch. Raises FileNotFoundError; DataError as ``load_table`` does (missing or
    non-numeric column, duplicate ids), when label names or categories inferred from the values differ
    between batches (declare them in the data schema), and when ``rows`` names a row the table lacks.
    """
    from .dataset import Dataset
    from .loaders import DataError

    path, source, parse = _opened(path, batch_rows, id_column, label_column, feature_columns, schema)
    with _reading(path):
        if rows is None:
            n = source.count_rows()
        else:
            rows, order, srt = _sorted_rows(path, rows)
        X, ids, ys, first, at = None, [], [], None, 0
        for at, part in _parsed_batches(source, path, batch_rows, **parse):
            if first is None:
                first = part
                X = np.empty((n if rows is None else len(rows), part.n_features), dtype=part.X.dtype)
            if rows is None:
                X[at:at + part.n_rows] = part.X
            else:
                lo, hi = np.searchsorted(srt, [at, at + part.n_rows])
                X[order[lo:hi]] = part.X[srt[lo:hi] - at]
            if part.ids is not None:
                ids.append(part.ids)
            if part.y is not None:
                ys.append(part.y)
            at += part.n_rows
    if first is None:
        raise DataError(f"{path}: the table has no rows")
    if rows is not None and len(rows) and srt[-1] >= at:
        raise DataError(f"{path}: rows out of range for a table of {at} rows")
    ids_all, y = _whole_ids_and_labels(path, id_column if id_column is not None else
                                       getattr(parse["schema"], "id_column", None), ids, ys)
    if rows is None:
        X = X[:at]
    else:
        ids_all, y = (None if a is None else a[rows] for a in (ids_all, y))
    return Dataset(X, y, first.feature_names, ids=ids_all, name=path.stem, label_names=first.label_names,
                   categories=first.categories)
