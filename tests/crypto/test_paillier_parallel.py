"""The Paillier process pool: pooled results equal the inline ones, per-worker warm-up, a dying worker.

Small (test-only) keys; each pool is started once per test (forkserver start-up is ~0.5 s).
"""
import os
import time
from concurrent.futures.process import BrokenProcessPool

import gmpy2
import numpy as np
import pytest

from secureflhv.compute import executor as ex
from secureflhv.crypto.homomorphic import paillier as P
from secureflhv.crypto.homomorphic import paillier_engine as E
from secureflhv.compute import pool as par


@pytest.fixture(scope="module")
def keys():
    P.set_workers(1)
    pk, sk = P.generate_keypair(512, insecure_test_key=True)
    yield pk, sk
    P.set_workers(None)


def _tables_state(n, pq):
    """(pid, public table is the large one, private tables are the large ones) inside a worker."""
    pub, priv = E.public_engine(n), E.private_engine(*pq)
    priv_large = all(t is not None for t in priv._tables) and all(priv._large)
    return os.getpid(), pub._table is not None and pub._large, priv_large


def _die_in_worker(parent_pid, x):
    """Kills the worker process it runs in (a crash); in the parent it just computes."""
    if os.getpid() != parent_pid:
        os._exit(3)
    return [v * 2 for v in x]


def _batch_ops(pk, sk, rng):
    x = rng.normal(size=700)
    X = rng.normal(size=(700, 3))
    k = rng.integers(-(2 ** 40), 2 ** 40, size=700)
    e = P.encrypt(pk, x)
    return x, X, k, e


@pytest.mark.parametrize("workers", [1, 2])
def test_pooled_paths_equal_inline(keys, workers):
    """A pool of 1 (the scaling baseline) and of 2 give exactly the inline results."""
    pk, sk = keys
    x, X, k, e = _batch_ops(pk, sk, np.random.default_rng(7))
    inline = (P.decrypt(sk, e), (e * k)._c.tolist(), P.dot(X, e)._c.tolist())
    try:
        P.set_workers(workers, pool_for_one=True)
        assert ex.parallel_chunks(700, 256) == 4 * workers  # really through the pool
        assert ex.parallel_chunks(700, 256, per_worker=1) == max(2, workers)  # a pool of one too (1 = inline)
        pooled = (P.decrypt(sk, e), (e * k)._c.tolist(), P.dot(X, e)._c.tolist())
        enc_pub, enc_crt = P.encrypt(pk, x), P.encrypt(sk, x)
    finally:
        P.set_workers(1)
    np.testing.assert_array_equal(pooled[0], inline[0])
    assert pooled[1] == inline[1] and pooled[2] == inline[2]  # deterministic: identical ciphertexts
    np.testing.assert_array_equal(P.decrypt(sk, enc_pub), inline[0])  # randomised: same plaintexts
    np.testing.assert_array_equal(P.decrypt(sk, enc_crt), inline[0])
    assert ex.parallel_chunks(700, 256) == 1  # one worker without the flag: inline again


def test_dot_by_row_blocks_equals_inline(keys):
    """One column and 2 workers: the rows are cut into blocks, each task gets its block's ciphertexts
    as a byte string (paillier_engine.to_blob); the result is the inline one, ciphertext for ciphertext."""
    pk, sk = keys
    rng = np.random.default_rng(8)
    e, v = P.encrypt(pk, rng.normal(size=2400)), rng.normal(size=2400)
    inline = P.dot(v, e)._c.tolist()
    try:
        P.set_workers(2, pool_for_one=True)
        assert ex.parallel_chunks(v.size, P.PAR_DOT_MIN, per_worker=1) == 2  # really through the pool
        pooled = P.dot(v, e)._c.tolist()
    finally:
        P.set_workers(1)
    assert pooled == inline


