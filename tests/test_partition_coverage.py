"""The coverage table of docs/partitions.md (algorithm × partition -> test) is complete, every test it names
exists, and the page shows exactly what tests/partition_coverage.py claims. See that module for the rules."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import partition_coverage as pc

ROOT = Path(__file__).resolve().parents[1]


def _cited() -> set[str]:
    return {t for r in pc.ROWS for c in r.cells.values() for t in c.tests}


def _collected(session_items) -> set[str]:
    """Node ids of the suite: this session's own items when it collected the cited files (``make test``), else
    a ``--collect-only`` run over just those files."""
    have = {item.nodeid for item in session_items}
    cited = _cited()
    if cited <= have:
        return have
    files = sorted({t.split("::")[0] for t in cited})
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    return {line.strip() for line in out.stdout.splitlines() if "::" in line}


def test_every_cell_of_every_family_is_claimed_once():
    names = [r.name for r in pc.ROWS]
    assert len(names) == len(set(names))
    for r in pc.ROWS:
        schemes = pc.HORIZONTAL if r.family == "horizontal" else pc.VERTICAL
        assert tuple(r.cells) == schemes, f"{r.name}: cells {sorted(r.cells)} != schemes {schemes}"
        for scheme, cell in r.cells.items():
            assert cell.status in (pc.PROCESSES, pc.IN_PROCESS) or cell.status.startswith("n/a: "), (r.name, scheme)
            assert bool(cell.tests) != cell.status.startswith("n/a"), f"{r.name} × {scheme}: {cell}"
    assert {r.family for r in pc.ROWS} == {"horizontal", "vertical"}


def test_every_named_test_exists(request):
    missing = sorted(_cited() - _collected(request.session.items))
    assert not missing, "coverage table names tests that do not exist:\n" + "\n".join(missing)


def test_a_processes_cell_names_a_test_that_starts_party_processes():
    """A cell marked ``processes`` cites a test from a module that launches parties as processes."""
    launchers = ("run_job(", "run_grpc_job(", 'run_cli("run"', "Launcher(", ".Process(", "Popen(", "subprocess.")
    for r in pc.ROWS:
        for scheme, cell in r.cells.items():
            if cell.status == pc.PROCESSES:
                sources = {(ROOT / t.split("::")[0]).read_text() for t in cell.tests}
                assert any(any(k in s for k in launchers) for s in sources), (r.name, scheme)


def test_the_page_shows_the_claims():
    if pc.documented() != pc.render():
        pytest.fail("docs/partitions.md's coverage table is stale: run `python tests/partition_coverage.py --write`")
