"""Choose and install a party's executor from its job-file ``compute`` section (local pool or Ray).

The executor is installed for the party's whole protocol run (:func:`party_executor`); the
algorithms do not know which one runs their batch crypto (:mod:`secureflhv.compute.executor`).

``auto`` picks Ray when an address is configured (``compute.address`` or ``RAY_ADDRESS``) and its
head answers a TCP connection within ``PROBE_TIMEOUT_S``, else the local pool (logged either way).
A shared job file need not reveal a party's cluster: leave ``address`` out and set ``RAY_ADDRESS``
in that party's environment.
"""
from __future__ import annotations

import contextlib
import logging
import os

from ...compute import executor as ex
from ...compute.executor import ComputeError
from ...compute.ray_executor import PROBE_TIMEOUT_S, tcp_answers
from ..job.job_file import ComputeSpec, JobConfigError
from .progress import emit_progress

log = logging.getLogger("secureflhv.compute")


def cluster_address(spec: ComputeSpec) -> str | None:
    """The configured Ray address: ``compute.address``, else ``RAY_ADDRESS``, else None."""
    return spec.address or os.environ.get("RAY_ADDRESS") or None


def reachable(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``host:port`` (or ``ray://host:port``) accepts a TCP connection (False if malformed)."""
    return bool(tcp_answers(address, timeout))


def make_executor(spec: ComputeSpec, party_id: str, where: str = "compute") -> ex.Executor:
    """The executor ``spec`` asks for (a new RayExecutor, or the local pool).

    Raises:
        JobConfigError: engine ray and no address is configured or the cluster is unreachable, or
            the ``ray`` package is missing (``where`` names the field, e.g. ``parties[1].compute``).
    """
    address = cluster_address(spec)
    if spec.engine == "local":
        return ex.LocalExecutor()
    if spec.engine == "auto":
        if address is None or not reachable(address):
            log.info("%s: compute auto: %s; using the local process pool", party_id,
                     "no Ray address configured" if address is None else f"no Ray cluster answers at {address}")
            return ex.LocalExecutor()
    elif address is None:
        raise JobConfigError(f"{where}.address: engine ray needs an address (or RAY_ADDRESS in the environment)")
    elif not reachable(address):
        # the address stays in this party's log: the error's text also goes to the peers (the job's abort)
        log.error("%s: no Ray cluster answers at %s", party_id, address)
        raise JobConfigError(f"{where}.address: no Ray cluster answers at the configured address "
                             f"(compute.address or RAY_ADDRESS; see this party's log)")
    from ...compute.ray_executor import RayExecutor

    try:
        return RayExecutor(address, owner=party_id, shards_per_worker=spec.shards_per_worker,
                           min_batch=spec.min_batch, task_cpus=spec.task_cpus, max_retries=spec.max_retries,
                           task_timeout_s=spec.task_timeout_s, ship_code=spec.ship_code,
                           cluster_lost_s=spec.cluster_lost_s)
    except ComputeError as exc:
        raise JobConfigError(f"{where}: {exc}") from None


def _progress_event(owner, step, engine, done, total, rate, eta) -> None:
    """A long step's progress as a ``@progress`` event (the launcher's bars, the job page)."""
    emit_progress(f"compute: {step}", done, total, info=f"{engine}, {rate:.2f} shards/s, ETA {eta:.0f}s")


@contextlib.contextmanager
def party_executor(spec: ComputeSpec, party_id: str, where: str = "compute", start: bool = False):
    """Install the party's executor for the block, then shut it down (the local pool only after a success)
    and restore the previous one.

    ``start``: start its workers now, in the background (a job that uses homomorphic encryption: its
    first batch then does not wait for them); otherwise they start with the first batch that needs them.

    Long steps' progress goes to the party's log and, as ``@progress`` events, to its progress output.
    """
    executor = make_executor(spec, party_id, where)
    executor.owner = party_id
    if start:
        executor.start()  # the local pool's workers start while the party connects to its peers
    ex.add_progress_listener(_progress_event)
    done = False
    try:
        with ex.using(executor):
            yield executor
        done = True
    finally:
        ex.remove_progress_listener(_progress_event)
        # After a success the local pool is stopped here too, in order, not at exit behind concurrent.futures'
        # exit hook (where a start still in flight held the party after its last log line). After a failure
        # it is left to exit: its running tasks must not delay telling the peers.
        if done or executor.name != "local":
            executor.shutdown()
