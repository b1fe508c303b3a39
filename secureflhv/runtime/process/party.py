"""``secureflhv party JOB --party ID``: run one party of a job, as each organisation does on its machine.

The runner validates the job, runs the preflight checks, opens the party's gRPC endpoint (mutual TLS
unless ``--insecure``), meets its partners, runs the algorithm's role for this party, and saves its
artifacts. Any failure is announced to the other parties with the job's first failure (so they stop
now rather than at their deadline, naming the right party), logged as the party's last line and
turned into a non-zero exit code. Exception: a failing client of a horizontal job
tells nobody: it is a dropout, which secure aggregation survives while t clients remain.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ...compute.executor import ComputeError
from ...transport import Transport, TransportError
from .blame import NOTICE_ENV, Blame, Stopped, listen_for_notices, root_cause
from .party_compute import party_executor
from ..job.load import JobConfig, JobConfigError, PartySpec, load_job_params
from ..job.preflight import require_preflight
from .progress import emit_wire
from ..job.registry import job_spec
from .rendezvous import meet, partners
from ..observe.reports import save_wire_report, wire_line
from ..observe.status import PartyStatus

log = logging.getLogger("secureflhv.party")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def build_transport(cfg: JobConfig, spec: PartySpec, insecure: bool) -> Transport:
    """Open this party's gRPC endpoint and channels to its peers as the job file describes."""
    from ...transport.certs import TlsConfig
    from ...transport.grpc_transport import GrpcTransport
    from ...transport.wire import TRACE_ENV, WireTrace

    peers = {p.id: p.address for p in cfg.parties if p.id != spec.id}
    if insecure:
        tls = None
    else:
        missing = [f for f, v in (("security.ca", cfg.security.ca), (f"parties[{spec.id}].cert", spec.cert),
                                  (f"parties[{spec.id}].key", spec.key)) if v is None]
        if missing:
            raise JobConfigError(f"TLS needs {', '.join(missing)} in the job file (or run with --insecure)")
        tls = TlsConfig.from_files(ca_cert=cfg.resolve(cfg.security.ca), cert=cfg.resolve(spec.cert),
                                   key=cfg.resolve(spec.key))
    trace_dir = os.environ.get(TRACE_ENV)  # a per-message log, to compare a job's traffic across code changes
    return GrpcTransport(party_id=spec.id, job_id=cfg.job.id, listen=spec.listen or spec.address, peers=peers, tls=tls,
                         insecure=insecure, deadline=cfg.job.deadline_s, max_payload_bytes=cfg.job.max_message_bytes,
                         trace=WireTrace(Path(trace_dir) / f"{spec.id}.jsonl") if trace_dir else None)


def _report_wire(cfg: JobConfig, party_id: str, stats: dict) -> None:
    """Bytes on the wire into ``metrics.json`` and (under the launcher) to the launcher; a write failure
    only costs the file."""
    try:
        save_wire_report(cfg.output_dir(party_id), cfg.job.id, party_id, stats)
    except OSError as exc:
        log.warning("%s: could not write the wire counts to metrics.json: %s", party_id, exc)
    if os.environ.get(NOTICE_ENV):
        emit_wire(stats)


WIRE_EVERY_S = 2.0  # under the launcher: how often the live byte counts go out (when they changed)


def _live_wire(transport: Transport, stopping: threading.Event) -> threading.Thread:
    """Under the launcher: emit the transport's byte counts every ``WIRE_EVERY_S`` while the job runs, so
    the launcher (and a job page) sees them grow; stops when ``stopping`` is set."""
    def loop():
        last: dict = {}  # nothing to say before the first byte
        while not stopping.wait(WIRE_EVERY_S):
            stats = transport.wire_stats()
            if stats != last:
                emit_wire(stats, by_tag=False)
                last = stats

    thread = threading.Thread(target=loop, daemon=True, name="wire-events")
    thread.start()
    return thread


def _checked_job(job_path: Path, party_id: str, insecure: bool):
    """(cfg, params, party spec, job spec) after every check, before any network traffic; JobConfigError."""
    cfg, params = load_job_params(job_path)
    spec = cfg.party(party_id)
    if cfg.security.insecure and not insecure:
        raise JobConfigError("security.insecure is true in the job file: pass --insecure to confirm "
                             "that this party may talk plaintext")
    job = job_spec(cfg.job.algorithm)
    require_preflight(cfg, party_id, params, insecure=insecure)
    return cfg, params, spec, job


def _stop_on_signals(blame: Blame, stopping: threading.Event, parties: set[str]) -> None:
    """SIGTERM / SIGINT (and, under the launcher, its notices) raise :class:`Stopped` once."""
    def terminate(signum, _frame):
        if not stopping.is_set():  # once failing or finished, a second signal changes nothing
            stopping.set()
            raise Stopped(signum, blame.first)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, terminate)
    if os.environ.get(NOTICE_ENV):
        listen_for_notices(sys.stdin, blame, parties, lambda: os.kill(os.getpid(), signal.SIGTERM))


