"""Scaffolding the examples share: command line, work folder, launching the parties, reading results.

Each example is a script (``python examples/<name>.py``), so this folder is on ``sys.path`` and
``import _common`` finds this module; importing it puts the repository root on ``sys.path`` too, so
the examples run from a checkout without installing ``secureflhv``. The job files themselves are
written by :mod:`secureflhv.runtime.job.demo` (shared with the end-to-end tests).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def example_parser(doc: str, work_name: str, contents: str, run_time: str) -> argparse.ArgumentParser:
    """An argument parser with the example's summary, its expected run time and ``--work-dir``.

    ``--work-dir`` defaults to ``runs/<work_name>`` in the repository (whatever the current folder);
    ``contents`` names what it holds besides certificates, job file and outputs. Defaults are shown.
    """
    summary = doc.split("\n\n")[0]
    ap = argparse.ArgumentParser(description=f"{summary} Expected run time: {run_time}. Writes under "
                                             f"runs/{work_name}/ in the repository (--work-dir to change).",
                                 epilog="See the module docstring for more.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--work-dir", type=Path, default=ROOT / "runs" / work_name,
                    help=f"folder for {contents}, certificates, job file and outputs (emptied first)")
    return ap


def add_run_arguments(ap: argparse.ArgumentParser, timeout_s: float) -> None:
    """``--seed`` and ``--timeout`` (seconds after which every party is stopped)."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=timeout_s, help="stop every party after this many seconds")


def start(work_dir: Path):
    """(a ``rich`` console, the work folder made absolute, emptied and created)."""
    from rich.console import Console

    work = Path(work_dir).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return Console(highlight=False), work


def launch(job_path: Path, work: Path, console, *, parties: str, party: str, timeout_s: float,
           intro: str = "") -> tuple[int, dict | None]:
    """Say what runs, then run every party of ``job_path`` as its own process (the launcher).

    ``intro`` + where the job file and certificates are + ``parties`` (who talks, and how) are printed
    on ``console`` first. Returns (the job's exit code, the ``metrics.json`` that ``party`` wrote under
    ``work/out``, or None when the job failed, which is then said on ``console``).
    """
    from secureflhv.runtime.job.load import load_job
    from secureflhv.runtime.process.launcher import Launcher

    console.print(f"{intro}job file {job_path}; certificates in {work / 'certs'}; {parties}")
    rc = Launcher(job_path, load_job(job_path)).run(timeout_s=timeout_s)
    if rc != 0:
        console.print("the federated job failed; see the party logs above", style="bold red")
        return rc, None
    return rc, json.loads((work / "out" / party / "metrics.json").read_text())
