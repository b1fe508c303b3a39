"""Feature-store lookup latency for online serving (issue 41): SQLite (the default, stdlib) against DuckDB.

A serving host reads its feature rows per request, so what matters is the latency of one lookup of 1 id
(one applicant) and of 64 ids (a batch), on a table of a realistic size. Every store answers through the
same code (:class:`secureflhv.runtime.serve.feature_store._SqlFeatureStore`: distinct ids, one query, the
rows placed into a float64 array with NaN and a found mask); only the connection and the query differ:

* ``sqlite``: :func:`open_store` on the file :func:`build_sqlite_store` writes (WITHOUT ROWID, id primary
  key, read-only connection, prepared ``IN (?, ...)`` padded to a power of two);
* ``duckdb in-list`` / ``duckdb any``: the same table in a DuckDB file (id PRIMARY KEY, an ART index),
  read-only, queried with ``IN (?, ...)`` or ``= ANY(?)``; skipped with a message when duckdb is absent
  (it is not a dependency: ``pip install duckdb`` to measure it);
* ``memory``: :class:`MemoryFeatureStore`, arrays in this process: the floor of the answer's assembly.

Each request draws its ids at random (for 64 ids, about 1 in 16 unknown); the first ``--warmup`` requests
are not counted. Latency is wall time of ``lookup`` in this thread, one request at a time.

    python benchmarks/feature_store.py                 # 100,000 rows x 30 columns, 2,000 requests per row
    python benchmarks/feature_store.py --quick         # 10,000 rows, 300 requests: a smoke run
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from secureflhv.runtime.serve.feature_store import (  # noqa: E402
    FeatureStore, MemoryFeatureStore, _SqlFeatureStore, build_sqlite_store, open_store, quote_ident,
)


class DuckDBStore(_SqlFeatureStore):
    """The same table in a DuckDB file, read-only, a cursor per thread; ``mode`` is ``in`` (``IN (?, ...)``,
    one statement per batch size) or ``any`` (``= ANY(?)`` with one list parameter)."""

    def __init__(self, path: Path, columns: list[str], mode: str):
        import duckdb

        super().__init__(str(path), "features", "id")
        self._db = duckdb.connect(str(path), read_only=True)
        self._mode = mode
        self._open_check(columns)

    def _table_columns(self, conn: Any) -> list[str]:
        # DuckDB's execute returns the connection itself, which the base class would close.
        return [d[0] for d in conn.execute(f"SELECT * FROM {quote_ident(self.table)} LIMIT 0").description]

    def _connect(self) -> Any:
        return self._db.cursor()

    def _fetch(self, conn: Any, ids: list[str]) -> list[tuple]:
        if self._mode == "any":
            return conn.execute(f"{self._select} = ANY(?)", [ids]).fetchall()
        return conn.execute(f"{self._select} IN ({','.join('?' * len(ids))})", ids).fetchall()

    def __len__(self) -> int:
        return self._conn().execute("SELECT count(*) FROM features").fetchone()[0]

    def close(self) -> None:
        super().close()
        self._db.close()


def build_duckdb(path: Path, ids: list[str], X: np.ndarray, columns: list[str]) -> None:
    """The table as a DuckDB file: id VARCHAR PRIMARY KEY, one DOUBLE per column, NaN written as NULL."""
    import duckdb
    import pyarrow as pa

    arrow = pa.table({"id": pa.array(ids), **{c: pa.array(X[:, j], mask=np.isnan(X[:, j]))
                                              for j, c in enumerate(columns)}})
    con = duckdb.connect(str(path))
    feats = "".join(f", {quote_ident(c)} DOUBLE" for c in columns)
    con.execute(f"CREATE TABLE features (id VARCHAR PRIMARY KEY{feats})")
    con.register("arrow_in", arrow)
    con.execute("INSERT INTO features SELECT * FROM arrow_in")
    con.close()


def requests(ids: list[str], batch: int, count: int, seed: int) -> list[list[str]]:
    """``count`` requests of ``batch`` ids drawn at random; in a batch over 1, about 1 id in 16 is unknown."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        pick = [ids[k] for k in rng.integers(0, len(ids), size=batch)]
        if batch > 1:
            pick = [f"unknown-{k}" if rng.random() < 1 / 16 else i for k, i in enumerate(pick)]
        out.append(pick)
    return out


