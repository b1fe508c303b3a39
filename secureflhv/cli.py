"""The ``secureflhv`` command.

    secureflhv certs --job JOB            CA + one certificate per party of a job (mutual TLS)
    secureflhv validate JOB [--party ID]  check a job file (and everything local to party ID) before anyone starts
    secureflhv check JOB --party ID       preflight party ID, then reach every peer over mutual TLS (a table)
    secureflhv party JOB --party ID       run one party (what each organisation runs on its machine)
    secureflhv run JOB                    run every party of a job on this machine, as separate processes
                                          (``run``/``party`` ``--dashboard [PORT]``: a read-only job page)
    secureflhv partition ...              split a dataset into non-IID party shards, with statistics and a plot
    secureflhv predict TRAIN_JOB --data ID=NEW.csv ...   write the prediction job of a trained job (then `run` it)
    secureflhv serve PREDICT_JOB --party ID   serve a trained vertical model online (every party runs it)
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ._version import __version__

log = logging.getLogger("secureflhv")


def _hostnames(values: list[str], cfg, parties: list[str]) -> dict[str, list[str]]:
    """Each party's extra certificate names: ``NAME`` (every party), ``ID=NAME`` (that party), and, with
    a job file, the host of each party's own ``address`` (and ``listen``, unless a wildcard)."""
    names: dict[str, list[str]] = {p: [] for p in parties}
    for value in values:
        pid, sep, name = value.partition("=")
        if not sep:
            for p in parties:
                names[p].append(value)
        elif pid not in names:
            raise ValueError(f"--hostname {value}: {pid!r} is not one of the parties {sorted(parties)}")
        else:
            names[pid].append(name)
    for spec in cfg.parties if cfg is not None else ():
        for addr in (spec.address, spec.listen):
            host = addr.rpartition(":")[0].strip("[]") if addr else ""
            if host and host not in ("0.0.0.0", "::") and host not in names[spec.id]:
                names[spec.id].append(host)
    return names


def _cmd_certs(args: argparse.Namespace) -> int:
    from .transport.certs import generate_certificates

    parties, cfg = list(args.parties), None
    if args.job:
        from .runtime.job.load import load_job

        cfg = load_job(args.job)
        parties += [p.id for p in cfg.parties]
    if not parties:
        print("secureflhv certs: name the parties (positional) or give --job JOB", file=sys.stderr)
        return 2
    parties = sorted(set(parties))
    try:
        hostnames = _hostnames(args.hostname, cfg, parties)
        paths = generate_certificates(Path(args.out), parties, days=args.days, hostnames=hostnames,
                                      overwrite=args.overwrite)
    except (FileExistsError, ValueError) as exc:
        print(f"secureflhv certs: {exc}", file=sys.stderr)
        return 2
    print(f"wrote the CA and {len(paths['parties'])} party certificates to {args.out}")
    for name, files in sorted(paths["parties"].items()):
        sans = ", ".join([name, *hostnames[name]])
        print(f"  {name}: {files['cert']}, {files['key']} (names: {sans})")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from .runtime.job.load import load_job_params
    from .runtime.job.preflight import preflight
    from .runtime.job.registry import job_spec

    cfg, params = load_job_params(args.job)
    spec = job_spec(cfg.job.algorithm)
    print(f"job {cfg.job.id!r}: algorithm {spec.name} ({spec.family}: {spec.summary}), {len(cfg.parties)} parties, "
          f"{'PLAINTEXT (insecure)' if cfg.security.insecure else 'mutual TLS'}")
    for p in cfg.parties:
        data = f" data={cfg.resolve(p.data.path)}" if p.data else ""
        print(f"  {p.role:6s} {p.id:12s} {p.address}{data}")
    if not args.party:
        print("the job file is valid; run `secureflhv validate JOB --party ID` on a party's machine to check its "
              "files, certificate, data and port")
        return 0
    cfg.party(args.party)
    findings = preflight(cfg, args.party, params, insecure=cfg.security.insecure)
    if findings:
        print(f"preflight of party {args.party!r}: {len(findings)} problem(s)", file=sys.stderr)
        for f in findings:
            print(f"  - {f}", file=sys.stderr)
        return 2
    print(f"preflight of party {args.party!r} passed: files, certificate, data and port are ready")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from .runtime.job.load import load_job_params
    from .runtime.process.party import build_transport
    from .runtime.job.preflight import require_preflight
    from .runtime.job.registry import job_spec
    from .runtime.process.rendezvous import partners, probe

    cfg, params = load_job_params(args.job)
    spec = cfg.party(args.party)
    insecure = args.insecure or cfg.security.insecure
    require_preflight(cfg, args.party, params, insecure=insecure)
    addresses = {p.id: p.address for p in cfg.parties}
    transport = build_transport(cfg, spec, insecure)
    try:
        peers = partners(cfg, spec, job_spec(cfg.job.algorithm).family)
        rows = [probe(transport, peer, args.timeout) for peer in peers]
    finally:
        transport.close()
    print(f"{'peer':14s} {'address':22s} {'reachable':10s} {'certificate':12s} round trip")
    for r in rows:
        rtt = f"{r['rtt_ms']:.1f} ms" if r["rtt_ms"] is not None else "-"
        print(f"{r['peer']:14s} {addresses[r['peer']]:22s} {r['reachable']:10s} {r['certificate']:12s} {rtt}")
    for r in rows:
        if r["detail"]:
            print(f"  {r['peer']}: {r['detail']}")
    return 0 if all(r["reachable"] == r["certificate"] == "yes" for r in rows) else 1


