"""Streaming tables in row batches (pyarrow datasets) and sketch quantile edges, against pandas on the whole table."""
import numpy as np
import pandas as pd
import pytest

from secureflhv.data.stream import iter_row_batches, sketch_cuts


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"id": [f"u{i}" for i in range(5000)], "a": rng.normal(size=5000),
                       "b": rng.exponential(size=5000), "c": np.full(5000, 3.0)})
    df.loc[::7, "b"] = np.nan
    d = tmp_path_factory.mktemp("stream")
    df.to_csv(d / "t.csv", index=False, float_format="%.17g")
    df.to_parquet(d / "t.parquet", row_group_size=1000)
    return df, d


@pytest.mark.parametrize("name", ["t.csv", "t.parquet"])
def test_batches_are_bounded_and_reassemble_the_table(table, name):
    df, d = table
    batches = list(iter_row_batches(d / name, batch_rows=700, columns=["id", "a", "b"]))
    assert max(len(b) for b in batches) <= 700 and len(batches) >= 8
    whole = pd.concat(batches, ignore_index=True)
    pd.testing.assert_frame_equal(whole, df[["id", "a", "b"]], check_dtype=False)


def test_bad_arguments_are_named(table):
    _, d = table
    with pytest.raises(ValueError, match=r"no column\(s\) \['zz'\]"):
        next(iter_row_batches(d / "t.parquet", columns=["zz"]))
    with pytest.raises(ValueError, match="batch_rows"):
        next(iter_row_batches(d / "t.parquet", batch_rows=0))


def test_sketch_edges_are_within_one_cell_of_the_exact_quantiles(table):
    df, d = table
    cuts = sketch_cuts(d / "t.parquet", ["a", "b", "c"], max_bin=8, sketch_bins=4096, batch_rows=600)
    assert cuts["c"].size == 0  # constant column: nothing to split
    for col in ("a", "b"):
        v = df[col].dropna().to_numpy()
        cell = (v.max() - v.min()) / 4096
        exact = np.quantile(v, np.arange(1, 8) / 8)
        assert cuts[col].shape == (7,) and np.all(np.diff(cuts[col]) > 0)
        assert np.max(np.abs(cuts[col] - exact)) <= 2 * cell
