"""Preflight of a vertical SecureBoost job: empty numeric cells pass (the trees learn default directions
for missing values), an infinite value is still named with file, column and row."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from secureflhv.runtime.job.load import load_job_params
from secureflhv.runtime.job.preflight import preflight

from job_harness import HOST, make_job


def _secureboost_job(tmp_path: Path, value: str) -> Path:
    lines = HOST.splitlines()
    header = lines[0].split(",")
    cells = lines[3].split(",")
    cells[header.index("h2")] = value
    lines[3] = ",".join(cells)
    job = make_job(tmp_path, host="\n".join(lines) + "\n")
    doc = yaml.safe_load(job.read_text())
    doc["job"]["algorithm"] = "secureboost_vertical"
    doc["params"] = {"n_trees": 2, "key_bits": 1024}
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    return job


def test_empty_numeric_cell_passes_for_secureboost(tmp_path):
    cfg, params = load_job_params(_secureboost_job(tmp_path, ""))
    assert preflight(cfg, "host-1", params) == []


@pytest.mark.parametrize("value", ["inf", "abc"])
def test_infinite_or_text_cell_is_still_named(tmp_path, value):
    cfg, params = load_job_params(_secureboost_job(tmp_path, value))
    findings = preflight(cfg, "host-1", params)
    found = next(f for f in findings if f.column == "h2")
    assert found.row == 3 and found.file.name == "host_1.csv"
