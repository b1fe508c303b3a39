"""Where batch crypto work runs: the executor interface (the only module that knows).

Batch operations of the crypto layer (Paillier encryption, decryption, ``X^T·[[d]]``, encrypted
histograms, compression, element-wise products) call :func:`run` / :func:`parallel_chunks` /
:func:`run_sharded` here; the party's runtime installs the executor its job file asks for
(``compute: {engine: local|ray|auto}``, see :mod:`secureflhv.runtime.process.party_compute`), the algorithms never
see it. Two implementations:

* :class:`LocalExecutor` (default, embedded): the process pool of
  :mod:`secureflhv.compute.pool`, unchanged; nothing to install or start.
* :class:`secureflhv.compute.ray_executor.RayExecutor`: tasks on the party's own Ray cluster, rows kept
  as shards in the cluster's object store (optional dependency ``ray``).

Executors only ever see this party's own values (its plaintexts, its keys, ciphertexts already
decoded and checked by the transport); nothing of an executor is reachable by a peer.

Long steps report progress (shards done / total, rate, ETA) on the ``secureflhv.compute`` logger and to
the listeners the runtime adds (:func:`add_progress_listener`: the party's progress output).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures.process import BrokenProcessPool

from . import pool as _par

log = logging.getLogger("secureflhv.compute")

PROGRESS_AFTER_S = 5.0   # a step shorter than this logs nothing
PROGRESS_EVERY_S = 10.0  # at most one progress line per step this often


class ComputeError(RuntimeError):
    """Batch work failed where it runs (a lost worker, node or cluster); names the party and the step."""


def step_name(fn) -> str:
    """The step a task function performs, for logs and errors (``task_decrypt`` -> ``decrypt``)."""
    return getattr(fn, "__name__", "batch").removeprefix("_").removeprefix("task_").removesuffix("_task")


_listeners: list = []  # callables(owner, step, engine, done, total, rate, eta): the runtime's progress output


def add_progress_listener(fn) -> None:
    """Also send each progress line to ``fn(owner, step, engine, done, total, rate, eta_s)``."""
    _listeners.append(fn)


def remove_progress_listener(fn) -> None:
    """Stop sending progress lines to ``fn`` (added by :func:`add_progress_listener`); absent: no-op."""
    if fn in _listeners:
        _listeners.remove(fn)


class Progress:
    """Counts finished shards of one step; logs ``done/total``, rate and ETA once the step runs long."""

    def __init__(self, owner: str, step: str, total: int, engine: str):
        self.owner, self.step, self.total, self.engine = owner, step, total, engine
        self.started = self.last = time.monotonic()
        self.done = 0
        self.logged = False

    def advance(self, k: int = 1) -> None:
        """Count ``k`` more finished shards; after ``PROGRESS_AFTER_S`` seconds log (and tell the listeners)
        ``done/total``, the rate in shards/s and the ETA in seconds, at most every ``PROGRESS_EVERY_S`` and at the end.
        """
        self.done += k
        now = time.monotonic()
        if now - self.started >= PROGRESS_AFTER_S and (not self.logged or now - self.last >= PROGRESS_EVERY_S
                                                       or self.done == self.total):
            self.last, self.logged = now, True
            rate = self.done / (now - self.started)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            log.info("%s: %s on %s: %d/%d shards done, %.2f shards/s, ETA %.0fs",
                     self.owner, self.step, self.engine, self.done, self.total, rate, eta)
            for fn in list(_listeners):
                fn(self.owner, self.step, self.engine, self.done, self.total, rate, eta)


class Executor(ABC):
    """Runs a task function over chunks of a batch and returns the results in chunk order.

    Task functions are module-level functions of ``secureflhv.crypto`` that take integers, lists of
    integers and numpy arrays, and return the same kinds (see ``paillier_engine.task_*``).
    """

    name = "executor"
    owner = "party"  # the party id, set by the runtime: errors and progress lines name it
    task_min_batches = 0  # >0: each task gets at least this many break-even batches (see parallel_chunks)

    @abstractmethod
    def workers(self) -> int:
        """How many tasks can run at once (1 = everything inline in this process)."""

    @abstractmethod
    def run(self, fn, common: tuple, chunks: list) -> list:
        """``[fn(*common, *chunk) for chunk in chunks]``, spread over the workers.

        Raises ComputeError (naming ``owner`` and the step) if the work is lost; exceptions raised by
        ``fn`` itself propagate unchanged.
        """

    def run_sharded(self, fn, common: tuple, data: tuple, rows, extra: tuple = (),
                    aligned: tuple = ()) -> list | None:
        """``fn(*common, *[d[rows of shard] for d in data], *[a[part of shard] for a in aligned], *extra)``
        per shard holding some of ``rows``.

        ``data``: row-aligned sequences (lists of ints, numpy arrays) reused across calls, which an
        executor may keep sharded where its workers are; ``rows``: non-decreasing int64 row indices;
        ``aligned``: numpy arrays aligned with ``rows`` (one value per requested row), cut like it.
        Returns the per-shard results (the caller combines them), or None when this executor keeps
        no shards (the caller then chunks the rows itself and calls :meth:`run`).
        """
        return None

    def start(self) -> None:
        """Start the workers in the background, if this executor starts any (the local pool does)."""

    def shutdown(self) -> None:
        """Release workers (they are started again on demand)."""


class LocalExecutor(Executor):
    """The local process pool (:mod:`.pool`): ``SECUREFLHV_WORKERS`` / cpu_count workers."""

    name = "local"

    def workers(self) -> int:
        """The local pool's worker count (:func:`secureflhv.compute.pool.get_workers`)."""
        return _par.get_workers()

    def run(self, fn, common: tuple, chunks: list) -> list:
        """:meth:`Executor.run` on the local process pool, logging progress; if the pool breaks the batch is
        finished inline in this process."""
        try:
            pool = _par._get_pool()
            futures = [pool.submit(fn, *common, *chunk) for chunk in chunks]
            progress = Progress(self.owner, step_name(fn), len(futures), self.name)
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                progress.advance(len(finished))
            return [f.result() for f in futures]
        except BrokenProcessPool:
            log.warning("Paillier worker pool broke; finishing this batch inline")
            _par.shutdown()
            return [fn(*common, *chunk) for chunk in chunks]

    def start(self) -> None:
        """Start the pool's workers in the background."""
        _par.start()

    def shutdown(self) -> None:
        """Stop the pool's workers (restarted on demand)."""
        _par.shutdown()


