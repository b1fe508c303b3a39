"""Process pool for batch Paillier work (one job: spread big integer batches over the cores).

The pool is created lazily on first use and reused.  Worker count: :func:`set_workers`, else the
``SECUREFLHV_WORKERS`` environment variable, else ``os.cpu_count()``.  With one worker everything
runs inline (unless ``set_workers(1, pool_for_one=True)``: a pool of one process, the baseline a
scaling measurement needs).  Workers are started with the ``forkserver`` method (safe in processes
that already run gRPC threads) and receive only integers and numpy integer arrays of our own making;
per-key tables are rebuilt and cached inside each worker (see ``paillier_engine.task_*``) at first
use, or ahead of time with :func:`warm` (one call runs on every worker).  :func:`start` starts the
workers in the background, so that a job's first batch does not wait for them: the forkserver
preloads the task modules (``PRELOAD``), so each worker starts without importing numpy and gmpy2.
The forkserver and the workers die with the party process, however it ends (:mod:`.lifeline`).
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from . import lifeline

log = logging.getLogger(__name__)

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_workers: int | None = None
_pool_for_one = False
_barrier = None  # shared by the current pool's workers: on_each_worker() puts one call on each
_worker_barrier = None  # inside a worker: the barrier it was started with
_worker_index = None  # inside a worker: see worker_index()
_each_lock = threading.Lock()  # one on_each_worker call at a time
# The modules whose task functions workers run: imported once in the forkserver, which every worker
# is forked from (~0.17 s of imports a worker would otherwise pay in its first task). pool_forkserver
# first: the forkserver then dies with the party (see lifeline) and its workers with it.
PRELOAD = ["secureflhv.compute.pool_forkserver", "secureflhv.crypto.homomorphic.paillier", "secureflhv.crypto.homomorphic.paillier_hist"]


def get_workers() -> int:
    """Number of worker processes batch operations use (1 = inline)."""
    if _workers is not None:
        return _workers
    env = os.environ.get("SECUREFLHV_WORKERS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"SECUREFLHV_WORKERS must be an integer, got {env!r}") from None
    return max(1, os.cpu_count() or 1)


def set_workers(n: int | None, *, pool_for_one: bool = False) -> None:
    """Set the worker count (None = back to env/cpu_count); an existing pool is closed.

    ``pool_for_one``: with one worker, still run batches in a (one-process) pool rather than inline,
    so that a 1-worker baseline runs the same code path as N workers.
    """
    global _workers, _pool_for_one
    if n is not None and int(n) < 1:
        raise ValueError("workers must be >= 1")
    with _lock:
        _workers = None if n is None else int(n)
        _pool_for_one = bool(pool_for_one)
        _shutdown_locked()


def pooled() -> bool:
    """Whether batches go to the pool (more than one worker, or a forced pool of one)."""
    return get_workers() > 1 or _pool_for_one


def current_pool() -> ProcessPoolExecutor | None:
    """The running pool, or None when none is started (nothing is started here)."""
    return _pool


def _shutdown_locked() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)
        _pool = None


def shutdown() -> None:
    """Stop the worker processes (they are restarted lazily if needed again)."""
    with _lock:
        _shutdown_locked()


atexit.register(shutdown)


def _init_worker(barrier, counter, party_pid) -> None:
    global _worker_barrier, _worker_index
    forkserver = sys.modules.get("secureflhv.compute.pool_forkserver")
    if forkserver is not None and forkserver.FORKSERVER_PID:  # forked by the forkserver's one thread
        lifeline.die_with_parent(forkserver.FORKSERVER_PID)
    else:  # spawned by one of the party's threads, which may end before the party
        lifeline.die_with_parent(party_pid, pdeathsig=False)
    _worker_barrier = barrier
    with counter.get_lock():
        _worker_index, counter.value = counter.value, counter.value + 1


def worker_index() -> int | None:
    """This worker's index in its pool (0 .. workers-1 in start order, fixed for the worker's life);
    None outside a pool worker. With :func:`on_each_worker` it gives each worker a fixed share of a
    job (``paillier.encrypt`` with the private key: one CRT half per worker)."""
    return _worker_index


def mp_context():
    """The multiprocessing context of this package's child processes: ``forkserver`` (safe in a
    process that already runs gRPC threads) preloading ``PRELOAD``, else ``spawn``."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    if os.environ.get(lifeline.PARENT_ENV) != str(os.getpid()):  # read by pool_forkserver in the forkserver
        os.environ[lifeline.PARENT_ENV] = str(os.getpid())
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # takes effect when the forkserver first starts
    return ctx


def _get_pool() -> ProcessPoolExecutor:
    global _pool, _barrier
    with _lock:
        if _pool is None:
            ctx = mp_context()
            w = get_workers()
            _barrier = ctx.Barrier(w)
            _pool = ProcessPoolExecutor(max_workers=w, mp_context=ctx, initializer=_init_worker,
                                        initargs=(_barrier, ctx.Value("i", 0), os.getpid()))
        return _pool


