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
    import gmpy2  # the row names the GMP under gmpy2: the wheel's is ~25% slower at powmod than Debian's
    assert f"gmpy2 {gmpy2.version()} on {gmpy2.mp_version()}" in rows["psi"]["measured"]
    table = (tmp_path / "benchmarks.md").read_text()
    assert table.index("| Paillier |") < table.index("| PSI |")  # ORDER, not insertion order
    assert "bytes on the wire per party" in table and "| 3 MB |" in table


def test_record_names_the_missing_column(tmp_path):
    with pytest.raises(ValueError, match="ratio"):
        _report.record("psi", dict(what="PSI", ours="1 s", baseline="2 s"), tmp_path)


def test_update_readme_diff_shows_a_new_row_and_writes_nothing(tmp_path):
    (tmp_path / "benchmarks.json").write_text((ROOT / "docs" / "benchmarks.json").read_text())
    _report.record("vertical_lr_ou", dict(what="vertical LR, OU", ours="1 s", baseline="2 s", ratio="3×"), tmp_path)
    text = (ROOT / "README.md").read_text()
    out = update_readme.diff(text, update_readme.generated(text, tmp_path))
    assert "+| vertical LR, OU | 1 s | 2 s | 3× |" in out
    assert update_readme.diff(text, text) == ""


def test_run_all_default_set_is_short_and_names_real_scripts():
    run_all = pytest.importorskip("run_all")
    steps = run_all.plan("default", None)
    assert sum(s for _, _, s in steps) <= 15 * 60
    for which in ("default", "full", "quick"):
        for bench, _, _ in run_all.plan(which, None):
            assert (ROOT / "benchmarks" / f"{bench.script}.py").exists(), bench.script


def test_counting_backend_tallies_the_run_and_prices_it():
    import numpy as np
    _heops = pytest.importorskip("_heops")
    he = _heops.counting_backend("identity")
    pub, priv = he.generate_keypair(2048, False)
    enc = he.encrypt(pub, np.zeros(10))
    he.dot(np.ones((10, 3)), enc)
    masked, _ = he.mask(pub, he.dot(np.ones((10, 3)), enc))
    he.decrypt_masked(priv, masked)
    assert dict(he.counts) == {"encrypt": 10, "dot": 60, "mask": 3, "decrypt": 3}
    secs, text = _heops.priced(he.counts, {"encrypt": 10.0, "dot": 60.0, "decrypt": 3.0}, epochs=1)
    assert secs == pytest.approx(1 + 0.3 + 1 + 1) and "dot 60" in text
