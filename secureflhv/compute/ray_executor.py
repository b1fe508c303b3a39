"""Batch crypto work on the party's own Ray cluster (optional dependency: ``pip install secureflhv[ray]``).

:class:`RayExecutor` implements :class:`secureflhv.compute.executor.Executor` with Ray tasks
(https://docs.ray.io). The party process is a Ray driver: it connects to its organisation's cluster,
splits its rows into shards held in the cluster's object store, and runs encryption, decryption,
``X^T·[[d]]`` and per-shard encrypted histograms as tasks where the shards lie; only aggregated
results (e.g. one histogram per shard, multiplied together here) come back to it.

Placement. Each shard is assigned a node, in proportion to the nodes' task slots (shard i on the i-th
slot, slots interleaved across nodes), and its tasks are pinned there (soft affinity: if the node is
gone they run elsewhere). The node pulls its shard on the first task and keeps the copy in its object
store for the later steps (Ray may evict such a secondary copy under memory pressure and pull it again).
Left to Ray's locality scheduling, short steps ran 3:1 or 4:0 on the driver's node, where ``ray.put``
leaves every shard. (Putting each shard on its node through a task was tried: Ray then pins the
argument's copy on the driver's node for lineage, twice the memory.)

Trust. Ray is internal to one organisation: the cluster is reached only by this party's process,
never by a peer, and nothing about it (address, nodes, shards) is sent to another party. Between the
party and its workers, big integers travel as fixed-width big-endian byte matrices (numpy ``uint8``,
see :func:`encode`), so ciphertexts that came from a peer are never pickled as Python objects; Ray
itself serialises only our task functions and numpy arrays.

Failures. Tasks are retried by Ray when a worker or node dies (``max_retries``); work that is still
lost, or a step that outlasts ``task_timeout_s``, raises :class:`~secureflhv.compute.executor.ComputeError`
naming the party and the step, never a hang. When the whole cluster goes (its head stops answering
for ``CLUSTER_LOST_S`` while a step waits) the step raises a ComputeError that says so and what to do,
well before Ray's own reaction (it ends the driver process after 60 s without its GCS, with no word about
the job); the party then tells its peers through the job's usual failure path.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

import numpy as np
from gmpy2 import mpz

from .executor import ComputeError, Executor, Progress, step_name

log = logging.getLogger("secureflhv.compute")

INLINE_COMMON_BYTES = 64 << 10  # shared task arguments up to this size travel inside each task
_SHARD_CACHE = 4  # row-aligned arrays kept sharded in the object store (features, this tree's ciphertexts)
CLUSTER_LOST_S = 10.0  # the head unreachable this long while a step waits: the cluster is gone (Ray itself
#                        ends the driver process after 60 s without its GCS, with no word about the job)
PROBE_TIMEOUT_S = 2.0
POLL_S = 1.0  # how often a waiting step looks at its finished tasks (progress, errors, the cluster's head)


def tcp_answers(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool | None:
    """Whether ``host:port`` (or ``ray://host:port``, a Ray cluster's address) accepts a TCP connection
    within ``timeout`` seconds; None when ``address`` is not of that form."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def _head_answers(address: str | None, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the cluster's head (``host:port`` of its GCS) accepts a TCP connection (True if unknown)."""
    return not address or tcp_answers(address, timeout) is not False


# ---------------------------------------------------------------------------------------- encoding
class IntBlock:
    """A list of Python/gmpy2 integers (None allowed) as numpy arrays: magnitudes (m, width) uint8, signs, presence."""

    __slots__ = ("mag", "neg", "present")

    def __init__(self, values: list):
        present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
        ints = [int(v) if v is not None else 0 for v in values]
        width = max(1, (max((abs(v).bit_length() for v in ints), default=0) + 7) // 8)
        self.neg = np.fromiter((v < 0 for v in ints), dtype=bool, count=len(ints))
        self.mag = np.frombuffer(b"".join(abs(v).to_bytes(width, "big") for v in ints),
                                 dtype=np.uint8).reshape(len(ints), width)
        self.present = None if present.all() else present

    def __getstate__(self):
        return self.mag, self.neg, self.present

    def __setstate__(self, state):
        self.mag, self.neg, self.present = state

    def __len__(self) -> int:
        return len(self.mag)

    def take(self, idx: np.ndarray) -> "IntBlock":
        """The block's entries at ``idx`` (int array), as a new IntBlock (no integers decoded)."""
        out = IntBlock.__new__(IntBlock)
        out.mag, out.neg = self.mag[idx], self.neg[idx]
        out.present = None if self.present is None else self.present[idx]
        return out

    def values(self) -> list:
        """The integers back as a list of mpz (None where absent), in order."""
        raw, w = self.mag.tobytes(), self.mag.shape[1]
        out = [mpz(int.from_bytes(raw[i * w:(i + 1) * w], "big")) for i in range(len(self.mag))]
        for i in np.flatnonzero(self.neg).tolist():
            out[i] = -out[i]
        if self.present is not None:
            for i in np.flatnonzero(~self.present).tolist():
                out[i] = None
        return out


def _is_int_list(x) -> bool:
    return isinstance(x, list) and len(x) > 0 and all(
        v is None or isinstance(v, (int, type(mpz(0)))) for v in x) and any(v is not None for v in x)


def encode(x):
    """Integers lists -> IntBlock, recursively through lists/tuples; numpy arrays and scalars unchanged."""
    if _is_int_list(x):
        return IntBlock(x)
    if isinstance(x, (list, tuple)):
        return type(x)(encode(v) for v in x)
    if isinstance(x, type(mpz(0))):
        return int(x)
    return x


def decode(x):
    """Inverse of :func:`encode` (integers come back as gmpy2 mpz)."""
    if isinstance(x, IntBlock):
        return x.values()
    if isinstance(x, (list, tuple)):
        return type(x)(decode(v) for v in x)
    return x


def _nbytes(x) -> int:
    """Approximate encoded size of what :func:`encode` returned (numpy buffers and big integers)."""
    if isinstance(x, IntBlock):
        return x.mag.nbytes
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return (x.bit_length() + 7) // 8 if isinstance(x, int) else 64


def _call(fn, common, args):
    """What a Ray worker runs: decode our arrays, call the crypto task, encode the result."""
    return encode(fn(*decode(common), *decode(args)))


def _call_shard(fn, common, local_rows, extra, aligned, *shard_parts):
    # shards are top-level arguments: Ray resolves them and schedules the task next to them
    parts = [p.take(local_rows) if isinstance(p, IntBlock) else p[local_rows] for p in shard_parts]
    return encode(fn(*decode(common), *decode(parts), *aligned, *decode(extra)))


# ---------------------------------------------------------------------------------------- executor
class RayExecutor(Executor):
    """Executor on a Ray cluster.

    Args:
        address: the cluster (``host:port`` of the head's GCS, ``ray://host:10001`` for Ray Client, or
            None for ``RAY_ADDRESS``).
        owner: the party id (named in progress lines and errors).
        shards_per_worker: object-store shards per cluster CPU for row-aligned data.
        min_batch: batches below this size run inline in the party process (None: the local pool's
            break-even sizes).
        task_cpus: CPUs Ray reserves per task (the parallelism is cluster CPUs / task_cpus).
        max_retries: Ray retries of a task whose worker or node died.
        task_timeout_s: a step that has not finished after this raises ComputeError.
        ship_code: upload this ``secureflhv`` package to the workers (``runtime_env.py_modules``);
            False when the cluster's image already has the same version installed.
        cluster_lost_s: a waiting step whose cluster head has not answered for this long raises
            ComputeError (the whole cluster is gone).
    Raises:
        ComputeError: ``ray`` is not installed or the cluster cannot be reached.
    """

    name = "ray"
    # A task costs a scheduling round trip and object-store transfers (milliseconds on a loaded node):
    # chunks of at least two break-even batches (LR's 1,024-row batches: one task per worker, not four).
    task_min_batches = 2

    def __init__(self, address: str | None = None, *, owner: str = "party", shards_per_worker: int = 1,
                 min_batch: int | None = None, task_cpus: float = 1.0, max_retries: int = 3, task_timeout_s: float = 3600.0,
                 ship_code: bool = True, cluster_lost_s: float = CLUSTER_LOST_S):
        try:
            import ray
        except ImportError:
            raise ComputeError(f"{owner}: compute.engine is ray but the 'ray' package is not installed "
                               "(pip install 'secureflhv[ray]')") from None
        self._ray, self.owner, self.address = ray, owner, address or os.environ.get("RAY_ADDRESS")
        self.shards_per_worker, self.min_batch = max(1, int(shards_per_worker)), min_batch
        self.max_retries, self.task_timeout_s = int(max_retries), float(task_timeout_s)
        pkg = Path(__file__).resolve().parents[1]
        runtime_env = {"py_modules": [str(pkg)]} if ship_code else None
        self.lost, self.cluster_lost_s = False, float(cluster_lost_s)  # lost: the whole cluster went mid-step
        try:
            if not ray.is_initialized():
                ray.init(address=self.address, namespace="secureflhv", runtime_env=runtime_env,
                         log_to_driver=False, configure_logging=False, include_dashboard=False)
            self._cpus = max(1, int(ray.cluster_resources().get("CPU", 1) / task_cpus))
            self._head = self.address  # probed while a step waits; else the GCS the driver found
            if not self._head or self._head == "auto":
                try:
                    self._head = ray.get_runtime_context().gcs_address
                except Exception:  # noqa: BLE001 - nothing to probe: cluster loss is then left to Ray
                    self._head = None
        except Exception as exc:  # noqa: BLE001 - any connection failure is reported the same way
            # the address and Ray's words stay in this party's log: the error's text also reaches the peers
            log.error("%s: cannot connect to the Ray cluster at %r: %s", owner, self.address, exc)
            raise ComputeError(f"{owner}: cannot connect to its Ray cluster (details in this party's log)") from None
        opts = {"max_retries": self.max_retries, "retry_exceptions": False, "num_cpus": task_cpus}
        # run()'s chunks carry their data inline: SPREAD deals them out over the nodes. Under the default policy
        # the driver keeps reusing its first worker lease, so a step's short tasks ran one after another on the
        # head node (measured: 7 of 8 encryption tasks of an 8,192-row LR batch on one of two nodes)
        self._task = ray.remote(scheduling_strategy="SPREAD", **opts)(_call)
        self._shard_task = ray.remote(**opts)(_call_shard)
        self.task_cpus = task_cpus
        self._shards: list = []  # [(obj, bounds, [ObjectRef per shard], [node id per shard])], most recent last
        self.tasks: dict[str, int] = {}  # tasks sent per step, logged at shutdown
        log.info("%s: batch work on Ray cluster %s (%d task slots, %d nodes)", owner, self.address or "(local)",
                 self._cpus, len([n for n in ray.nodes() if n.get("Alive")]))

    def workers(self) -> int:
        """Tasks the cluster runs at once: its CPUs (read when the executor connected) / ``task_cpus``."""
        return self._cpus

    # -------------------------------------------------------------------------------------- running
    def _gather(self, refs: list, step: str) -> list:
        """Results of ``refs`` in order; progress logged; ComputeError naming party and step on loss."""
        ray = self._ray
        progress = Progress(self.owner, step, len(refs), self.name)
        self.tasks[step] = self.tasks.get(step, 0) + len(refs)
        deadline = time.monotonic() + self.task_timeout_s
        pending, results = list(refs), {}
        silent_since = None
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    for r in pending:
                        ray.cancel(r, force=True)
                    raise ComputeError(f"{self.owner}: step {step!r} did not finish on the Ray cluster within "
                                       f"{self.task_timeout_s:.0f}s ({progress.done}/{len(refs)} shards done)")
                # one call per poll: waking per finished task cost ~2 ms a step of LR's short steps
                done, pending = ray.wait(pending, num_returns=len(pending),
                                         timeout=min(left, POLL_S, self.cluster_lost_s / 3))
                if done:  # fetched now: a failed task's error is raised within POLL_S, not after the others
                    results.update(zip(done, ray.get(done)))
                    progress.advance(len(done))
                    silent_since = None
                else:  # nothing finished for a while: is the cluster still there?
                    silent_since = None if _head_answers(self._head) else (silent_since or time.monotonic())
                    if self._head_lost(silent_since):
                        raise self._lost_error(step, progress.done, len(refs))
            return [decode(results[r]) for r in refs]
        except ray.exceptions.RayTaskError as exc:  # fn itself raised: the same error as the local pool
            cause = exc.as_instanceof_cause()
            raise cause from None
        except ray.exceptions.RayError as exc:
            if not _head_answers(self._head):  # the whole cluster went, not just a worker or node
                self.lost = True
                raise self._lost_error(step, progress.done, len(refs)) from None
            raise ComputeError(f"{self.owner}: step {step!r} failed on the Ray cluster "
                               f"({type(exc).__name__} after {self.max_retries} retries): {exc}") from None

    def _head_lost(self, silent_since) -> bool:
        if self.lost or (silent_since is not None and time.monotonic() - silent_since >= self.cluster_lost_s):
            self.lost = True
        return self.lost

    def _lost_error(self, step: str, done: int, total: int) -> ComputeError:
        # the head's address is logged here only: the error's text also reaches the peers (the job's abort)
        log.error("%s: the Ray cluster's head %s has not answered for %.0fs", self.owner, self._head,
                  self.cluster_lost_s)
        return ComputeError(
            f"{self.owner}: the Ray cluster stopped during step {step!r} ({done}/{total} shards done): its head "
            f"has not answered for {self.cluster_lost_s:.0f}s. Restart the cluster (ray start --head ...) "
            f"or set this party's compute.engine to local, then run the job again (with --resume it continues "
            f"from the last checkpoint)")

    def _common(self, common: tuple):
        """The arguments every task of a step shares: in the object store once if big, else inline in each
        task (a put and the other nodes' pulls cost ~3.5 ms a step here, a small copy per task far less)."""
        enc = encode(tuple(common))
        return self._ray.put(enc) if _nbytes(enc) > INLINE_COMMON_BYTES else enc

    def run(self, fn, common: tuple, chunks: list) -> list:
        """:meth:`Executor.run` as one Ray task per chunk (integers travel as :class:`IntBlock`); raises
        ComputeError once the cluster is lost, when work is lost or a step outlasts ``task_timeout_s``.
        """
        if self.lost:
            raise self._lost_error(step_name(fn), 0, len(chunks))
        common_arg = self._common(common)
        refs = [self._task.remote(fn, common_arg, encode(tuple(chunk))) for chunk in chunks]
        return self._gather(refs, step_name(fn))

    def _node_slots(self) -> list:
        """Alive nodes' ids, each as often as it has task slots, interleaved: A, B, A, B, A, ... (module
        docstring, "Placement"); empty when Ray does not say."""
        try:
            slots = {n["NodeID"]: int(n.get("Resources", {}).get("CPU", 0) / self.task_cpus)
                     for n in self._ray.nodes() if n.get("Alive")}
        except Exception:  # noqa: BLE001 - placement is an optimisation: without it Ray places the tasks
            return []
        return [node for k in range(max(slots.values(), default=0))
                for node, c in sorted(slots.items()) if c > k]

    def _strategy(self, node):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        return NodeAffinitySchedulingStrategy(node, soft=True)

    def _sharded(self, obj):
        """Bounds, object-store refs and assigned nodes of ``obj``'s row shards (put once, reused while ``obj``
        lives here)."""
        for i, (o, bounds, refs, nodes) in enumerate(self._shards):
            if o is obj:
                self._shards.append(self._shards.pop(i))
                return bounds, refs, nodes
        n = len(obj)
        parts = max(1, min(n, self._cpus * self.shards_per_worker))
        bounds = np.array([n * i // parts for i in range(parts + 1)], dtype=np.int64)
        whole = IntBlock(obj) if isinstance(obj, list) else np.asarray(obj)
        refs = [self._ray.put(whole.take(np.arange(bounds[i], bounds[i + 1])) if isinstance(whole, IntBlock)
                              else np.ascontiguousarray(whole[bounds[i]:bounds[i + 1]])) for i in range(parts)]
        slots = self._node_slots()
        nodes = [slots[i % len(slots)] if slots else None for i in range(parts)]
        self._shards.append((obj, bounds, refs, nodes))
        del self._shards[:-_SHARD_CACHE]
        return bounds, refs, nodes

    def run_sharded(self, fn, common: tuple, data: tuple, rows, extra: tuple = (),
                    aligned: tuple = ()) -> list | None:
        """:meth:`Executor.run_sharded` with one task per shard, pinned to the node holding it (the shards of
        ``data`` are put in the object store on first use and kept, see the module docstring). Returns
        None when the arrays of ``data`` are not sharded alike (the caller chunks the rows itself);
        raises ComputeError as :meth:`run`.
        """
        if self.lost:
            raise self._lost_error(step_name(fn), 0, 0)
        rows = np.asarray(rows, dtype=np.int64)
        layout = [self._sharded(d) for d in data]
        bounds, nodes = layout[0][0], layout[0][2]
        if any(len(b) != len(bounds) or (b != bounds).any() for b, _, _ in layout):
            return None  # not row-aligned: the caller chunks it itself
        cut = np.searchsorted(rows, bounds)
        common_arg, extra_enc = self._common(common), encode(tuple(extra))
        refs = []
        for s in range(len(bounds) - 1):
            if cut[s + 1] > cut[s]:
                local = rows[cut[s]:cut[s + 1]] - bounds[s]
                part = tuple(np.ascontiguousarray(a[cut[s]:cut[s + 1]]) for a in aligned)
                task = self._shard_task if nodes[s] is None else \
                    self._shard_task.options(scheduling_strategy=self._strategy(nodes[s]))
                refs.append(task.remote(fn, common_arg, local, extra_enc, part, *[r[s] for _, r, _ in layout]))
        return self._gather(refs, step_name(fn))

    def shutdown(self) -> None:
        """Log the tasks run per step, drop the shards and disconnect from the cluster (not from a lost one)."""
        if self.tasks:
            log.info("%s: Ray tasks per step: %s", self.owner,
                     ", ".join(f"{k} {v}" for k, v in sorted(self.tasks.items())))
            self.tasks = {}
        self._shards.clear()
        if self.lost:  # disconnecting from a dead cluster waits on its GCS: the process is ending anyway
            log.info("%s: not disconnecting from the lost Ray cluster", self.owner)
            return
        if self._ray.is_initialized():
            self._ray.shutdown()
