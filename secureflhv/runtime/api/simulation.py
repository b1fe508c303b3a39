"""``secureflhv.simulate(job)``: every party of a job in this process, one thread each, the real protocol.

::

    result = secureflhv.simulate(job)            # a Job, a job dict or a job file's path
    result.history[-1]["test_accuracy"]; result.model; result.plot("accuracy.png")

The parties meet over one :class:`~secureflhv.transport.inprocess.InProcessNetwork` (the same messages,
serialisation and mailbox rules as gRPC, no sockets) and each runs what ``secureflhv party`` runs after its
endpoint is open: the rendezvous (:func:`~secureflhv.runtime.process.rendezvous.meet`, which also checks
that all hold the same job description), then its algorithm's registered ``run`` (the job registry's
:attr:`JobSpec.run`), so a simulation and a deployment share one code path and, with fixed seeds, end
with the same model bit for bit. Before anything starts every party's preflight runs on this machine
(:func:`~secureflhv.runtime.job.preflight.preflight`, the port check aside).

Certificates: every transport carries its party's certificate identity, as over mutual TLS, so secure
aggregation runs its actively secure variant (signed advertisements) and bundles are signed. They are the
job's own (``security.ca``, ``parties[i].cert`` / ``key``) when those files exist; otherwise a throw-away CA
and one certificate per party are generated in a temporary folder, deleted when the simulation ends (the
result keeps the CA certificate, :attr:`SimulationResult.ca`, to verify the bundles).

What differs from a deployment: all parties share this process's compute pool (a party's ``compute``
section, e.g. a Ray cluster, is not used), and no party writes its byte counts to ``metrics.json`` (they
are in :attr:`SimulationResult.wire`).

Failures follow ``secureflhv run``: the first party to fail is the root cause; the others are told (as
an abort message) and given :data:`GRACE_S` seconds to stop by themselves, then stopped (their mailboxes
closed). A failing client of a horizontal job is a dropout the others go on without; the simulation still
raises. Either way :func:`simulate` raises one :class:`SimulationError` naming the party and its reason,
chained to that party's exception (its traceback).
"""
from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path

from ...transport.certs import generate_certificates, load_party_credentials
from ...transport.identity import PartyIdentity
from ...transport import PeerUnavailable
from ...transport.inprocess import InProcessNetwork, InProcessTransport
from ..job.job_file import JobConfig, JobConfigError
from ..job.preflight import preflight
from ..process.blame import Blame, Failure, root_cause
from ..process.progress import add_listener, listeners_only, remove_listener
from ..process.party import play_role
from .job_builder import Job
from .simulation_result import SimulationResult

__all__ = ["GRACE_S", "SimulationError", "simulate"]

log = logging.getLogger("secureflhv.simulate")

GRACE_S = 10.0  # after the first failure: how long the others may take to stop by themselves (as the launcher)
_party = threading.local()  # in a party's thread: (its simulation, its party id), for the progress bars


class SimulationError(RuntimeError):
    """A simulated job failed.

    Attributes:
        party: the party that failed first (the root cause), or None when the job ran out of time.
        reason: why, one sentence.
        failures: {party id: :class:`~secureflhv.runtime.process.blame.Failure`} of every party that failed
            or was stopped (each names the root it heard of).
        result: the :class:`SimulationResult` when the job finished without a dropped horizontal client,
            else None.
    """

    def __init__(self, message: str, party: str | None, reason: str, failures: dict[str, Failure],
                 result: SimulationResult | None = None):
        super().__init__(message)
        self.party, self.reason, self.failures, self.result = party, reason, failures, result


class _PartyTransport(InProcessTransport):
    """A simulated party's transport: a send to a party that is down names it (``peer``, ``reason``), as
    over gRPC, so that blame (:func:`~secureflhv.runtime.process.blame.root_cause`) names that party."""

    def send(self, receiver, tag, payload, round=0, timeout=None):
        try:
            return super().send(receiver, tag, payload, round, timeout)
        except PeerUnavailable as exc:
            exc.peer, exc.reason = receiver, "could not be reached (stopped or crashed?)"
            raise


def _as_job(job) -> Job:
    if isinstance(job, Job):
        return job
    if isinstance(job, dict):
        return Job.from_dict(job)
    if isinstance(job, (str, Path)):
        return Job.from_yaml(job)
    raise TypeError(f"simulate: expected a secureflhv.Job, a job dict or a job file path, got {type(job).__name__}")


def _has_credentials(cfg: JobConfig) -> bool:
    files = [cfg.security.ca] + [f for p in cfg.parties for f in (p.cert, p.key)]
    return all(f is not None and cfg.resolve(f).is_file() for f in files)


