"""Check the PostgreSQL feature store against a throwaway local cluster (needs psycopg 3 and PostgreSQL's
binaries; not part of the test suite, which has neither):

    python tools/check_postgres_store.py

Prints "ok" or fails with the assertion. As root, the cluster runs as the 'postgres' user.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from secureflhv.runtime.serve.feature_store import open_store  # noqa: E402


def _same(a, b) -> bool:
    return np.array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), equal_nan=True)


def _as_postgres_user(tmp_path):
    """(command prefix, a folder the server may write): PostgreSQL refuses to run as root, so as root the
    cluster runs as the 'postgres' user in a folder it owns."""
    if os.geteuid() != 0:
        return [], tmp_path
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        raise SystemExit("root without a 'postgres' user")
    folder = Path(tempfile.mkdtemp(prefix="fs-pg-"))
    os.chown(folder, pw.pw_uid, pw.pw_gid)
    return ["runuser", "-u", "postgres", "--"], folder


def check_postgres_live(tmp_path):
    """The same answers from a throwaway PostgreSQL cluster (needs psycopg and PostgreSQL's binaries)."""
    import psycopg
    run_as, folder = _as_postgres_user(tmp_path)
    data = folder / "pg"
    subprocess.run([*run_as, "initdb", "-D", str(data), "-A", "trust", "-U", "postgres"], check=True,
                   capture_output=True, timeout=120)
    # The server's output goes to a log file: a server holding a captured pipe open would block run().
    subprocess.run([*run_as, "pg_ctl", "-D", str(data), "-l", str(folder / "pg.log"), "-w", "-t", "30", "-o",
                    f"-k {folder} -c listen_addresses='' -p 54329", "start"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    url = f"postgresql://postgres:pw@/postgres?host={folder}&port=54329"
    try:
        with psycopg.connect(url, autocommit=True) as con:
            con.execute('CREATE TABLE "my""t" (extra text, "a""b" double precision, cid bigint PRIMARY KEY, '
                        "age integer)")
            con.execute("INSERT INTO \"my\"\"t\" VALUES ('x', 1.5, 42, 30), (NULL, NULL, 7, 41)")
            con.execute("CREATE TABLE u (id varchar(3) PRIMARY KEY, f real)")
            con.execute("INSERT INTO u VALUES ('abc', 2.5)")
        with open_store(url, table='my"t', id_column="cid", columns=["age", 'a"b']) as store:
            assert "pw" not in repr(store)
            got, found = store.lookup(["7", "nobody", "42", "7"])
            assert found.tolist() == [True, False, True, True] and len(store) == 2
            assert _same(got, [[41, np.nan], [np.nan, np.nan], [30, 1.5], [41, np.nan]])
            assert store.lookup([])[0].shape == (0, 2)
            try:
                store._conn().execute('DELETE FROM "my""t"')
                raise AssertionError("the store's session is not read-only")
            except psycopg.errors.ReadOnlySqlTransaction:
                pass
        with open_store(url, table="u") as store:  # a longer id must not match after a varchar(3) cast
            assert store.lookup(["abcd", "abc"])[1].tolist() == [False, True]
        try:
            open_store(url, table='my"t', id_column="cid", columns=["zip"])
            raise AssertionError("a missing column was not refused")
        except ValueError as exc:
            assert "missing feature columns ['zip']" in str(exc), exc
    finally:
        subprocess.run([*run_as, "pg_ctl", "-D", str(data), "-m", "immediate", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        if folder != tmp_path:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
        raise SystemExit("PostgreSQL's initdb / pg_ctl are not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        check_postgres_live(Path(tmp))
    print("ok")