def test_warm_builds_the_large_tables_in_every_worker(keys):
    pk, sk = keys
    try:
        P.set_workers(2)
        seconds = E.warm(pk.n, (sk.p, sk.q))
        states = par.on_each_worker(_tables_state, int(pk.n), (int(sk.p), int(sk.q)))
        cpu = par.worker_cpu_seconds()
    finally:
        P.set_workers(1)
    assert seconds > 0
    assert len({pid for pid, _, _ in states}) == 2 and os.getpid() not in {pid for pid, _, _ in states}
    assert all(pub and priv for _, pub, priv in states)
    assert cpu > 0


def test_start_brings_every_worker_up_with_the_task_modules_preloaded():
    """start() returns at once and starts every worker in the background, forked from a forkserver that
    already imported the task modules; once the pool runs, start() has nothing to do."""
    try:
        P.set_workers(2)
        assert par.current_pool() is None
        assert par.start() == 0.0
        states = par.on_each_worker(par._started)  # waits for the background call (one call at a time)
        assert par.start(wait=True) == 0.0
    finally:
        P.set_workers(1)
    pids = {pid for pid, _ in states}
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(preloaded for _, preloaded in states)


def test_encryption_tells_each_worker_its_share_of_the_batch(keys, monkeypatch):
    """The pooled encryption tasks get the batch's share per worker (which sizes their tables): the
    public key's by rows; the key holder's too where the pool cannot go by CRT half (here: forced)."""
    pk, sk = keys
    real, seen = ex.run, []
    def spy(fn, common, chunks):
        seen.append((common[-1], chunks))
        return real(fn, common, chunks)

    monkeypatch.setattr(ex, "run", spy)
    monkeypatch.setattr(P, "_by_crt_half", lambda: False)
    x = np.linspace(-1, 1, 1001)
    try:
        P.set_workers(2)
        enc = [P.encrypt(pk, x), P.encrypt(sk, x)]
    finally:
        P.set_workers(1)
    assert [share for share, _ in seen] == [501, 501]  # ceil(1001 / 2)
    assert all(sum(len(c[0]) for c in chunks) == 1001 and len(chunks) > 2 for _, chunks in seen)
    for e in enc:
        np.testing.assert_allclose(P.decrypt(sk, e), x, atol=1e-12)


def _half_tables(p, q):
    """(worker index, which CRT halves' tables this worker holds) inside a worker."""
    return par.worker_index(), [t is not None for t in E.private_engine(p, q)._tables]


def test_key_holder_batches_go_one_crt_half_per_worker(keys, monkeypatch):
    """On a pool of 2 the key holder's batch is split by CRT half: worker 0 holds only the mod p^2
    table, worker 1 only the mod q^2 one, no task goes by rows, and the ciphertexts decrypt."""
    pk, sk = keys
    monkeypatch.setattr(ex, "run", lambda *a: pytest.fail("the key holder's batch went by rows"))
    x = np.linspace(-3, 3, 999)
    try:
        P.set_workers(2)
        enc = P.encrypt(sk, x)
        states = dict(par.on_each_worker(_half_tables, int(sk.p), int(sk.q)))
    finally:
        P.set_workers(1)
    assert states == {0: [True, False], 1: [False, True]}
    np.testing.assert_allclose(P.decrypt(sk, enc), x, atol=1e-12)
    assert len(set(enc._c.tolist())) == len(x)  # fresh exponents per row


def _fail_on_worker_0():
    if par.worker_index() == 0:
        raise ValueError("worker 0 fails")
    return par.worker_index()


def test_a_call_failing_on_one_worker_raises_at_once_and_the_pool_goes_on():
    """The failing worker still arrives at the barrier: the others do not wait out its timeout."""
    try:
        P.set_workers(2)
        par.start(wait=True)
        t0 = time.monotonic()
        with pytest.raises(ValueError, match="worker 0 fails"):
            par.on_each_worker(_fail_on_worker_0)
        assert time.monotonic() - t0 < 10 < par.BARRIER_TIMEOUT_S
        pids = {pid for pid, _ in par.on_each_worker(par._started)}  # the same pool serves the next call
    finally:
        P.set_workers(1)
    assert len(pids) == 2


def _large_half_table_on_worker_0(p, q):
    if par.worker_index() == 0:
        E.private_engine(p, q).table(0, True)