def _finish(cfg: JobConfig, party_id: str, transport, failure, status: PartyStatus, result, started: float) -> None:
    """The last log lines and the final status: the wire report on success, the job's first failure else."""
    if failure is None:  # counted after close: late deliveries included
        stats = transport.wire_stats()
        _report_wire(cfg, party_id, stats)
        log.info("%s finished in %.1fs; %s", party_id, time.monotonic() - started, wire_line(stats))
        status.finish(result)
    else:
        log.error("%s", failure.line_for(party_id))  # the last line: the job's first failure
        status.fail(failure.line_for(party_id))
    status.close()


def play_role(cfg, party, job, transport, params, *, resume: bool = False, timeout_s: float | None = None,
              on_met=None):
    """What every party does once its endpoint is open, in a process (:func:`run_party`) or in a simulation
    (:func:`secureflhv.simulate`): meet its partners (:func:`~.rendezvous.meet`: the same job, the same digest),
    then run the algorithm's role (``job.run``); returns its result. ``on_met`` is called in between."""
    kw = {} if timeout_s is None else {"timeout_s": timeout_s}
    meet(transport, cfg, partners(cfg, party, job.family), **kw)
    if on_met is not None:
        on_met()
    return job.run(cfg, party, transport, params, resume=resume)


def run_party(job_path: Path, party_id: str, insecure: bool = False, resume: bool = False) -> int:
    """Run party ``party_id`` of the job in ``job_path``; return the process exit code.

    Order: load and validate the job, preflight (:mod:`..job.preflight`: files, certificate, data, port),
    open the endpoint, meet the partners (:mod:`.rendezvous`), run the protocol. The last log line of a
    failed party names the first failure of the job (:mod:`.blame`): ``guest failed: <reason>`` or
    ``guest stopped because host-1 failed: <reason>``.

    Exit codes: 0 success, 1 the job failed (the log says which party and why), 2 bad job file, flags
    or preflight finding (nothing was sent to any party).

    ``resume``: continue from the last checkpoint every party holds; passed to the job's run function
    (:func:`~secureflhv.runtime.store.resume.role_lifecycle`; jobs with checkpoints).
    """
    try:
        cfg, params, spec, job = _checked_job(job_path, party_id, insecure)
    except JobConfigError as exc:
        print(f"secureflhv party {party_id}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    parties, blame, stopping = {p.id for p in cfg.parties}, Blame(), threading.Event()
    _stop_on_signals(blame, stopping, parties)
    peers = [p.id for p in cfg.parties if p.id != party_id]
    # A horizontal client that fails is a dropout the protocol survives: it must not stop the others.
    told_on_failure = [] if job.family == "horizontal" and spec.role != "server" else peers
    started, transport, failure, code, live, result = time.monotonic(), None, None, EXIT_OK, None, None
    status = PartyStatus.for_party(cfg, spec).start()  # what the job page shows (status.json)
    try:
        transport = build_transport(cfg, spec, insecure)
        status.attach(transport)
        if os.environ.get(NOTICE_ENV):
            live = _live_wire(transport, stopping)
        log.info("%s (%s) of job %r listening on %s; peers: %s", party_id, spec.role, cfg.job.id, spec.address,
                 ", ".join(peers))
        # the executor (local pool or this party's Ray cluster) is connected before the partners are met
        # vertical jobs (LR, split NN, SecureBoost) encrypt from their first step: start the workers now
        with party_executor(spec.compute, party_id, cfg.where(spec, "compute"), start=job.family == "vertical"):
            result = play_role(cfg, spec, job, transport, params, resume=resume,
                               on_met=lambda: status.set_state("running"))
        stopping.set()
    except BaseException as exc:  # noqa: BLE001 - any failure must reach the peers, the log and the exit code
        stopping.set()
        # expected failures are one line (below); anything else is a bug whose traceback the user needs
        expected = isinstance(exc, (TransportError, JobConfigError, ComputeError, Stopped, SystemExit,
                                         KeyboardInterrupt))
        log.log(logging.DEBUG if expected else logging.ERROR, "%s: failure details", party_id, exc_info=True)
        failure = blame.record(root_cause(exc, party_id, parties))
        code = EXIT_CONFIG if isinstance(exc, JobConfigError) else EXIT_FAILED
        told_by_launcher = isinstance(exc, Stopped) and exc.failure is not None  # it tells everyone itself
        if transport is not None and not told_by_launcher:
            transport.abort(failure.abort_text(), told_on_failure)
    finally:
        if transport is not None:
            transport.close()
    if live is not None:
        live.join(timeout=WIRE_EVERY_S)  # its last event must not follow the final one
    _finish(cfg, party_id, transport, failure, status, result, started)
    return code
