"""Hosts' feature stores for online serving (issue 41): SQLite built or a user's own table, in-memory,
PostgreSQL's missing-package error; NaN, unknown and duplicated ids, hostile names, threads. A live PostgreSQL
check (needs a server): tools/check_postgres_store.py."""
from __future__ import annotations

import sqlite3
import sys
import threading

import numpy as np
import pytest

from secureflhv.runtime.serve.feature_store import (
    MemoryFeatureStore, build_sqlite_store, open_store, quote_ident,
)

COLS = ["age", "income", "debt ratio"]


def _table(n=50, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, len(COLS)))
    X[rng.random(X.shape) < 0.2] = np.nan
    X[3, 1] = np.inf
    ids = [f"u{i:03d}" for i in range(n)][::-1]  # written out of order: the store sorts, lookups must not care
    return ids, X


def _same(a, b):
    return np.array_equal(a, b, equal_nan=True)


@pytest.fixture
def built(tmp_path):
    ids, X = _table()
    path = build_sqlite_store(tmp_path / "fs.sqlite", ids, X, COLS)
    with open_store(path) as store:
        yield store, ids, X


def test_round_trip_nan_unknown_duplicates_order(built):
    store, ids, X = built
    assert store.columns == COLS and len(store) == len(ids) and store.indexed
    X_all, found = store.lookup(ids)
    assert found.all() and X_all.dtype == np.float64 and _same(X_all, X)
    ask = [ids[7], "nobody", ids[3], ids[7], "", ids[0]]
    got, found = store.lookup(ask)
    assert found.tolist() == [True, False, True, True, False, True]
    assert _same(got[[0, 2, 3, 5]], X[[7, 3, 7, 0]])
    assert np.isnan(got[[1, 4]]).all()
    assert got[2, 1] == np.inf


def test_batches_over_one_query_chunk(tmp_path):
    n = 1300  # > 2 chunks of 512 distinct ids, and a padded last chunk
    ids, X = [f"id{i}" for i in range(n)], np.arange(n * 2, dtype=float).reshape(n, 2)
    with open_store(build_sqlite_store(tmp_path / "big.db", ids, X, ["a", "b"])) as store:
        ask = ids[::-1] + ["x", "y"] + ids[:5]
        got, found = store.lookup(ask)
        assert found.sum() == n + 5 and _same(got[:n], X[::-1]) and _same(got[-5:], X[:5])


def test_empty_id_list(built):
    store = built[0]
    got, found = store.lookup([])
    assert got.shape == (0, 3) and got.dtype == np.float64 and found.shape == (0,) and found.dtype == bool


def test_columns_subset_and_order(built):
    store, ids, X = built
    with open_store(store.path, columns=["debt ratio", "age"]) as sub:
        got, _ = sub.lookup(ids[:4])
        assert sub.columns == ["debt ratio", "age"] and _same(got, X[:4][:, [2, 0]])


def test_user_table_other_order_extra_columns_integer_ids(tmp_path):
    db = tmp_path / "bank.db"
    con = sqlite3.connect(db)
    con.execute('CREATE TABLE clients (note TEXT, income NUMERIC, cust_no INTEGER PRIMARY KEY, age INT, extra)')
    con.executemany("INSERT INTO clients VALUES (?, ?, ?, ?, ?)",
                    [("a", 1000, 7, 31, "x"), ("b", None, 42, 55, 1.0), ("c", 2.5, 9, None, None)])
    con.commit()
    con.close()
    with open_store(f"sqlite:///{db}", table="clients", id_column="cust_no", columns=["age", "income"]) as store:
        got, found = store.lookup(["42", "7", "8", 9])
        assert found.tolist() == [True, True, False, True]
        assert _same(got, np.array([[55, np.nan], [31, 1000], [np.nan, np.nan], [np.nan, 2.5]]))
        assert len(store) == 3
    with open_store(db, table="clients", id_column="cust_no") as every:
        assert every.columns == ["note", "income", "age", "extra"]
        with pytest.raises(ValueError, match=r"non-numeric values in columns \['note', 'extra'\]"):
            every.lookup(["7"])


def test_hostile_column_and_table_names(tmp_path):
    cols = ['a"b', "x'); DROP TABLE t; --", "sp ace", "ünï"]
    ids, X = ["1", "2"], np.array([[1.0, 2.0, 3.0, 4.0], [5.0, np.nan, 7.0, 8.0]])
    path = build_sqlite_store(tmp_path / "h.db", ids, X, cols, table='my"table')
    with open_store(path, table='my"table', columns=cols[::-1]) as store:
        got, found = store.lookup(["2", "1"])
        assert found.all() and _same(got, X[[1, 0]][:, ::-1])
    assert quote_ident('a"b') == '"a""b"'
    with pytest.raises(ValueError):
        quote_ident("nul\x00")


