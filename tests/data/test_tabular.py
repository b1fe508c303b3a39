"""Real tabular data (issue 13): schemas, missing values, categorical columns, preprocessing, metrics."""
import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import ks_2samp

from secureflhv.data import DataError, SchemaError, load_dataset, load_table, parse_schema, with_missing_cells
from secureflhv.data.metrics import infer_task, ks_statistic, plot_roc_ks, task_metrics
from secureflhv.data.tabular import Preprocessor, sufficient_statistics
from secureflhv.runtime.job.data_prep import standardise

SCHEMA = {"id": "id", "y": "label", "age": "numeric",
          "region": {"kind": "categorical", "categories": ["north", "south"], "other": "other"}}


def _write(tmp_path, rows, name="t.csv"):
    p = tmp_path / name
    p.write_text("id,y,age,region\n" + "".join(f"{r}\n" for r in rows))
    return p


def test_schema_loads_codes_and_missing_values(tmp_path):
    p = _write(tmp_path, ["a,1,30,north", "b,0,,south", "c,1,41,", "d,0,52,north"])
    ds = load_table(p, schema=SCHEMA)
    assert ds.feature_names == ["age", "region"] and ds.ids.tolist() == ["a", "b", "c", "d"]
    assert ds.y.tolist() == [1, 0, 1, 0]
    assert ds.categories == {"region": ["north", "south", "other"]}
    np.testing.assert_array_equal(ds.X, [[30, 0], [np.nan, 1], [41, np.nan], [52, 0]])


@pytest.mark.parametrize("rows, match", [
    (["a,1,30,north", "b,0,31,east"], r"t\.csv: column 'region' row 2: category 'east' is not among"),
    (["a,1,30,north", "b,0,thirty,south"], r"t\.csv: column 'age' row 2: 'thirty' is not a number"),
    (["a,1,,north", "b,0,,south"], r"t\.csv: column 'age' is empty in every row"),
])
def test_table_breaking_its_schema_names_file_column_and_row(tmp_path, rows, match):
    with pytest.raises(SchemaError, match=match):
        load_table(_write(tmp_path, rows), schema=SCHEMA)


def test_unknown_category_goes_to_other_bucket_only_when_scoring(tmp_path):
    p = _write(tmp_path, ["a,1,30,north", "b,0,31,east"])
    ds = load_table(p, schema=SCHEMA, predicting=True)
    assert ds.X[:, 1].tolist() == [0.0, 2.0]  # "other" is the last code


@pytest.mark.parametrize("bad, match", [
    ({"x": "numerical"}, r"schema\.x: .*kinds: numeric, categorical"),
    ({"x": {"kind": "categorical", "categories": ["a", "a"]}}, r"schema\.x: .*distinct"),
    ({"x": {"kind": "numeric", "categories": ["a"]}}, r"schema\.x: .*categories"),
    ({"a": "id", "b": "id"}, "more than one id column"),
    ([], "non-empty mapping"),
])
def test_malformed_schema_names_the_column(bad, match):
    with pytest.raises(SchemaError, match=match):
        parse_schema(bad)


def test_declared_column_absent_from_file(tmp_path):
    p = _write(tmp_path, ["a,1,30,north"])
    with pytest.raises(SchemaError, match=r"\['income'\] declared in the schema are not in the file"):
        load_table(p, schema={**SCHEMA, "income": "numeric"})


def test_text_column_without_schema_points_to_the_schema(tmp_path):
    p = _write(tmp_path, ["a,1,30,north"])
    with pytest.raises(DataError, match="declare it in the data schema as categorical"):
        load_table(p, id_column="id", label_column="y")


def test_bundled_tabular_sets():
    from palmerpenguins import load_penguins as raw

    df = raw()
    ds = load_dataset("penguins")
    assert ds.X.shape == (344, 6) and ds.label_names == ["Adelie", "Chinstrap", "Gentoo"]
    assert np.bincount(ds.y).tolist() == df["species"].value_counts()[ds.label_names].tolist()
    assert int(np.isnan(ds.X[:, ds.feature_names.index("sex")]).sum()) == int(df["sex"].isna().sum())
    bcm = load_dataset("breast_cancer_missing")
    assert 0.19 < np.isnan(bcm.X).mean() < 0.21
    assert np.array_equal(bcm.X, with_missing_cells(load_dataset("breast_cancer"), 0.2, seed=0).X, equal_nan=True)
    assert infer_task(load_dataset("diabetes").y) == "regression"