def latency(lookup: Callable[[list[str]], Any], reqs: list[list[str]], warmup: int) -> dict[str, float]:
    """p50 / p99 / mean of ``lookup`` over ``reqs`` (after ``warmup`` of them), in microseconds."""
    for r in reqs[:warmup]:
        lookup(r)
    times = []
    for r in reqs[warmup:]:
        t0 = time.perf_counter_ns()
        lookup(r)
        times.append(time.perf_counter_ns() - t0)
    us = np.array(times) / 1e3
    return {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)), "mean": float(us.mean())}


def open_stores(folder: Path, ids: list[str], X: np.ndarray, cols: list[str]) -> dict[str, tuple[FeatureStore, str]]:
    """Each store to measure, with its build time and file size as a note."""
    stores: dict[str, tuple[FeatureStore, str]] = {}
    t0 = time.perf_counter()
    path = build_sqlite_store(folder / "fs.sqlite", ids, X, cols)
    note = f"build {time.perf_counter() - t0:.1f} s, {path.stat().st_size / 2**20:.1f} MiB"
    stores["sqlite"] = (open_store(path, columns=cols), note)
    try:
        import duckdb
    except ImportError:
        print("duckdb is not installed: its rows are skipped (pip install duckdb to measure it)")
    else:
        t0 = time.perf_counter()
        build_duckdb(folder / "fs.duckdb", ids, X, cols)
        note = (f"build {time.perf_counter() - t0:.1f} s, {(folder / 'fs.duckdb').stat().st_size / 2**20:.1f} MiB,"
                f" duckdb {duckdb.__version__}")
        stores["duckdb in-list"] = (DuckDBStore(folder / "fs.duckdb", cols, "in"), note)
        stores["duckdb any"] = (DuckDBStore(folder / "fs.duckdb", cols, "any"), "")
    stores["memory"] = (MemoryFeatureStore(ids, X, cols), "floor: arrays in this process")
    return stores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--cols", type=int, default=30)
    ap.add_argument("--requests", type=int, default=2000, help="timed requests per store and batch size")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="10,000 rows, 300 requests")
    a = ap.parse_args()
    if a.quick:
        a.rows, a.requests, a.warmup = 10_000, 300, 30
    rng = np.random.default_rng(a.seed)
    ids = [f"cust-{k:08d}" for k in rng.permutation(a.rows)]
    X = rng.normal(size=(a.rows, a.cols))
    X[rng.random(X.shape) < 0.05] = np.nan
    cols = [f"f{j:02d}" for j in range(a.cols)]
    print(f"{a.rows:,} rows x {a.cols} columns, {a.requests:,} timed requests each, load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; latency in microseconds")
    with tempfile.TemporaryDirectory() as tmp:
        stores = open_stores(Path(tmp), ids, X, cols)
        print(f"{'store':<16}{'ids':>5}{'p50':>10}{'p99':>10}{'mean':>10}  note")
        for batch in (1, 64):
            reqs = requests(ids, batch, a.requests + a.warmup, a.seed + batch)
            want = stores["memory"][0].lookup(reqs[0])[0]
            for name, (store, note) in stores.items():
                assert np.array_equal(store.lookup(reqs[0])[0], want, equal_nan=True), name
                s = latency(store.lookup, reqs, a.warmup)
                print(f"{name:<16}{batch:>5}{s['p50']:>10.0f}{s['p99']:>10.0f}{s['mean']:>10.0f}  "
                      f"{note if batch == 1 else ''}")
        for store, _ in stores.values():
            store.close()


if __name__ == "__main__":
    main()
