"""The ``secureflhv`` command.

    secureflhv certs --job JOB            CA + one certificate per party of a job (mutual TLS)
    secureflhv validate JOB               check a job file and print what it describes
    secureflhv party JOB --party ID       run one party (what each organisation runs on its machine)
    secureflhv run JOB                    run every party of a job on this machine, as separate processes
    secureflhv partition ...              split a dataset into non-IID party shards, with statistics and a plot
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from . import __version__

log = logging.getLogger("secureflhv")


def _cmd_certs(args: argparse.Namespace) -> int:
    from .transport.certs import generate_certificates

    parties = list(args.parties)
    if args.job:
        from .runtime.config import load_job

        parties += [p.id for p in load_job(args.job).parties]
    if not parties:
        print("secureflhv certs: name the parties (positional) or give --job JOB", file=sys.stderr)
        return 2
    try:
        paths = generate_certificates(Path(args.out), sorted(set(parties)), days=args.days,
                                      hostnames=tuple(args.hostname), overwrite=args.overwrite)
    except FileExistsError as exc:
        print(f"secureflhv certs: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"secureflhv certs: {exc}", file=sys.stderr)
        return 2
    print(f"wrote the CA and {len(paths['parties'])} party certificates to {args.out}")
    for name, files in sorted(paths["parties"].items()):
        print(f"  {name}: " + ", ".join(str(f) for f in (files.values() if isinstance(files, dict) else [files])))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from .runtime.config import load_job
    from .runtime.registry import job_spec

    cfg = load_job(args.job)
    spec = job_spec(cfg.job.algorithm)
    print(f"job {cfg.job.id!r}: algorithm {spec.name} ({spec.family}: {spec.summary}), {len(cfg.parties)} parties, "
          f"{'PLAINTEXT (insecure)' if cfg.security.insecure else 'mutual TLS'}")
    for p in cfg.parties:
        data = f" data={cfg.resolve(p.data.path)}" if p.data else ""
        print(f"  {p.role:6s} {p.id:12s} {p.address}{data}")
    return 0


def _cmd_party(args: argparse.Namespace) -> int:
    from .runtime.party import run_party

    return run_party(Path(args.job), args.party, insecure=args.insecure)


def _cmd_run(args: argparse.Namespace) -> int:
    from .runtime.config import load_job
    from .runtime.launcher import Launcher

    cfg = load_job(args.job)
    extra = ["--log-level", args.log_level] + (["--insecure"] if args.insecure else [])
    return Launcher(Path(args.job), cfg, extra_args=extra).run(timeout_s=args.timeout)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="secureflhv",
        description="Secure cross-silo federated learning over gRPC with mutual TLS.",
        epilog="Run one party per organisation with `secureflhv party JOB --party ID`; "
               "`secureflhv run JOB` starts all parties on this machine for a demo or test.")
    parser.add_argument("--version", action="version", version=f"secureflhv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("certs", help="generate a CA and one TLS certificate per party",
                       description="Generate a certificate authority and, for each party, a key and a certificate "
                                   "whose common name is the party id (checked against the sender of every message).")
    p.add_argument("parties", nargs="*", help="party ids (added to those of --job)")
    p.add_argument("--job", type=Path, help="take the party ids from this job file")
    p.add_argument("--out", default="certs", help="output folder (default: %(default)s)")
    p.add_argument("--days", type=int, default=365, help="validity in days (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace existing keys and certificates")
    p.add_argument("--hostname", action="append", default=["localhost", "127.0.0.1"],
                   help="extra DNS name or IP the certificates are valid for (repeatable)")
    p.set_defaults(func=_cmd_certs)

    p = sub.add_parser("validate", help="check a job file", description="Validate a job file and summarise it.")
    p.add_argument("job", type=Path)
    p.set_defaults(func=_cmd_validate)

    for name, func, text in (
        ("party", _cmd_party, "run one party of a job (one per organisation)"),
        ("run", _cmd_run, "run every party of a job on this machine as separate processes"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("job", type=Path, help="the job file (YAML)")
        if name == "party":
            p.add_argument("--party", required=True, help="the id of the party to run, as in the job file")
        else:
            p.add_argument("--timeout", type=float, default=None, help="stop every party after this many seconds")
        p.add_argument("--insecure", action="store_true",
                       help="plaintext gRPC without TLS or peer authentication (testing only; logs a warning)")
        p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
        p.set_defaults(func=func)

    from .data import partition_cli

    p = sub.add_parser("partition", help="split a dataset into non-IID party shards",
                       description="Partition a dataset over parties with a non-IID scheme (NIID-Bench and the "
                                   "survey's categories), write each party's shard, print statistics, save a plot.")
    partition_cli.add_arguments(p)
    p.set_defaults(func=partition_cli.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stdout)
    from .runtime.config import JobConfigError

    try:
        return int(args.func(args) or 0)
    except JobConfigError as exc:
        print(f"secureflhv: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
