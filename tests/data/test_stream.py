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


@pytest.mark.parametrize("name", ["t.csv", "t.parquet"])
def test_table_read_in_batches_equals_the_whole_table(table, name):
    from secureflhv.data import load_table
    from secureflhv.data.stream import load_table_batched

    _, d = table
    whole = load_table(d / name, id_column="id", label_column="c")
    streamed = load_table_batched(d / name, 7, id_column="id", label_column="c")
    assert streamed.feature_names == whole.feature_names == ["a", "b"]
    np.testing.assert_array_equal(streamed.X, whole.X)  # bit for bit, NaN where empty
    assert (streamed.ids == whole.ids).all() and (streamed.y == whole.y).all() and streamed.y.dtype == whole.y.dtype


def test_batched_table_rejects_duplicate_ids_across_batches(tmp_path):
    from secureflhv.data.loaders import DataError
    from secureflhv.data.stream import load_table_batched

    pd.DataFrame({"id": ["a", "b", "c", "a"], "x": [1.0, 2.0, 3.0, 4.0]}).to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(DataError, match="duplicate ids"):
        load_table_batched(tmp_path / "d.csv", 2, id_column="id")


@pytest.mark.parametrize("max_bin", [2, 16, 33])
def test_batched_quantile_cuts_equal_the_in_memory_cuts(max_bin):
    """The bounded-memory radix selection gives exactly binning.quantile_cuts: ties, NaN, negative
    values and zeros, few distinct values, a wide dynamic range, tiny batches."""
    from secureflhv.data.stream import batched_quantile_cuts, row_batches
    from secureflhv.tree.binning import quantile_cuts

    rng = np.random.default_rng(max_bin)
    for _ in range(8):
        n = int(rng.integers(1, 500))
        X = np.column_stack([rng.normal(size=n), rng.integers(0, 3, n).astype(float), rng.integers(0, 40, n) * 0.5 - 7,
                             np.exp(rng.normal(size=n) * 10), -np.abs(rng.normal(size=n)), np.full(n, np.nan)])
        X[rng.random(X.shape) < 0.2] = np.nan
        X[rng.random(n) < 0.1, 4] = 0.0
        rows = np.flatnonzero(rng.random(n) < 0.8)
        got = batched_quantile_cuts(row_batches(X, rows, int(rng.integers(1, 40))), X.shape[1], max_bin)
        for j, cuts in enumerate(got):
            ref = quantile_cuts(X[rows, j], max_bin)
            assert cuts.dtype == ref.dtype and cuts.shape == ref.shape and (cuts == ref).all(), (j, cuts, ref)
    with pytest.raises(ValueError, match="infinite"):
        batched_quantile_cuts(row_batches(np.array([[1.0], [np.inf]]), np.arange(2), 1), 1, 4)