_lock = threading.Lock()
_local = LocalExecutor()
_current: Executor = _local


def current() -> Executor:
    """The executor batch work runs on now (the local pool unless the runtime installed another)."""
    return _current


def install(executor: Executor | None) -> Executor:
    """Make ``executor`` (None = the local pool) the one batch work runs on; returns the previous one."""
    global _current
    with _lock:
        prev, _current = _current, (executor or _local)
    return prev


@contextlib.contextmanager
def using(executor: Executor | None):
    """Run a block with ``executor`` installed; the previous one is restored (the new one is not shut down)."""
    prev = install(executor)
    try:
        yield executor or _local
    finally:
        install(prev)


def workers() -> int:
    """How many tasks the installed executor runs at once."""
    return _current.workers()


def start() -> None:
    """Start the current executor's workers in the background (see :meth:`Executor.start`)."""
    _current.start()


def parallel_chunks(size: int, min_size: int, per_worker: int = 4) -> int:
    """How many chunks a batch of ``size`` should be cut into on the current executor (1 = run inline).

    ``min_size``: the caller's break-even batch size for the local pool; an executor may lower it
    (``RayExecutor(min_batch=...)``). ``per_worker``: chunks per worker; several balance the load when
    workers run at unequal speeds, one suits work whose cost per item falls with the chunk's size
    (multi-exponentiation, ``X^T·[[d]]``: a bigger chunk takes a wider bucket window).

    An executor with a cost per task (``task_min_batches`` > 0: Ray's scheduling round trip and
    object-store transfers) gets chunks of at least that many break-even batches, but never fewer than
    one per worker (two for a single worker, so that the work still leaves this process), and a multiple
    of the workers.
    """
    ex = _current
    w = ex.workers()
    # a forced local pool of one (the scaling baseline) and a cluster of any size take the work off this process
    pooled = w > 1 or not isinstance(ex, LocalExecutor) or _par.pooled()
    if not pooled or size < (getattr(ex, "min_batch", None) or min_size):
        return 1
    chunks = min(size, max(2, int(per_worker) * w))  # a pool of one still gets the work (1 = inline)
    per_task = ex.task_min_batches * min_size  # 0 for the local pool
    if per_task:
        chunks = min(chunks, max(w, 2, int(size // per_task)))
        if chunks > w:  # whole rounds: 5 chunks on 2 workers would leave one idle for the last
            chunks -= chunks % w
    return chunks


def run(fn, common: tuple, chunks: list) -> list:
    """``[fn(*common, *chunk) for chunk in chunks]`` on the current executor (see :meth:`Executor.run`)."""
    return _current.run(fn, common, chunks)


def run_sharded(fn, common: tuple, data: tuple, rows, extra: tuple = (), aligned: tuple = ()) -> list | None:
    """See :meth:`Executor.run_sharded` (None on executors without shards)."""
    return _current.run_sharded(fn, common, data, rows, extra, aligned)