def _with_job_page(args: argparse.Namespace, cfg, run, party_ids=None, exit_codes=None) -> int:
    """``run()`` with the job page served (``--dashboard``) until the job ends, plus ``--dashboard-wait``."""
    if args.dashboard is None:
        return run()
    from .runtime.observe.dashboard import open_job_page

    try:
        page = open_job_page(cfg, party_ids, host=args.dashboard_host, port=args.dashboard, exit_codes=exit_codes)
    except OSError as exc:
        print(f"secureflhv: cannot serve the job page on {args.dashboard_host}:{args.dashboard}: {exc}",
              file=sys.stderr)
        return 2
    try:
        rc = run()
        page.linger(args.dashboard_wait)
        return rc
    finally:
        page.stop()


def _cmd_party(args: argparse.Namespace) -> int:
    from .runtime.process.party import run_party

    cfg = None
    if args.dashboard is not None:
        from .runtime.job.load import load_job

        cfg = load_job(args.job)
    return _with_job_page(args, cfg, lambda: run_party(Path(args.job), args.party, insecure=args.insecure,
                                                          resume=args.resume),
                          party_ids=[args.party])


def _cmd_run(args: argparse.Namespace) -> int:
    from .runtime.job.load import load_job
    from .runtime.process.launcher import Launcher

    cfg = load_job(args.job)
    extra = ["--log-level", args.log_level] + (["--insecure"] if args.insecure else []) + \
        (["--resume"] if args.resume else [])
    launcher = Launcher(Path(args.job), cfg, extra_args=extra)
    return _with_job_page(args, cfg, lambda: launcher.run(timeout_s=args.timeout),
                          exit_codes=lambda: {c.party_id: c.proc.poll() for c in launcher.children})


def _add_job_page_options(p: argparse.ArgumentParser, whom: str) -> None:
    p.add_argument("--dashboard", nargs="?", type=int, const=8765, default=None, metavar="PORT",
                   help=f"serve a read-only job page for {whom} at http://127.0.0.1:PORT/ (default port 8765; 0 "
                        "picks a free one): state, step and ETA, live curves, bytes per peer, recent log lines, "
                        "final metrics and plots; never data, keys or certificates")
    p.add_argument("--dashboard-host", default="127.0.0.1", metavar="ADDR",
                   help="address the job page binds (default %(default)s: this machine only; another address shows "
                        "the page to anyone who can reach it, with a warning)")
    p.add_argument("--dashboard-wait", type=float, default=0.0, metavar="SECONDS",
                   help="keep the job page up this long after the job ends (default: close when the job ends)")


def _cmd_predict(args: argparse.Namespace) -> int:
    from .runtime.job.load import load_job
    from .runtime.algorithms.predict import write_predict_job

    data = {}
    for value in args.data:
        pid, sep, path = value.partition("=")
        if not sep or not path:
            print(f"secureflhv predict: --data {value}: expected PARTY_ID=PATH", file=sys.stderr)
            return 2
        data[pid] = Path(path)
    try:
        path = write_predict_job(args.train_job, args.out, data=data, job_id=args.job_id, model_dir=args.model,
                                 output_dir=args.output_dir)
    except (OSError, ValueError, KeyError) as exc:
        print(f"secureflhv predict: {exc}", file=sys.stderr)
        return 2
    cfg = load_job(path)  # the written job is valid (JobConfigError otherwise)
    print(f"wrote {path}: job {cfg.job.id!r} scores {', '.join(sorted(data)) or 'the training data'} with the "
          f"bundles in {cfg.params['model_dir']}; run it with `secureflhv run {path}` (one machine) or "
          f"`secureflhv party {path} --party ID` at each party")
    return 0


