"""``secureflhv party JOB --party ID``: run one party of a job, as each organisation does on its machine.

The runner validates the job, opens the party's gRPC endpoint (mutual TLS unless ``--insecure``),
runs the algorithm's role for this party, and saves its artifacts. Any failure is logged with the
party id and the step, announced to the other parties (so they stop now rather than at their
deadline), and turned into a non-zero exit code. Exception: a failing client of a horizontal job
tells nobody: it is a dropout, which secure aggregation survives while t clients remain.
"""
from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path

from ..transport import Transport, TransportError
from .config import JobConfig, JobConfigError, PartySpec, load_job_params
from .registry import job_spec

log = logging.getLogger("secureflhv.party")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def build_transport(cfg: JobConfig, spec: PartySpec, insecure: bool) -> Transport:
    """Open this party's gRPC endpoint and channels to its peers as the job file describes."""
    from ..transport.certs import TlsConfig
    from ..transport.grpc_transport import GrpcTransport

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
    return GrpcTransport(party_id=spec.id, job_id=cfg.job.id, listen=spec.listen or spec.address, peers=peers, tls=tls,
                         insecure=insecure, deadline=cfg.job.deadline_s, max_payload_bytes=cfg.job.max_message_bytes)


def run_party(job_path: Path, party_id: str, insecure: bool = False) -> int:
    """Run party ``party_id`` of the job in ``job_path``; return the process exit code.

    Exit codes: 0 success, 1 the job failed (the log says which party and step), 2 bad job file or flags.
    """
    try:
        cfg, params = load_job_params(job_path)  # every check, before any network traffic
        spec = cfg.party(party_id)
        if cfg.security.insecure and not insecure:
            raise JobConfigError("security.insecure is true in the job file: pass --insecure to confirm "
                                 "that this party may talk plaintext")
        job = job_spec(cfg.job.algorithm)
    except JobConfigError as exc:
        print(f"secureflhv party {party_id}: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    def terminate(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    peers = [p.id for p in cfg.parties if p.id != party_id]
    # A horizontal client that fails is a dropout the protocol survives: it must not stop the others.
    told_on_failure = [] if job.family == "horizontal" and spec.role != "server" else peers
    started = time.monotonic()
    transport = None
    try:
        transport = build_transport(cfg, spec, insecure)
        log.info("%s (%s) of job %r listening on %s; peers: %s", party_id, spec.role, cfg.job.id, spec.address,
                 ", ".join(peers))
        job.run(cfg, spec, transport, params)
        log.info("%s finished in %.1fs", party_id, time.monotonic() - started)
        return EXIT_OK
    except JobConfigError as exc:
        log.error("%s: %s", party_id, exc)
        _tell_peers(transport, f"{party_id}: bad configuration: {exc}", told_on_failure)
        return EXIT_CONFIG
    except TransportError as exc:
        log.error("%s stopped: %s", party_id, exc)
        _tell_peers(transport, f"{party_id} stopped: {exc}", told_on_failure)
        return EXIT_FAILED
    except SystemExit as exc:
        log.error("%s was terminated (signal %s)", party_id, (exc.code or 0) - 128)
        _tell_peers(transport, f"{party_id} was terminated", told_on_failure)
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 - any failure must reach the peers and the exit code
        log.exception("%s failed: %s", party_id, exc)
        _tell_peers(transport, f"{party_id} failed: {type(exc).__name__}: {exc}", told_on_failure)
        return EXIT_FAILED
    finally:
        if transport is not None:
            transport.close()


def _tell_peers(transport: Transport | None, reason: str, peers: list[str]) -> None:
    if transport is not None:
        transport.abort(reason, peers)