def _simulated_config(job: Job, scratch: Path, deadline_s: float | None, output_dir) -> JobConfig:
    """The job as the simulated parties see it: certificates (the job's, else throw-away ones in
    ``scratch``), and the ``deadline_s`` / ``output_dir`` overrides."""
    cfg = job.config
    section = {k: v for k, v in (("deadline_s", deadline_s), ("output_dir", output_dir)) if v is not None}
    if "output_dir" in section:
        section["output_dir"] = Path(section["output_dir"]).resolve()
    update = {"job": cfg.job.model_copy(update=section)} if section else {}
    if not _has_credentials(cfg):
        ids = [p.id for p in cfg.parties]
        generate_certificates(scratch, ids)
        update["security"] = cfg.security.model_copy(update={"ca": scratch / "ca.pem", "insecure": False})
        update["parties"] = [p.model_copy(update={"cert": scratch / f"{p.id}.pem", "key": scratch / f"{p.id}.key"})
                             for p in cfg.parties]
    return cfg.model_copy(update=update) if update else cfg


def _network(cfg: JobConfig) -> InProcessNetwork:
    """One in-process network of the job's parties, each with its certificate identity (checked)."""
    net = InProcessNetwork(cfg.job.id, [p.id for p in cfg.parties], deadline=cfg.job.deadline_s,
                           max_payload_bytes=cfg.job.max_message_bytes)
    # the job's own files, wherever they are (InProcessNetwork's cert_dir wants one folder of <id>.pem)
    net.identities = {p.id: PartyIdentity(load_party_credentials(
        party_id=p.id, ca_cert=cfg.resolve(cfg.security.ca), cert=cfg.resolve(p.cert), key=cfg.resolve(p.key)))
        for p in cfg.parties}
    return net


def _preflight(cfg: JobConfig, params) -> None:
    """Every party's preflight (files, certificate, data, output folder); JobConfigError listing findings."""
    findings = [f for p in cfg.parties for f in preflight(cfg, p.id, params, check_port=False)]
    if findings:
        raise JobConfigError(f"job {cfg.job.id!r} not started: preflight found {len(findings)} problem(s):\n"
                             + "\n".join(f"  - {f}" for f in findings))


class _Parties:
    """The parties of one simulation, each in its own thread over ``net``; what each returned or raised."""

    def __init__(self, cfg: JobConfig, job: Job, params, net: InProcessNetwork, resume: bool):
        self.cfg, self.spec, self.params, self.net, self.resume = cfg, job.spec, params, net, resume
        self.ids = [p.id for p in cfg.parties]
        # parties whose failure does not stop the job: the clients of a horizontal job (dropouts)
        self.tolerated = {p.id for p in cfg.clients} if job.spec.family == "horizontal" else set()
        self.results: dict[str, object] = {}
        self.errors: dict[str, BaseException] = {}
        self.failures: dict[str, Failure] = {}
        self.blame = Blame()
        self.root_at: float | None = None
        self._changed = threading.Condition()
        self.threads = {p.id: threading.Thread(target=self._one, args=(p,), name=f"secureflhv-{p.id}", daemon=True)
                        for p in cfg.parties}

    def _one(self, party) -> None:
        _party.current = (self, party.id)
        transport = _PartyTransport(self.net, party.id)
        try:
            self.results[party.id] = play_role(self.cfg, party, self.spec, transport, self.params, resume=self.resume,
                                               timeout_s=self.cfg.job.deadline_s)
        except BaseException as exc:  # noqa: BLE001 - any failure is reported by simulate, naming the party
            self._failed(party.id, transport, exc)
        finally:
            transport.close()
            with self._changed:
                self._changed.notify_all()

    def _failed(self, pid: str, transport, exc: BaseException) -> None:
        first = self.blame.first
        # once a party failed, every later failure is because of it (the launcher's notice, in a deployment)
        failure = first if first is not None and first.party != pid else root_cause(exc, pid, set(self.ids))
        # blaming a party that already failed (e.g. a dropped client now unreachable) is blaming its cause
        failure = self.failures.get(failure.party, failure) if failure.party != pid else failure
        self.errors[pid], self.failures[pid] = exc, failure
        if pid in self.tolerated:
            if failure.party == pid:
                log.warning("%s failed: %s; the job goes on without it (client dropout)", pid, failure.reason)
            else:
                log.info("%s", failure.line_for(pid))
            self.net.take_down(pid)  # as its process dying: sends to it fail, which the server survives
            return
        root = self.blame.record(failure)
        if self.root_at is None:
            self.root_at = time.monotonic()
        log.error("%s", root.line_for(pid))
        running = [p for p in self.ids if p != pid and self.threads[p].is_alive()]
        transport.abort(root.abort_text(), running)  # the others stop now, naming the root
        self.net.take_down(pid)

    def running(self) -> list[str]:
        return [pid for pid, t in self.threads.items() if t.is_alive()]

    def stop(self) -> None:
        """Close every running party's mailbox: each fails at its next receive."""
        for pid in self.running():
            self.net.take_down(pid)

    def run(self, timeout_s: float | None) -> bool:
        """Start every party and wait for all; after the first failure stop the rest within :data:`GRACE_S`.
        Returns False when ``timeout_s`` ran out (every party was stopped)."""
        start, late = time.monotonic(), False
        for t in self.threads.values():
            t.start()
        try:
            with self._changed:  # released before the joins: a finishing party takes it to say so
                while self.running():
                    now = time.monotonic()
                    late = timeout_s is not None and now - start > timeout_s
                    if late or (self.root_at is not None and now - self.root_at > GRACE_S):
                        break
                    self._changed.wait(0.2)
        except KeyboardInterrupt:
            self.stop()
            self._join()
            raise
        self.stop()  # none is left running unless it overstayed the grace period or the timeout
        self._join()
        return not late

    def _join(self) -> None:
        """Wait for the stopped parties; one busy computing notices at its next message (bounded wait)."""
        end = time.monotonic() + self.cfg.job.deadline_s
        for t in self.threads.values():
            t.join(max(0.1, end - time.monotonic()))


