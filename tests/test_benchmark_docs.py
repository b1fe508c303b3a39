"""The README's benchmark table is generated from docs/benchmarks.json (benchmarks/_report.py)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
_report = pytest.importorskip("_report")
update_readme = pytest.importorskip("update_readme")


def test_readme_table_matches_recorded_figures():
    text = (ROOT / "README.md").read_text()
    assert update_readme.generated(text) == text, "run benchmarks/update_readme.py"


def test_docs_markdown_matches_json(tmp_path):
    (tmp_path / "benchmarks.json").write_text((ROOT / "docs" / "benchmarks.json").read_text())
    _report.render(tmp_path)
    assert (tmp_path / "benchmarks.md").read_text() == (ROOT / "docs" / "benchmarks.md").read_text()


def test_record_stamps_and_orders_rows(tmp_path):
    _report.record("psi", dict(what="PSI", ours="1 s", baseline="2 s", ratio="2×", bytes="3 MB"), tmp_path)
    _report.record("paillier", dict(what="Paillier", ours="a", baseline="b", ratio="c"), tmp_path)
    rows = json.loads((tmp_path / "benchmarks.json").read_text())["rows"]
    assert "cores" in rows["psi"]["measured"]
    table = (tmp_path / "benchmarks.md").read_text()
    assert table.index("| Paillier |") < table.index("| PSI |")  # ORDER, not insertion order
    assert "bytes on the wire per party" in table and "| 3 MB |" in table


def test_record_names_the_missing_column(tmp_path):
    with pytest.raises(ValueError, match="ratio"):
        _report.record("psi", dict(what="PSI", ours="1 s", baseline="2 s"), tmp_path)
