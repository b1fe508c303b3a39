"""Process pool for batch Paillier work (one job: spread big integer batches over the cores).

The pool is created lazily on first use and reused.  Worker count: :func:`set_workers`, else the
``SECUREFLHV_WORKERS`` environment variable, else ``os.cpu_count()``.  With one worker everything
runs inline.  Workers are started with the ``forkserver`` method (safe in processes that already
run gRPC threads) and receive only integers and numpy integer arrays of our own making; per-key
tables are rebuilt and cached inside each worker (see ``paillier_engine.task_*``).
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

log = logging.getLogger(__name__)

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_workers: int | None = None


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


def set_workers(n: int | None) -> None:
    """Set the worker count (None = back to env/cpu_count); an existing pool of another size is closed."""
    global _workers
    if n is not None and int(n) < 1:
        raise ValueError("workers must be >= 1")
    with _lock:
        _workers = None if n is None else int(n)
        _shutdown_locked()


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


def _get_pool() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
            _pool = ProcessPoolExecutor(max_workers=get_workers(), mp_context=mp.get_context(method))
        return _pool


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


def parallel_chunks(size: int, min_size: int) -> int:
    """How many chunks a batch of ``size`` should be cut into (1 = run inline)."""
    w = get_workers()
    if w <= 1 or size < min_size:
        return 1
    return min(size, 4 * w)