def test_crt_halves_with_tables_of_different_windows_are_discarded(keys, caplog):
    """Worker 0 holds a large table for its half, worker 1 a small one: their exponents' digits would
    differ, so the batch is encrypted by rows instead (and decrypts)."""
    pk, sk = keys
    x = np.linspace(-2, 2, 700)
    try:
        P.set_workers(2)
        par.on_each_worker(_large_half_table_on_worker_0, int(sk.p), int(sk.q))
        with caplog.at_level("WARNING", logger="secureflhv.crypto.homomorphic.paillier"):
            enc = P.encrypt(sk, x)
    finally:
        P.set_workers(1)
    assert "tables differ; encrypting by rows" in caplog.text
    np.testing.assert_allclose(P.decrypt(sk, enc), x, atol=1e-12)


def test_crt_halves_from_one_seed_combine_to_the_djn_ciphertext(keys):
    """Identity on a real key: halves computed apart (each with only its own table) from the same
    seeded exponents combine to (1 + m n) h_s^alpha mod n^2 with alpha rebuilt from the digits."""
    pk, sk = keys
    ms = [0, 1, -7, 2 ** 60, pk.n - 3]
    engines = [E.PrivateEngine(sk.p, sk.q) for _ in range(2)]  # two "workers"
    w = engines[0].table(0, False).w
    n_digits = engines[0].table(0, False).n_digits
    cols = E.seeded_digits(b"s" * 32, n_digits, len(ms), w)
    assert cols == E.seeded_digits(b"s" * 32, n_digits, len(ms), w) != E.seeded_digits(b"t" * 32, n_digits, len(ms), w)
    halves = [engines[h].encrypt_half(h, ms, cols, False) for h in (0, 1)]
    assert engines[0]._tables[1] is None and engines[1]._tables[0] is None
    cts = engines[0].combine(*halves)
    n, n2 = int(pk.n), int(pk.n) ** 2
    hs = E.public_engine(n).h_s
    for m, c, digits in zip(ms, cts, zip(*cols)):
        alpha = sum(d << (w * i) for i, d in enumerate(digits))
        assert c == (1 + m * n) * gmpy2.powmod(hs, alpha, n2) % n2
    assert [int(v) for v in engines[1].decrypt(cts)] == [m % n for m in ms]


def test_a_dying_worker_does_not_hang_the_batch():
    """A worker killed mid-batch: the batch finishes inline (as before), and the next pool works."""
    try:
        P.set_workers(2)
        chunks = [([i, i + 1],) for i in range(0, 8, 2)]
        assert ex.run(_die_in_worker, (os.getpid(),), chunks) == [[2 * i, 2 * i + 2] for i in range(0, 8, 2)]
        with pytest.raises(BrokenProcessPool):  # never a hang
            par.on_each_worker(_die_in_worker, os.getpid(), [1])
        assert len(set(par.on_each_worker(os.getpid))) == 2  # a fresh pool starts on demand
    finally:
        P.set_workers(1)


def test_a_call_cut_off_while_submitting_frees_its_workers(monkeypatch):
    """Submission failing part-way (as at interpreter shutdown, when a fast party exits while the pool is
    still starting in the background): the call raises at once, the worker that took a task is not left
    waiting at the barrier, and the next call gets one task per worker within seconds (before: the stale
    worker held the barrier, and the next call, or the pool's shutdown at exit, waited 120 s)."""
    import threading

    try:
        P.set_workers(2)
        pool = par._get_pool()
        real, calls = pool.submit, []

        def submit_then_shutdown(*a, **kw):
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("cannot schedule new futures after interpreter shutdown")
            return real(*a, **kw)

        monkeypatch.setattr(pool, "submit", submit_then_shutdown)
        with pytest.raises(RuntimeError, match="interpreter shutdown"):
            par.on_each_worker(os.getpid)
        out = []
        t = threading.Thread(target=lambda: out.append(par.on_each_worker(os.getpid)), daemon=True)
        t.start()
        t.join(20)
        assert out and len(set(out[0])) == 2, "the next call waited on a stale barrier"
    finally:
        P.set_workers(1)
