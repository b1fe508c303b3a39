"""Streamed vertical preparation (data.max_memory_mb): ids first, PSI, then only the common rows' features.

The result must be bit-identical to reading the whole table (CSV and Parquet, guest and host,
categorical columns, missing cells), and its peak memory bounded by the aligned matrix plus a batch.
"""
import threading

import numpy as np
import pandas as pd
import pytest

from secureflhv.runtime.job.data_prep import (StandardisedSplitParams, ValidationSplitParams,
                                              prepare_vertical, streamed_batch_rows)
from secureflhv.runtime.job.job_file import parse_job_file
from secureflhv.transport import InProcessNetwork

SCHEMA_G = {"colour": {"kind": "categorical", "categories": ["red", "green", "blue"]},
            "label": {"kind": "label", "categories": ["no", "yes"]}}  # per-batch inference would differ


def _tables(d, fmt):
    """A guest (string label, a categorical column, gaps) and a host table sharing ~2/3 of their ids,
    in different orders."""
    rng = np.random.default_rng(4)
    n = 90
    g_ids = [f"u{i:03d}" for i in rng.permutation(n)]
    g = pd.DataFrame({"id": g_ids, "a": rng.normal(size=n), "k": rng.integers(0, 5, n).astype(float),
                      "colour": rng.choice(["red", "green", "blue"], n),
                      "label": rng.choice(["no", "yes"], n)})
    g.loc[rng.random(n) < 0.15, "a"] = np.nan
    g.loc[rng.random(n) < 0.15, "colour"] = None
    h_ids = [f"u{i:03d}" for i in rng.permutation(np.arange(30, 30 + n))]
    h = pd.DataFrame({"id": h_ids, "h1": rng.exponential(size=n), "h2": rng.normal(size=n)})
    h.loc[rng.random(n) < 0.2, "h2"] = np.nan
    paths = {}
    for name, df in (("guest", g), ("host", h)):
        paths[name] = d / f"{name}.{fmt}"
        if fmt == "csv":
            df.to_csv(paths[name], index=False, float_format="%.17g")
        else:
            df.to_parquet(paths[name], row_group_size=16)
    return paths


def _config(d, paths, streamed: bool):
    data = {"max_memory_mb": 1e-4, "batch_rows": 7} if streamed else {}
    doc = {"job": {"id": "j", "algorithm": "secureboost_vertical"}, "security": {"ca": "ca.pem"},
           "parties": [
               {"id": "guest", "role": "guest", "address": "127.0.0.1:5002", "cert": "c", "key": "k",
                "data": {"path": str(paths["guest"]), "id_column": "id", "label_column": "label",
                         "table_schema": SCHEMA_G, **data}},
               {"id": "host-1", "role": "host", "address": "127.0.0.1:5003", "cert": "c", "key": "k",
                "data": {"path": str(paths["host"]), "id_column": "id", **data}}]}
    return parse_job_file(doc, base_dir=d)