def test_missing_columns_named(built):
    with pytest.raises(ValueError, match=r"missing feature columns \['salary', 'zip'\]"):
        open_store(built[0].path, columns=["age", "salary", "zip"])
    with pytest.raises(ValueError, match="no id column 'cust'"):
        open_store(built[0].path, id_column="cust")
    with pytest.raises(ValueError, match="cannot read table 'nope'"):
        open_store(built[0].path, table="nope")


def test_build_rejects_bad_tables(tmp_path):
    p = tmp_path / "x.db"
    with pytest.raises(ValueError, match="duplicate ids"):
        build_sqlite_store(p, ["a", "b", "a"], np.zeros((3, 1)), ["f"])
    with pytest.raises(ValueError, match="shape"):
        build_sqlite_store(p, ["a", "b"], np.zeros((3, 1)), ["f"])
    with pytest.raises(ValueError, match="shape"):
        build_sqlite_store(p, ["a"], np.zeros((1, 2)), ["f"])
    with pytest.raises(ValueError, match="duplicate feature column"):
        build_sqlite_store(p, ["a"], np.zeros((1, 2)), ["F", "f"])
    with pytest.raises(ValueError, match="also named as a feature"):
        build_sqlite_store(p, ["a"], np.zeros((1, 1)), ["id"])
    assert not p.exists() and list(tmp_path.iterdir()) == []  # no temp file left behind


def test_rebuild_replaces_atomically(tmp_path):
    p = tmp_path / "fs.db"
    build_sqlite_store(p, ["a"], np.array([[1.0]]), ["f"])
    old = open_store(p)
    build_sqlite_store(p, ["a", "b"], np.array([[2.0], [3.0]]), ["f"])
    assert _same(old.lookup(["a", "b"])[0], [[1.0], [np.nan]])  # an open store keeps its snapshot
    with open_store(p) as new:
        assert _same(new.lookup(["a", "b"])[0], [[2.0], [3.0]])
    old.close()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["fs.db"]


def test_read_only(built):
    store = built[0]
    with pytest.raises(sqlite3.OperationalError):
        store._conn().execute('DELETE FROM "features"')


def test_bad_inputs_and_close(built):
    store, ids, _ = built
    with pytest.raises(TypeError, match="not one string"):
        store.lookup("u001")
    with pytest.raises(TypeError):
        store.lookup([b"u001"])
    with pytest.raises(FileNotFoundError):
        open_store(built[0].path.with_name("absent.db"))
    junk = built[0].path.with_name("junk.db")
    junk.write_bytes(b"not a database" * 20)
    with pytest.raises(ValueError, match="not a readable SQLite database"):
        open_store(junk)
    with pytest.raises(ValueError, match="sqlite:///"):
        open_store("sqlite://fs.db")
    with pytest.raises(ValueError, match="unsupported"):
        open_store("mysql://h/db")
    store.close()
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.lookup(ids[:1])


def test_unindexed_user_table_warns(tmp_path):
    db = tmp_path / "flat.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE features (id TEXT, f REAL)")
    con.execute("INSERT INTO features VALUES ('a', 1.0)")
    con.commit()
    con.close()
    with pytest.warns(UserWarning, match="no index"):
        store = open_store(db)
    assert not store.indexed and _same(store.lookup(["a"])[0], [[1.0]])
    store.close()


def test_threads_look_up_at_once(built):
    store, ids, X = built
    errors, barrier = [], threading.Barrier(6)

    def work(seed):
        rng = np.random.default_rng(seed)
        barrier.wait()
        try:
            for _ in range(40):
                k = rng.integers(0, len(ids), size=int(rng.integers(1, 20)))
                got, found = store.lookup([ids[i] for i in k] + ["missing"])
                assert found[:-1].all() and not found[-1] and _same(got[:-1], X[k])
        except Exception as e:  # noqa: BLE001 -- reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store._conns) >= 2  # a connection per thread (those of ended threads closed later)


def test_memory_store_same_answers(built):
    store, ids, X = built
    mem = MemoryFeatureStore(ids, X, COLS)
    ask = [ids[5], "nobody", ids[5], ids[0]]
    assert all(_same(a, b) for a, b in zip(mem.lookup(ask), store.lookup(ask))) and len(mem) == len(ids)
    with pytest.raises(ValueError, match="duplicate ids"):
        MemoryFeatureStore(["a", "a"], np.zeros((2, 1)), ["f"])


def test_postgres_without_psycopg_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now fails, installed or not
    with pytest.raises(ImportError, match="psycopg"):
        open_store("postgresql://bank:secret@db.example/features")
