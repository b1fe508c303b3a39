"""``secureflhv serve JOB --party ID``: one party's long-running prediction service of a trained vertical model.

The job file is the model's prediction job (``algorithm: predict``, ``params.model_dir``; see
``secureflhv predict``): the same parties, addresses and certificates as training. Every party starts
``serve``; they meet over mutual TLS as a job does, then:

* the guest builds its warm roles, opens the request front end (HTTP/JSON and optionally gRPC, on
  127.0.0.1 by default; :mod:`.front`) and scores requests through :class:`.service.GuestService`;
* each host opens its feature store (``--store``: a SQLite file or database URL; default: built at start
  from its ``data.path`` table into ``<output_dir>/<party>/features.sqlite``) and answers the guest's steps
  (:class:`.federation.HostLoop`) until the guest stops or goes away;
* the server of a vertical LR model trained in arbiter mode decrypts the guest's masked totals; any other
  server has nothing to do and exits.

The guest's status file (the job page) shows requests/s and latency percentiles. SIGTERM / SIGINT stop
the service (the guest releases the hosts). Exit codes as ``secureflhv party``.
"""
from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ...transport import TransportError
from ..algorithms.predict import load_new_rows, load_party_bundle
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..job.load import load_job_params
from ..observe.status import PartyStatus
from ..process.party import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, build_transport
from ..process.rendezvous import meet, partners
from .feature_store import build_sqlite_store, open_store
from .federation import IDLE_S, GuestFederation, HostLoop
from .scoring import build_scoring, input_columns

log = logging.getLogger("secureflhv.serve")
STATUS_EVERY_S = 2.0


@dataclass
class ServeOptions:
    """How a party serves (``secureflhv serve --help``).

    Attributes:
        model_dir: the bundles' folder (default: the job's ``params.model_dir``).
        store: a host's feature store (SQLite path or URL); None: built from its ``data.path``.
        http_port / grpc_port: the guest's front ends (0: any free port; None: off); bind: their address.
        timeout_s: a request's time limit; rate / burst: per-caller token bucket; max_batch: ids per request.
        deadline_s: how long a party waits for another within a step (a host that is down is named after it).
        ports_file: where the guest writes its bound ports (JSON) once it is ready (scripts, tests).
    """

    model_dir: str | None = None
    store: str | None = None
    http_port: int | None = 8470
    grpc_port: int | None = None
    bind: str = "127.0.0.1"
    timeout_s: float = 10.0
    rate: float = 200.0
    burst: int = 400
    max_batch: int = 64
    deadline_s: float = 10.0
    ports_file: Path | None = None


def _bundle_loader(cfg: JobConfig, party: PartySpec, params):
    def load(model_dir: str):
        return load_party_bundle(cfg, party, params.model_copy(update={"model_dir": Path(model_dir)}))
    return load


def _store_opener(cfg: JobConfig, party: PartySpec, opts: ServeOptions, first_bundle):
    """columns -> the host's feature store: ``opts.store``, or one SQLite file built now from ``data.path``."""
    location = opts.store
    if location is None:
        table = load_new_rows(cfg, party, first_bundle)
        location = str(build_sqlite_store(cfg.output_dir(party.id) / "features.sqlite", [str(i) for i in table.ids],
                                          table.X, input_columns(first_bundle)))
        log.info("%s: feature store %s built from %s (%d rows)", party.id, location, party.data.path, table.n_rows)

    def opener(columns):
        try:
            return open_store(location, columns=columns)
        except (ValueError, OSError, ImportError) as exc:
            raise JobConfigError(f"serve --store (party {party.id!r}): {exc}") from None
    return opener