def _prepare_both(cfg, params, **kw):
    """prepare_vertical at guest and host at once, over the in-process transport."""
    net = InProcessNetwork("j", ["guest", "host-1"], deadline=20.0)
    out, errors = {}, {}

    def run(party):
        try:
            out[party.id] = prepare_vertical(cfg, party, net.transport(party.id), params, **kw)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors[party.id] = exc

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in (cfg.guest, *cfg.hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return out


def _same(a, b):
    """Equal, bit for bit (NaN where NaN), through dicts and lists of arrays."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)) and not isinstance(b, np.ndarray):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype.kind == "f":
            assert np.array_equal(a.view(np.uint64 if a.itemsize == 8 else np.uint32),
                                  b.view(np.uint64 if b.itemsize == 8 else np.uint32))
        else:
            assert np.array_equal(a, b)
    else:
        assert a == b or (a != a and b != b), (a, b)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("preprocess", [False, True])
def test_streamed_preparation_equals_the_whole_table(tmp_path, fmt, preprocess):
    paths = _tables(tmp_path, fmt)
    if preprocess:  # linear / neural families: impute, one-hot, standardise on the aligned rows
        params, kw = StandardisedSplitParams(test_fraction=0.3, split_seed=3), dict(standardize=True,
                                                                                     preprocess=True)
    else:  # trees: raw codes and NaN, with a validation part
        params, kw = ValidationSplitParams(test_fraction=0.3, split_seed=3), dict(validation_fraction=0.25)
    whole_cfg, streamed_cfg = _config(tmp_path, paths, False), _config(tmp_path, paths, True)
    assert streamed_batch_rows(streamed_cfg, streamed_cfg.guest) == 7
    assert streamed_batch_rows(whole_cfg, whole_cfg.guest) is None
    whole, streamed = _prepare_both(whole_cfg, params, **kw), _prepare_both(streamed_cfg, params, **kw)
    for party in ("guest", "host-1"):
        w, s = whole[party], streamed[party]
        assert s.batch_rows == 7 and w.batch_rows is None
        assert len(s.ids) == 60 and np.isnan(s.X).any() == (not preprocess)
        _same(s.X, w.X)
        _same(s.y, w.y)
        _same(s.ids, w.ids)
        for part in ("train", "val", "test"):
            _same(getattr(s.split, part), getattr(w.split, part))
        assert s.feature_names == w.feature_names
        _same(s.meta, w.meta)
    assert streamed["guest"].y.dtype == np.int64 and set(streamed["guest"].y) == {0, 1}
    assert streamed["host-1"].y is None
    assert "colour" in streamed["guest"].meta["input_features"]


def test_a_file_that_changes_between_the_passes_is_refused(tmp_path, monkeypatch):
    """Pass 2 checks that its ids are the ones PSI aligned."""
    from secureflhv.runtime.job import data_prep
    from secureflhv.runtime.job.job_file import JobConfigError

    paths = _tables(tmp_path, "parquet")
    cfg = _config(tmp_path, paths, True)
    real = data_prep.load_party_table

    def swap_after_pass_one(cfg_, party, **kw):
        table = real(cfg_, party, **kw)
        if kw.get("ids_only") and party.role == "host":
            df = pd.read_parquet(paths["host"])
            df["id"] = df["id"].iloc[::-1].to_numpy()  # same ids, other rows
            df.to_parquet(paths["host"], row_group_size=16)
        return table

    monkeypatch.setattr(data_prep, "load_party_table", swap_after_pass_one)
    net = InProcessNetwork("j", ["guest", "host-1"], deadline=20.0)
    t = threading.Thread(target=lambda: prepare_vertical(cfg, cfg.guest, net.transport("guest"),
                                                         ValidationSplitParams()), daemon=True)
    t.start()
    with pytest.raises(JobConfigError, match=r"host.*changed while it was read"):
        prepare_vertical(cfg, cfg.hosts[0], net.transport("host-1"), ValidationSplitParams())
    t.join(30)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_streamed_preflight_finds_what_the_whole_table_check_finds(tmp_path, fmt, monkeypatch):
    """Preflight of a table above data.max_memory_mb checks it one row batch at a time (it never loads
    the whole table), with the same findings: first bad row of the table, counts over all batches,
    a duplicate id across batches, a schema break."""
    from secureflhv.data import loaders
    from secureflhv.runtime.job import preflight as preflight_mod
    from secureflhv.runtime.job.preflight import preflight

    rng = np.random.default_rng(5)
    n = 60
    df = pd.DataFrame({"id": [f"u{i:03d}" for i in range(n)], "a": rng.normal(size=n),
                       "colour": rng.choice(["red", "green", "blue"], n), "label": rng.choice(["no", "yes"], n)})
    df.loc[[20, 41], "a"] = np.nan              # gaps in two batches: one finding, 2 cells, first row 21
    df.loc[33, "a"] = np.inf
    df.loc[50, "id"] = "u012"                   # repeats an id of another batch
    df.loc[47, "colour"] = "mauve"              # not a declared category (the first schema break in
    df.loc[55, "label"] = None                  # file order too: both checks report only the first)
    if fmt == "csv":
        df["a"] = df["a"].astype(object)
        df.loc[37, "a"] = "n.a."                # text in a numeric column
        df.to_csv(tmp_path / "guest.csv", index=False)
    else:
        df.to_parquet(tmp_path / "guest.parquet", row_group_size=16)
    paths = {"guest": tmp_path / f"guest.{fmt}", "host": tmp_path / f"guest.{fmt}"}
    found = {}
    for streamed in (False, True):
        if streamed:  # no whole-table read left: neither preflight's nor load_table's
            for mod in (preflight_mod, loaders):
                monkeypatch.setattr(mod, "_read_frame", lambda *a, **k: pytest.fail("whole table read"))
        cfg = _config(tmp_path, paths, streamed)
        assert (streamed_batch_rows(cfg, cfg.guest) is not None) == streamed
        found[streamed] = [(f.where, f.message, f.row, f.column)
                           for f in preflight(cfg, "guest", None, insecure=True, check_port=False)]
    assert found[True] == found[False]
    text = "\n".join(m for _, m, _, _ in found[True])
    assert "empty cell (missing value) in numeric feature column; 2 such cell(s)" in text
    assert "duplicate id 'u012'" in text and "infinite value" in text
    # the text cell stops the schema check (of a CSV) before the unknown category, in both ways
    assert (fmt == "csv") == ("non-numeric value 'n.a.'" in text) == ("'mauve'" not in text)
    assert fmt == "csv" or "column 'colour' row 48: category 'mauve'" in text  # the table's row
    assert [r for _, m, r, _ in found[True] if "empty cell (missing value) in numeric" in m] == [21]