def _mixed(seed, n):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.normal(5, 2, n), rng.integers(0, 3, n).astype(float), rng.exponential(3, n)])
    X[rng.random(X.shape) < 0.15] = np.nan
    return X


NAMES, CATS = ["a", "colour", "b"], {"colour": ["red", "green", "blue"]}


def test_preprocessor_matches_an_independent_computation():
    X = _mixed(0, 200)
    pre = Preprocessor.fit(X, NAMES, CATS, missing_indicator=True)
    out = pre.transform(X)
    assert pre.output_names == ["a", "a=missing", "colour=red", "colour=green", "colour=blue", "colour=missing",
                                "b", "b=missing"]
    for j, col in ((0, 0), (2, 6)):
        v = X[:, j]
        filled = np.where(np.isnan(v), np.nanmean(v), v)
        np.testing.assert_allclose(out[:, col], (filled - np.nanmean(v)) / np.nanstd(v), rtol=1e-12)
        np.testing.assert_array_equal(out[:, col + 1], np.isnan(v))
    codes = X[:, 1]
    mode = pd.Series(codes[~np.isnan(codes)]).mode()[0]
    expect = pd.get_dummies(pd.Categorical(np.where(np.isnan(codes), mode, codes), categories=[0.0, 1.0, 2.0]))
    np.testing.assert_array_equal(out[:, 2:5], expect.to_numpy(dtype=float))
    again = Preprocessor.from_dict(json.loads(json.dumps(pre.to_dict())))
    np.testing.assert_array_equal(again.transform(X), out)


def test_complete_numeric_preprocessing_is_plain_standardisation_bit_for_bit():
    X = np.random.default_rng(1).normal(size=(97, 5))
    rows = np.arange(0, 97, 2)
    pre = Preprocessor.fit(X[rows], [f"x{i}" for i in range(5)])
    assert pre.identity_on_complete_numeric
    np.testing.assert_array_equal(pre.transform(X), standardise(X, rows)[0])


def test_pooled_statistics_equal_the_pooled_data():
    """What horizontal clients would sum through secure aggregation gives the pooled-data transform."""
    shards = [_mixed(s, n) for s, n in ((2, 50), (3, 120), (4, 7))]
    pooled = np.vstack(shards)
    total = sum(sufficient_statistics(s, NAMES, CATS) for s in shards)
    fed = Preprocessor.from_statistics(total, NAMES, CATS, missing_indicator=True, n_rows=len(pooled))
    central = Preprocessor.fit(pooled, NAMES, CATS, missing_indicator=True)
    np.testing.assert_allclose(fed.mean, central.mean, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(fed.std, central.std, rtol=1e-9, equal_nan=True)
    np.testing.assert_array_equal(fed.mode, central.mode)
    np.testing.assert_allclose(fed.transform(pooled), central.transform(pooled), atol=1e-9)
    with pytest.raises(ValueError, match="expected"):
        Preprocessor.from_statistics(total[:-1], NAMES, CATS)


def test_all_missing_training_column_is_named():
    X = np.array([[1.0, np.nan], [2.0, np.nan]])
    with pytest.raises(ValueError, match="'b' is missing in every training row"):
        Preprocessor.fit(X, ["a", "b"])


def test_task_metrics_against_independent_formulas(tmp_path):
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, 300)
    p = np.clip(0.3 * y + rng.random(300) * 0.7, 0, 1)
    m = task_metrics(y, p)
    assert m["ks"] == pytest.approx(ks_2samp(p[y == 1], p[y == 0]).statistic, abs=1e-12)
    assert m["ks"] == ks_statistic(y, p)
    pred = p >= 0.5
    tp, fp = int((pred & (y == 1)).sum()), int((pred & (y == 0)).sum())
    assert m["confusion"][1][1] == tp and m["confusion"][0][1] == fp
    assert m["precision"] == pytest.approx(tp / (tp + fp)) and set(m) >= {"auc", "recall", "log_loss"}
    yr = rng.normal(size=50)
    r = task_metrics(yr, yr + 0.1)
    assert r["rmse"] == pytest.approx(0.1) and r["mae"] == pytest.approx(0.1)
    assert r["r2"] == pytest.approx(1 - 0.01 * 50 / ((yr - yr.mean()) ** 2).sum())
    probs = np.eye(3)[[0, 1, 2, 2]] * 0.9 + 0.1 / 3
    mc = task_metrics(np.array([0, 1, 2, 1]), probs)
    assert mc["accuracy"] == 0.75 and mc["macro_f1"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    assert plot_roc_ks(y, p, tmp_path / "roc.png").stat().st_size > 1000
