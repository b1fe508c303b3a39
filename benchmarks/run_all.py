#!/usr/bin/env python3
"""Run every benchmark's recorded configuration in sequence, then regenerate the README's table.

Meant for a quiet machine: each benchmark measures its baseline in the same run and records its rows in
``docs/benchmarks.json`` / ``docs/benchmarks.md`` (``_report.py``); ``update_readme.py`` then rewrites the
README's table from them. The default set stays under ~15 minutes on 2 idle cores; ``--full`` adds the big
configurations (SecureBoost in FATE's shape, 1024/3072-bit Paillier, Ray scaling, the WAN test bed, the
NIID accuracy grid) and takes hours. ``--quick`` runs each benchmark's smoke configuration (nothing recorded)
and shows the README diff without writing it.

    python benchmarks/run_all.py --dry-run        # the plan and its time estimate, nothing run
    python benchmarks/run_all.py                  # default set, then update_readme.py
    python benchmarks/run_all.py --only psi secagg
    python benchmarks/run_all.py --quick          # smoke runs, README diff only
    make bench-all                                # the default set

Flower's SecAgg+ is measured beside ours when ``SECUREFLHV_FLOWER_PYTHON`` names an interpreter with
``flwr[simulation]`` (its own venv: Flower pins an older protobuf; see ``secagg.py``).

Estimates are wall-clock seconds on 2 idle cores (from the figures in docs/benchmarks.md and issue 18);
the elapsed time of each run is printed beside its estimate. A failing benchmark is reported and the
others still run; the exit status is 1 if any failed.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Bench:
    """One benchmark script: its arguments and estimated seconds per set (``None``: not in that set)."""
    script: str
    default: tuple[str, ...] | None
    default_s: float
    full: tuple[str, ...] | None
    full_s: float
    quick_s: float
    note: str = ""


BENCHMARKS = (
    Bench("paillier", ("--bits", "2048"), 120, (), 300, 20, "2048-bit in the default set; 1024/3072 with --full"),
    Bench("vertical_lr", (), 150, (), 150, 25, "breast cancer + 100,000 rows, Paillier and OU"),
    Bench("psi", (), 100, (), 100, 12, "1,000,000 x 1,000,000, ECDH-PSI and KKRT-PSI"),
    Bench("secagg", (), 90, (), 90, 50, "10 clients x 1,000,000, mutual TLS; + ~3 min when Flower is measured"),
    Bench("secureboost", ("--only", "a", "--he-scheme", "paillier", "ou"), 60,
          ("--he-scheme", "paillier", "ou"), 1500, 30, "(a) in the default set; (b), FATE's shape, with --full"),
    Bench("woe_binning", None, 0, (), 180, 10, "100,000 x 300 host features, Paillier 2048-bit: --full only"),
    Bench("serving", None, 0, (), 540, 130, "secureflhv serve, LR / SecureBoost / split NN x 1 and 64 ids, 2048-bit: "
                                           "--full only"),
    Bench("split_nn", (), 150, (), 150, 60, "Paillier and OU, + label-leakage sweep"),
    Bench("partition", (), 15, (), 15, 2, "1,000,000 rows x 100 parties"),
    Bench("fl_batched", (), 30, (), 30, 10, "vmap vs per-client loop"),
    Bench("byom_throughput", (), 60, (), 60, 40, "ResNet-8 through the user-model path vs Flower (SecAgg+), when .venv-flower exists"),
    Bench("scale", None, 0, (), 400, 90, "Ray 1 and 2 workers: --full only"),
    Bench("wan", None, 0, (), 900, 300, "needs root (network namespaces): --full only"),
    Bench("niid_accuracy", None, 0, (), 3600, 120, "the accuracy grid (docs/niid_accuracy.md): --full only"),
)


def plan(which: str, only: list[str] | None) -> list[tuple[Bench, list[str], float]]:
    """``[(bench, argv, estimated seconds)]`` for ``which`` in {"default", "full", "quick"}."""
    out = []
    for b in BENCHMARKS:
        if only and b.script not in only:
            continue
        if which == "quick":
            out.append((b, ["--quick"], b.quick_s))
        elif which == "full" and b.full is not None:
            out.append((b, list(b.full), b.full_s))
        elif which == "default" and b.default is not None:
            out.append((b, list(b.default), b.default_s))
    return out


def _fmt(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__[__doc__.index("    python"):])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", help="the big configurations too (hours)")
    mode.add_argument("--quick", action="store_true", help="smoke runs, nothing recorded, README diff only")
    ap.add_argument("--only", nargs="+", choices=[b.script for b in BENCHMARKS], help="only these benchmarks")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the estimate, run nothing")
    ap.add_argument("--no-readme", action="store_true", help="do not run update_readme.py at the end")
    args = ap.parse_args(argv)
    which = "full" if args.full else "quick" if args.quick else "default"
    steps = plan(which, args.only)
    total = sum(s for _, _, s in steps)
    print(f"{which} set: {len(steps)} benchmark(s), estimated {_fmt(total)} on 2 idle cores "
          f"(load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    for b, a, s in steps:
        print(f"  {b.script + '.py ' + ' '.join(a):<58} ~{_fmt(s):>8}  {b.note}")
    if args.dry_run:
        return 0
    failed, t_all = [], time.perf_counter()
    for b, a, s in steps:
        cmd = [sys.executable, str(HERE / f"{b.script}.py"), *a]
        print(f"\n=== {b.script}.py {' '.join(a)} (estimate {_fmt(s)}, load average "
              f"{os.getloadavg()[0]:.1f})", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd, cwd=HERE.parent)
        took = time.perf_counter() - t0
        print(f"=== {b.script}.py: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {_fmt(took)} "
              f"(estimate {_fmt(s)})", flush=True)
        if rc != 0:
            failed.append(b.script)
    print(f"\nall done in {_fmt(time.perf_counter() - t_all)} (estimate {_fmt(total)})"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    if not args.no_readme:
        readme = [sys.executable, str(HERE / "update_readme.py")] + (["--diff"] if args.quick else [])
        if subprocess.call(readme, cwd=HERE.parent) != 0:
            failed.append("update_readme")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
