#!/usr/bin/env python3
"""Run the guest of a job on this machine: `python parties/guest.py JOB --party ID`.

A thin wrapper over `secureflhv party` that also checks the party's role is guest.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from parties._common import run_role  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(run_role("guest", sys.argv[1:]))