def _serve_guest(cfg, party, t, load, model_dir, opts: ServeOptions, stopping: threading.Event,
                 status: PartyStatus) -> None:
    from .front import serve_front
    from .service import GuestService

    service = GuestService(GuestFederation(t, cfg, party, load, model_dir, opts.max_batch), opts.max_batch)
    front = serve_front(service, http_port=opts.http_port, grpc_port=opts.grpc_port, host=opts.bind,
                        rate=opts.rate, burst=opts.burst, timeout_s=opts.timeout_s)
    try:
        ports = {"http": front.http_port, "grpc": front.grpc_port}
        log.info("%s: serving model %s; HTTP %s, gRPC %s on %s", party.id, service.fed.model, ports["http"],
                 ports["grpc"], opts.bind)
        if opts.ports_file is not None:
            Path(opts.ports_file).write_text(json.dumps(ports))
        status.set_state("serving", serving={"model": service.fed.model, "ports": ports})
        curves, started = {"requests/s": [], "p50 ms": [], "p99 ms": []}, time.monotonic()
        while not stopping.wait(STATUS_EVERY_S):
            snap = front.stats.snapshot()
            x = round(time.monotonic() - started, 1)
            for name, key in (("requests/s", "requests_per_s"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms")):
                if snap.get(key) is not None:
                    curves[name] = (curves[name] + [[x, snap[key]]])[-500:]
            status.set_state("serving" if service.fed.down is None else "degraded", curves=curves,
                             curve_steps={k: "seconds" for k in curves},
                             serving={"model": service.fed.model, "ports": ports, "down": service.fed.down, **snap})
    finally:
        front.close()
        service.close()


def _serve(cfg, party, t, params, opts: ServeOptions, stopping, status) -> None:
    load = _bundle_loader(cfg, party, params)
    model_dir = opts.model_dir or str(params.model_dir)
    if party.role == "guest":
        return _serve_guest(cfg, party, t, load, model_dir, opts, stopping, status)
    if party.role == "host":
        opener = _store_opener(cfg, party, opts, load(model_dir))
        HostLoop(t, cfg, party, load, opener, model_dir, opts.max_batch).run()
        return None
    if not (cfg.resolve(Path(model_dir)) / party.id / "model").is_dir():
        log.info("%s: no model bundle of this server; nothing to serve", party.id)
        return None
    built = build_scoring(cfg, party, t, load(model_dir), max_rows=opts.max_batch)
    if isinstance(built, tuple):
        built[1](IDLE_S)
    return None


def run_serve(job_path: Path, party_id: str, opts: ServeOptions, insecure: bool = False) -> int:
    """Serve party ``party_id`` of the prediction job ``job_path`` until stopped; returns the exit code (0:
    stopped, 1: a peer failed, 2: a bad job file, flag or bundle: nothing was served)."""
    try:
        cfg, params = load_job_params(job_path)
        if cfg.job.algorithm != "predict":
            raise JobConfigError(f"job.algorithm: serve takes the model's prediction job (algorithm: predict), "
                                 f"not {cfg.job.algorithm!r}; write one with `secureflhv predict`")
        party = cfg.party(party_id)
    except JobConfigError as exc:
        print(f"secureflhv serve {party_id}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    stopping, held = threading.Event(), {}

    def stop(*_) -> None:  # the guest leaves its loop and releases the others; a host or server stops waiting
        stopping.set()
        if party.role != "guest" and "t" in held:
            held["t"].close()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    status, t, code = PartyStatus.for_party(cfg, party).start(), None, EXIT_OK
    try:
        t = held["t"] = build_transport(cfg, party, insecure)
        status.attach(t)
        meet(t, cfg, partners(cfg, party, "vertical"))
        t.deadline = opts.deadline_s  # within a step; the job's deadline was for meeting
        _serve(cfg, party, t, params, opts, stopping, status)
        status.finish()
    except JobConfigError as exc:
        log.error("%s: %s", party_id, exc)
        status.fail(str(exc))
        code = EXIT_CONFIG
    except TransportError as exc:
        if stopping.is_set():
            log.info("%s: stopped", party_id)
            status.finish()
        else:
            log.error("%s: serving stopped: %s", party_id, exc)
            status.fail(str(exc))
            code = EXIT_FAILED
    finally:
        if t is not None:
            t.close()
        status.close()
    return code
