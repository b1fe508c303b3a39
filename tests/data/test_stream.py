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


@pytest.fixture(scope="module")
def coded(tmp_path_factory):
    """A table with a declared categorical column and a label, gaps in both kinds of feature column."""
    rng = np.random.default_rng(1)
    n = 200
    df = pd.DataFrame({"id": [f"k{i}" for i in rng.permutation(n)], "x": rng.normal(size=n),
                       "shade": rng.choice(["dark", "light"], n), "y": rng.choice(["a", "b", "c"], n)})
    df.loc[rng.random(n) < 0.2, "x"] = np.nan
    df.loc[rng.random(n) < 0.2, "shade"] = None
    d = tmp_path_factory.mktemp("coded")
    df.to_csv(d / "t.csv", index=False, float_format="%.17g")
    df.to_parquet(d / "t.parquet", row_group_size=30)
    schema = {"shade": {"kind": "categorical", "categories": ["dark", "light"]},
              "y": {"kind": "label", "categories": ["a", "b", "c"]}}
    return d, schema


@pytest.mark.parametrize("name", ["t.csv", "t.parquet"])
def test_ids_then_chosen_rows_equal_the_whole_table_indexed(coded, name):
    """The two passes of a streamed vertical preparation: ids and labels only, then only the chosen
    rows (in any order) copied to their places: bit for bit load_table's table indexed by those rows."""
    from secureflhv.data import load_table
    from secureflhv.data.stream import load_ids_batched, load_table_batched

    d, schema = coded
    kw = dict(id_column="id", label_column="y", schema=schema)
    whole = load_table(d / name, **kw)
    keys = load_ids_batched(d / name, 9, **kw)
    assert keys.X.shape == (200, 0) and keys.label_names == whole.label_names == ["a", "b", "c"]
    assert (keys.ids == whole.ids).all() and (keys.y == whole.y).all() and keys.y.dtype == whole.y.dtype
    rows = np.random.default_rng(2).permutation(200)[:70]
    rows[:2] = [0, 199]  # the first and the last row
    part = load_table_batched(d / name, 9, rows=rows, **kw)
    assert part.feature_names == whole.feature_names == ["x", "shade"] and part.categories == whole.categories
    assert np.isnan(part.X).any(axis=0).all()  # gaps in the numeric and in the categorical column
    assert np.array_equal(part.X.view(np.uint64), whole.X[rows].view(np.uint64))
    assert (part.ids == whole.ids[rows]).all() and (part.y == whole.y[rows]).all() and part.y.dtype == whole.y.dtype
    all_rows = load_table_batched(d / name, 9, **kw)  # without rows: the whole table, CSV gaps included
    assert np.array_equal(all_rows.X.view(np.uint64), whole.X.view(np.uint64))


def test_chosen_rows_out_of_range_are_refused(coded):
    from secureflhv.data.loaders import DataError
    from secureflhv.data.stream import load_table_batched

    d, schema = coded
    with pytest.raises(DataError, match="rows out of range for a table of 200 rows"):
        load_table_batched(d / "t.parquet", 9, id_column="id", label_column="y", schema=schema, rows=[3, 200])


def test_streamed_alignment_peak_is_the_aligned_matrix_plus_batches(tmp_path):
    """Traced (numpy) peak of the two passes for N rows x d features of which a fraction f is common:
    below f*N*d*8 plus the ids (a few copies) and a few batches, where reading the whole table and
    indexing it (the former path) takes more than N*d*8*(1+f)."""
    import tracemalloc

    from secureflhv.data.stream import load_ids_batched, load_table_batched

    N, d, f, B = 12_000, 60, 0.2, 400
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(N, d)), columns=[f"x{j}" for j in range(d)])
    df.insert(0, "id", [f"r{i}" for i in range(N)])
    df.to_parquet(tmp_path / "t.parquet", row_group_size=B)
    del df
    rows = rng.permutation(np.flatnonzero(rng.random(N) < f))

    def peak(fn):
        tracemalloc.start()
        try:
            out = fn()
            return tracemalloc.get_traced_memory()[1], out
        finally:
            tracemalloc.stop()

    old, X_old = peak(lambda: load_table_batched(tmp_path / "t.parquet", B, id_column="id").X[rows])

    def two_passes():
        keys = load_ids_batched(tmp_path / "t.parquet", B, id_column="id")
        return keys.ids.nbytes, load_table_batched(tmp_path / "t.parquet", B, id_column="id", rows=rows).X

    new, (ids_bytes, X_new) = peak(two_passes)
    assert np.array_equal(X_new, X_old)
    aligned, batch = len(rows) * d * 8, B * d * 8
    assert old > N * d * 8 * (1 + f)
    assert new < aligned + 6 * ids_bytes + 4 * batch, (new, aligned, ids_bytes, batch)
    assert new < old / 2


def test_batched_errors_name_the_tables_row_and_gaps_are_judged_on_the_whole_column(tmp_path):
    """A schema break in a later batch names the table's row (not the batch's); a declared column that
    is empty in one batch only is fine (as in load_table), empty in every batch is refused."""
    from secureflhv.data import load_table
    from secureflhv.data.schema import SchemaError
    from secureflhv.data.stream import load_table_batched

    schema = {"c": {"kind": "categorical", "categories": ["p", "q"]}, "v": "numeric"}
    df = pd.DataFrame({"id": [f"i{k}" for k in range(20)], "c": ["p", "q"] * 10, "v": np.arange(20.0)})
    df.loc[0:5, "c"] = None  # the whole first batch of 6 rows
    df.to_csv(tmp_path / "ok.csv", index=False)
    whole = load_table(tmp_path / "ok.csv", id_column="id", schema=schema)
    got = load_table_batched(tmp_path / "ok.csv", 6, id_column="id", schema=schema)
    assert np.array_equal(got.X, whole.X, equal_nan=True) and np.isnan(got.X[:6, 0]).all()
    df.loc[13, "c"] = "zz"
    df.to_parquet(tmp_path / "bad.parquet", row_group_size=6)
    with pytest.raises(SchemaError, match=r"column 'c' row 14: category 'zz'"):
        load_table_batched(tmp_path / "bad.parquet", 6, id_column="id", schema=schema)
    df["c"] = None
    df.to_parquet(tmp_path / "empty.parquet", row_group_size=6)
    with pytest.raises(SchemaError, match=r"column 'c' is empty in every row"):
        load_table_batched(tmp_path / "empty.parquet", 6, id_column="id", schema=schema)