def _version_line() -> str:
    """``secureflhv X (gmpy2 Y on GMP Z)``: the GMP decides the homomorphic layer's speed (``make gmp``)."""
    from .crypto.homomorphic.paillier_engine import gmp_version

    return f"secureflhv {__version__} ({gmp_version()})"


def build_parser() -> argparse.ArgumentParser:
    """The ``secureflhv`` argument parser: one subcommand per entry of the module docstring, each with
    ``func`` set to the function that runs it (returning the exit code)."""
    parser = argparse.ArgumentParser(
        prog="secureflhv",
        description="Secure cross-silo federated learning over gRPC with mutual TLS.",
        epilog="Run one party per organisation with `secureflhv party JOB --party ID`; "
               "`secureflhv run JOB` starts all parties on this machine for a demo or test.")
    parser.add_argument("--version", action="version", version=_version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_certs(sub)
    _add_checks(sub)
    _add_party_and_run(sub)
    _add_predict(sub)
    _add_serve(sub)

    from .data.partition import command as partition_cli

    p = sub.add_parser("partition", help="split a dataset into non-IID party shards",
                       description="Partition a dataset over parties with a non-IID scheme (NIID-Bench and the "
                                   "survey's categories), write each party's shard, print statistics, save a plot.")
    partition_cli.add_arguments(p)
    p.set_defaults(func=partition_cli.run)
    return parser


def _job_command(sub, name: str, func, help: str, description: str, job_help: str | None = None):
    """A subcommand whose first argument is a job file, run by ``func``."""
    p = sub.add_parser(name, help=help, description=description)
    p.add_argument("job", type=Path, help=job_help)
    p.set_defaults(func=func)
    return p


def _add_certs(sub) -> None:
    """``secureflhv certs``."""
    p = sub.add_parser("certs", help="generate a CA and one TLS certificate per party",
                       description="Generate a certificate authority and, for each party, a key and a certificate "
                                   "whose common name is the party id (checked against the sender of every message).")
    p.add_argument("parties", nargs="*", help="party ids (added to those of --job)")
    p.add_argument("--job", type=Path, help="take the party ids from this job file")
    p.add_argument("--out", default="certs", help="output folder (default: %(default)s)")
    p.add_argument("--days", type=int, default=365, help="validity in days (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace existing keys and certificates")
    p.add_argument("--hostname", action="append", default=[], metavar="[ID=]NAME",
                   help="extra DNS name or IP for party ID's certificate (ID=NAME), or for every party (NAME); "
                        "repeatable. With --job each party also gets the host of its own address")
    p.set_defaults(func=_cmd_certs)


def _add_checks(sub) -> None:
    """``secureflhv validate`` and ``secureflhv check``."""
    p = _job_command(sub, "validate", _cmd_validate,
                     help="check a job file (and, with --party, everything local to that party)",
                     description="Validate a job file and summarise it. With --party ID, also run that party's "
                                 "preflight: its files, certificate (CA chain, dates, party id, key), data "
                                 "columns and types, and listen port. Exit code 2 on any problem.")
    p.add_argument("--party", help="the party whose local set-up to check (run it on that party's machine)")
    p = _job_command(sub, "check", _cmd_check, help="preflight one party, then reach every peer over mutual TLS",
                     description="Run the party's preflight, then send a hello to every peer it talks to and "
                                 "print a table: peer, address, reachable, certificate ok, round-trip time. "
                                 "The peers must be running (`secureflhv party`, waiting for partners).")
    p.add_argument("--party", required=True, help="this machine's party id")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to reach each peer (default %(default)s)")
    p.add_argument("--insecure", action="store_true", help="plaintext gRPC (testing only)")


def _add_party_and_run(sub) -> None:
    """``secureflhv party`` and ``secureflhv run`` (the same options but ``--party`` / ``--timeout``)."""
    for name, func, text in (
        ("party", _cmd_party, "run one party of a job (one per organisation)"),
        ("run", _cmd_run, "run every party of a job on this machine as separate processes"),
    ):
        p = _job_command(sub, name, func, help=text, description=text, job_help="the job file (YAML)")
        if name == "party":
            p.add_argument("--party", required=True, help="the id of the party to run, as in the job file")
        else:
            p.add_argument("--timeout", type=float, default=None, help="stop every party after this many seconds")
        p.add_argument("--insecure", action="store_true",
                       help="plaintext gRPC without TLS or peer authentication (testing only; logs a warning)")
        p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
        p.add_argument("--resume", action="store_true",
                       help="continue from the last checkpoint every party completed (every family)")
        _add_job_page_options(p, "every party of the job" if name == "run" else "this party")


def _add_predict(sub) -> None:
    """``secureflhv predict``."""
    p = sub.add_parser("predict", help="write the prediction job of a trained job (new rows, same parties)",
                       description="Write a job file with algorithm: predict from a training job file: the same "
                                   "parties, addresses and certificates, data pointing at the new tables, "
                                   "params.model_dir at the trained bundles (<output_dir>/<party>/model/). "
                                   "Run it like any job; the guest writes predictions.csv.")
    p.add_argument("train_job", type=Path, help="the training job file")
    p.add_argument("--data", action="append", default=[], metavar="ID=PATH",
                   help="party ID's new table (repeatable; parties not named keep their training data path)")
    p.add_argument("--out", type=Path, default=Path("predict.yaml"), help="job file to write (default %(default)s)")
    p.add_argument("--model", type=Path, help="the bundles' folder (default: the training job's output_dir)")
    p.add_argument("--job-id", help="id of the prediction job (default: TRAIN-ID-predict)")
    p.add_argument("--output-dir", default="predictions", help="its output_dir (default %(default)s)")
    p.set_defaults(func=_cmd_predict)


def _cmd_serve(args: argparse.Namespace) -> int:
    from .runtime.serve.runner import ServeOptions, run_serve

    opts = ServeOptions(model_dir=args.model, store=args.store, http_port=None if args.http_port < 0 else args.http_port,
                        grpc_port=None if args.grpc_port < 0 else args.grpc_port, bind=args.bind,
                        timeout_s=args.timeout, rate=args.rate, burst=args.burst, max_batch=args.max_batch,
                        deadline_s=args.deadline, ports_file=args.ports_file)
    return run_serve(Path(args.job), args.party, opts, insecure=args.insecure)


def _add_serve(sub) -> None:
    """``secureflhv serve``."""
    p = _job_command(sub, "serve", _cmd_serve, help="serve a trained vertical model online (one process per party)",
                     description="Start one party's long-running prediction service of a trained vertical model "
                                 "(vertical_lr, secureboost_vertical, vertical_nn): every party of the model runs "
                                 "it with the model's prediction job file (`secureflhv predict`). The guest takes "
                                 "requests (ids and its own feature values) over HTTP/JSON (POST /v1/score; GET "
                                 "/healthz, /readyz, /v1/stats; POST /v1/swap from this machine) and optionally "
                                 "gRPC; each host reads its features per request from its feature store. Scores "
                                 "equal the prediction job's. Stop with Ctrl-C or SIGTERM. See docs/serving.md.",
                     job_help="the model's prediction job file (algorithm: predict)")
    p.add_argument("--party", required=True, help="this machine's party id")
    p.add_argument("--model", help="the bundles' folder (default: the job's params.model_dir)")
    p.add_argument("--store", help="host: feature store, a SQLite file or sqlite:///PATH or postgresql://... URL "
                                   "(default: built at start from the party's data.path into its output folder)")
    p.add_argument("--http-port", type=int, default=8470, help="guest: HTTP/JSON port (0: any free; -1: off; "
                                                                "default %(default)s)")
    p.add_argument("--grpc-port", type=int, default=-1, help="guest: gRPC request port (0: any free; default off)")
    p.add_argument("--bind", default="127.0.0.1", help="guest: address of the request ports (default %(default)s: "
                                                        "this machine only)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a request may take (default %(default)s)")
    p.add_argument("--rate", type=float, default=200.0, help="requests per second per caller (default %(default)s)")
    p.add_argument("--burst", type=int, default=400, help="requests a caller may send at once (default %(default)s)")
    p.add_argument("--max-batch", type=int, default=64, help="most ids per request (default %(default)s)")
    p.add_argument("--deadline", type=float, default=10.0, help="seconds a party waits for another within a request; "
                                                               "a host that is down is named after it (default "
                                                               "%(default)s)")
    p.add_argument("--ports-file", type=Path, help="guest: write the bound ports here (JSON) once ready")
    p.add_argument("--insecure", action="store_true", help="plaintext gRPC between parties (testing only)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), set up logging and run the subcommand; returns its exit
    code, 2 on an invalid job file, 130 on Ctrl-C."""
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stdout)
    from .runtime.job.load import JobConfigError

    try:
        return int(args.func(args) or 0)
    except JobConfigError as exc:
        print(f"secureflhv: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
