"""Shared code of the ``parties/`` launch scripts: check the role, then run ``secureflhv party``."""
import argparse

from secureflhv.cli import main
from secureflhv.runtime.job.load import JobConfigError, load_job


def run_role(role: str, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=f"Run the {role} of a secureflhv job (one party per machine).")
    ap.add_argument("job", help="the job file (YAML)")
    ap.add_argument("--party", help=f"party id (default: the job's only {role})")
    ap.add_argument("--insecure", action="store_true", help="plaintext gRPC (testing only)")
    args = ap.parse_args(argv)
    try:
        cfg = load_job(args.job)
    except JobConfigError as exc:
        ap.exit(2, f"{exc}\n")
    candidates = [p.id for p in cfg.parties if p.role == role]
    party = args.party or (candidates[0] if len(candidates) == 1 else None)
    if party not in candidates:
        ap.exit(2, f"choose --party among the job's {role}s: {candidates}\n")
    return main(["party", args.job, "--party", party] + (["--insecure"] if args.insecure else []))
