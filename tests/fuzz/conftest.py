"""Fuzz suite fixtures: one honest in-process run of each protocol, its captured messages and parsers."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_net import network_class  # noqa: E402
from protocols import PROTOCOLS  # noqa: E402

_HONEST: dict[str, tuple] = {}


def honest(run: str):
    """(fingerprint, captures) of the honest run ``run`` (run once per worker process)."""
    if run not in _HONEST:
        fp, errors, nets = PROTOCOLS[run](network_class())
        assert not errors, f"honest {run} run failed: {errors}"
        _HONEST[run] = (fp, [c for n in nets for c in n.captured])
    return _HONEST[run]


@pytest.fixture(scope="session")
def captures():
    class Lazy(dict):
        def __missing__(self, run):
            return honest(run)[1]
    return Lazy()


def live_captures(tag: str, run: str):
    """One capture per receiver of ``tag``: the latest whose parse callback still accepts its own honest
    payload after the run (parsers closing over loop state, e.g. the tree depth, only fit their last use)."""
    out = {}
    for c in reversed(honest(run)[1]):
        if c.tag != tag or c.receiver in out:
            continue
        try:
            c.parse(c.payload)
        except Exception:  # noqa: BLE001 - a stale closure: an earlier capture may still fit
            continue
        out[c.receiver] = c
    return [out[r] for r in sorted(out)]