class _Bars:
    """A rich progress bar per (party, task) of the parties of ``parties`` (the server's rounds, the guest's
    epochs), from their :func:`~secureflhv.runtime.process.progress.emit_progress` events."""

    def __init__(self, parties: _Parties):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.parties = parties
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), transient=False)
        self.tasks: dict[tuple[str, str], int] = {}
        self.lock = threading.Lock()

    def on_event(self, ev: dict) -> None:
        sim, pid = getattr(_party, "current", (None, None))
        if sim is not self.parties:  # another simulation's party, or not a party thread
            return
        key = (pid, ev["task"])
        with self.lock:
            if key not in self.tasks:
                self.tasks[key] = self.progress.add_task(f"{pid}: {ev['task']}", total=ev["total"])
            self.progress.update(self.tasks[key], completed=ev["done"], total=ev["total"],
                                 description=f"{pid}: {ev['task']} {ev.get('info', '')}".rstrip())

    def __enter__(self):
        self.progress.start()
        add_listener(self.on_event)
        return self

    def __exit__(self, *exc) -> None:
        remove_listener(self.on_event)
        self.progress.stop()


def _raise_failures(job: Job, parties: _Parties, result: SimulationResult | None) -> None:
    """One SimulationError naming the root failure (or the dropped clients), chained to its exception."""
    root = parties.blame.first
    if root is None and not parties.failures:
        return
    if root is None:  # only tolerated dropouts failed; the others finished
        dropped = sorted(parties.failures)
        first = parties.failures[dropped[0]]
        raise SimulationError(f"job {job.id!r} finished without {', '.join(dropped)}: {first.line_for(dropped[0])}",
                              dropped[0], first.reason, dict(parties.failures), result) \
            from parties.errors[dropped[0]]
    own = parties.failures.get(root.party)
    if own is not None and own.party == root.party:  # its own words (a dropped client's error), not its silence
        root = own
    others = sorted(p for p in parties.failures if p != root.party)
    stuck = parties.running()
    message = (f"job {job.id!r} failed: {root.party} failed: {root.reason}"
               + (f"; {', '.join(others)} stopped because of it" if others else "")
               + (f"; still busy after the stop: {', '.join(stuck)}" if stuck else ""))
    raise SimulationError(message, root.party, root.reason, dict(parties.failures)) \
        from parties.errors.get(root.party)


def simulate(job, *, progress: bool = True, deadline_s: float | None = None, timeout_s: float | None = None,
             output_dir=None, resume: bool = False) -> SimulationResult:
    """Run every party of ``job`` in this process (a thread each) over an in-process network; return the
    :class:`~secureflhv.runtime.api.simulation_result.SimulationResult`.

    Args:
        job: a :class:`~secureflhv.runtime.api.job_builder.Job`, a job document (dict) or a job file path.
        progress: draw a rich progress bar per party and task (the server's rounds, the guest's epochs).
        deadline_s: ``job.deadline_s`` for this run: how long a party waits for a peer's message before it
            fails (default: the job's).
        timeout_s: stop every party after this many seconds and raise (default: no limit).
        output_dir: ``job.output_dir`` for this run (default: the job's); each party writes
            ``<output_dir>/<party id>/`` as in a deployment.
        resume: continue from the last checkpoint every party holds (``secureflhv run --resume``).

    Raises:
        JobConfigError / ValidationError: an invalid job, or a preflight finding (nothing started).
        SimulationError: a party failed (naming it and why, chained to its exception), or ``timeout_s``
            ran out. After the first failure the others stop within :data:`GRACE_S` seconds.
    """
    job = _as_job(job)
    with tempfile.TemporaryDirectory(prefix="secureflhv-sim-") as scratch:
        cfg = _simulated_config(job, Path(scratch), deadline_s, output_dir)
        params = job.spec.validate(cfg)
        _preflight(cfg, params)
        parties = _Parties(cfg, job, params, _network(cfg), resume)
        ca = cfg.resolve(cfg.security.ca).read_bytes()
        started = time.monotonic()
        with listeners_only():
            if progress:
                with _Bars(parties):
                    finished = parties.run(timeout_s)
            else:
                finished = parties.run(timeout_s)
    if not finished:
        raise SimulationError(f"job {job.id!r} did not finish within {timeout_s:g}s (timeout_s); every party was "
                              f"stopped", None, "timeout", dict(parties.failures))
    result = None
    if parties.blame.first is None:
        result = SimulationResult(job, cfg, parties.results, ca=ca, seconds=time.monotonic() - started,
                                  wire=parties.net.wire_stats())
    _raise_failures(job, parties, result)
    return result