BARRIER_TIMEOUT_S = 120.0  # on_each_worker: a worker that never arrives (dead, stuck) breaks the call


def _on_worker(fn, args):
    try:
        return fn(*args)
    finally:
        # hold this worker until every worker has taken one call; also when fn raised, so that the
        # others do not wait out the timeout for a worker that would never come
        _worker_barrier.wait(BARRIER_TIMEOUT_S)


def on_each_worker(fn, *args) -> list:
    """``fn(*args)`` once in every worker process of the pool (started if needed); their results.

    For per-process state: building a key's tables before a timed phase (:func:`warm`), reading the
    workers' CPU time (:func:`worker_cpu_seconds`); and for work with a fixed share per worker
    (:func:`worker_index`: the key holder's encryption by CRT half).  Raises BrokenProcessPool /
    BrokenBarrierError if a worker dies or does not arrive within ``BARRIER_TIMEOUT_S``.  One such call
    at a time (two at once could put both of one call's tasks on the same worker, so calls wait for
    each other); batches may run beside it.
    """
    with _each_lock:
        pool, barrier = _get_pool(), _barrier
        futures = []
        try:
            futures += [pool.submit(_on_worker, fn, args) for _ in range(get_workers())]
        except BaseException:
            # Submission stopped part-way (the interpreter is shutting down, the pool was shut down, or a
            # worker could not be spawned: OSError / EOFError from the forkserver): the workers that took
            # a call would wait at the barrier for calls that never come, and the pool's shutdown (or
            # concurrent.futures' join at exit) would wait BARRIER_TIMEOUT_S for them. Break the barrier.
            barrier.abort()
            shutdown()  # the next call starts a fresh pool, with a fresh barrier
            raise
        try:
            return [f.result() for f in futures]
        except BrokenProcessPool:
            shutdown()  # the next call starts a fresh pool
            raise


def _started() -> tuple[int, bool]:
    """(this worker's pid, whether the task modules were already imported when it started)."""
    return os.getpid(), all(m in sys.modules for m in PRELOAD)


def start(wait: bool = False) -> float:
    """Start the worker processes now; returns the seconds waited (0.0 unless ``wait``).

    A party calls this when its job starts (:func:`secureflhv.runtime.process.party_compute.party_executor`) and
    before generating a key (``he.PaillierHE.generate_keypair``), so that the workers start while it
    does other work instead of in its first batch. Without ``wait`` it returns at once and a
    background thread waits for every worker (a failure there is logged; the next batch starts a
    fresh pool). Nothing to do with one inline worker or a pool already started. The background start
    holds no worker at a barrier, so a process that ends while it runs exits once the workers are up.
    """
    if not pooled() or _pool is not None:
        return 0.0
    t0 = time.perf_counter()
    if wait:
        on_each_worker(_started)
        return time.perf_counter() - t0

    def background():
        # Plain tasks, not on_each_worker: this thread may still be submitting when the party exits, and
        # a worker held at the barrier for a partner whose spawn failed kept the exit (concurrent.futures
        # joins the pool at exit) waiting BARRIER_TIMEOUT_S. One task per worker still spawns every worker.
        pool = None
        try:
            pool = _get_pool()
            for f in [pool.submit(_started) for _ in range(get_workers())]:
                f.result()
        except Exception as exc:  # noqa: BLE001 - the pool is restarted by the next batch
            stopped = pool is not None and pool is not _pool  # shut down meanwhile (the job ended): expected
            log.log(logging.DEBUG if stopped else logging.WARNING, "starting the Paillier worker pool failed: %s",
                    exc or type(exc).__name__)

    threading.Thread(target=background, name="secureflhv-pool-start", daemon=True).start()
    return 0.0


def _cpu_task() -> float:
    return time.process_time()


def worker_cpu_seconds() -> float:
    """CPU seconds (user + system) the pool's workers have used so far, summed over workers."""
    return sum(on_each_worker(_cpu_task))


def split(seq, parts: int) -> list:
    """Split a sequence into ``parts`` contiguous near-equal chunks (no empty chunks)."""
    n = len(seq)
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [seq[bounds[i]:bounds[i + 1]] for i in range(parts)]


def run(fn, common: tuple, chunks: list) -> list:
    """Run ``fn(*common, *chunk)`` for every chunk tuple in the pool; results in chunk order.

    Falls back to inline execution (with a warning) if the pool is broken.
    """
    try:
        pool = _get_pool()
        futures = [pool.submit(fn, *common, *chunk) for chunk in chunks]
        return [f.result() for f in futures]
    except BrokenProcessPool:
        log.warning("Paillier worker pool broke; finishing this batch inline")
        shutdown()
        return [fn(*common, *chunk) for chunk in chunks]


def parallel_chunks(size: int, min_size: int, per_worker: int = 4) -> int:
    """How many chunks a batch of ``size`` should be cut into (1 = run inline); see executor.parallel_chunks."""
    if not pooled() or size < min_size:
        return 1
    return min(size, max(1, int(per_worker)) * get_workers())
