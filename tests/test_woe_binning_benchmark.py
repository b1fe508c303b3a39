"""benchmarks/woe_binning.py: a tiny --quick run (1024-bit test key) reports positive times and bytes, the
counts the guest decrypts equal the centralised numpy counts, and a recorded row carries the FATE citation."""
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import woe_binning as wb  # noqa: E402


def test_quick_run_reports_positive_figures_and_the_centralised_counts(capsys, tmp_path):
    docs = ROOT / "docs" / "benchmarks.json"
    before = docs.read_text() if docs.exists() else None
    res = wb.main(["--quick", "--rows", "1000", "--features", "5", "--guest-features", "2"])
    out = capsys.readouterr().out
    assert (docs.read_text() if docs.exists() else None) == before  # --quick records nothing
    enc, plain, cen = res["enc"], res["plain"], res["central"]
    assert res["bits"] == 1024 and enc["backend"] == "paillier" and plain["backend"] == "identity"
    for r in (enc, plain):
        assert r["total"] > 0 and r["g2h"] > 0 and r["h2g"] > 0 and len(r["counts"]) == 5
        for got, want in zip(r["counts"], cen["counts"]):
            assert np.array_equal(got, want)
        assert np.array_equal(r["iv"], cen["iv"]) and np.all(cen["iv"] >= 0)
    for phase in ("encrypt", "histogram", "decrypt", "woe_iv", "keygen"):
        assert enc[phase] > 0, phase
    assert enc["g2h"] > plain["g2h"]  # ciphertexts, not 8-byte floats
    assert all(c.sum() == 1000 for c in cen["counts"])
    assert res["counts_equal"] == {"enc": True, "plain": True} and res["iv_equal"]
    assert "s/feature" in out and "kB/feature" in out and "counts equal the centralised counts: paillier True" in out
    assert wb.FATE_URL in out and "other hardware" in out

    wb.record(res, res["args"], res["bits"], tmp_path)
    row = json.loads((tmp_path / "benchmarks.json").read_text())["rows"]["woe_binning"]
    assert "1,000 rows x 5 host features" in row["what"] and wb.FATE_URL in row["baseline"]
    assert "identity" in row["ratio"] and "guest" in row["bytes"]
