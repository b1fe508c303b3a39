"""Table schemas: which column is numeric, categorical (with its categories), the id or the label.

A schema is optional. Written in a job file under ``parties[i].data.schema``::

    schema:
      id: id
      species: label
      bill_length_mm: numeric
      island: {kind: categorical, categories: [Biscoe, Dream, Torgersen], other: other}
      sex: {kind: categorical, categories: [female, male]}

Without a schema a loader treats a column of text as categorical with the categories it finds (fine for
a vertical party, whose columns are its own); a horizontal job needs declared categories so that every
client one-hot encodes into the same columns.

Categorical values are stored in ``Dataset.X`` as their index in the declared category list (float64),
missing values as NaN. A category outside the list is an error naming file, column and row — unless the
column declares an ``other`` bucket and the table is being scored (``predicting=True``), where unknown
values map to that bucket (the last code).

Errors: :class:`SchemaError` (a :class:`~secureflhv.data.dataset.DataError`) naming the file, the column
and the first offending row (1-based, counting data rows, the header not included).
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .dataset import DataError

Kind = Literal["numeric", "categorical", "id", "label"]


class SchemaError(DataError):
    """The table does not match its schema, or the schema itself is malformed."""


class ColumnSchema(BaseModel):
    """One column: its kind, and for a categorical column its categories and optional "other" bucket."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind
    categories: list[str] | None = Field(
        default=None, description="categorical (or label): the allowed values, in code order")
    other: str | None = Field(
        default=None, description="categorical only: bucket for values unseen in training (at prediction)")
    allow_missing: bool = Field(default=True, description="numeric/categorical: empty cells are allowed")

    @field_validator("categories")
    @classmethod
    def _distinct(cls, v):
        if v is not None:
            v = [str(c) for c in v]
            if len(set(v)) != len(v):
                raise ValueError("categories must be distinct")
            if not v:
                raise ValueError("categories must not be empty")
        return v

    @model_validator(mode="after")
    def _kind_fields(self):
        if self.kind in ("numeric", "id") and self.categories is not None:
            raise ValueError(f"'categories' applies to categorical and label columns, not {self.kind}")
        if self.kind != "categorical" and self.other is not None:
            raise ValueError(f"'other' applies only to categorical columns, not {self.kind}")
        if self.other is not None and self.categories and self.other in self.categories:
            raise ValueError(f"other bucket {self.other!r} is also a declared category")
        return self

    @property
    def vocabulary(self) -> list[str] | None:
        """The codes' values in order: the categories, then the other bucket if declared."""
        if self.categories is None:
            return None
        return self.categories + ([self.other] if self.other is not None else [])


class TableSchema(BaseModel):
    """Column name → :class:`ColumnSchema`, in file order. At most one id and one label column."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    columns: dict[str, ColumnSchema]

    @model_validator(mode="after")
    def _one_each(self):
        for kind in ("id", "label"):
            named = [c for c, s in self.columns.items() if s.kind == kind]
            if len(named) > 1:
                raise ValueError(f"more than one {kind} column: {named}")
        return self

    def of_kind(self, kind: str) -> list[str]:
        """The names of the columns of ``kind`` (``id``, ``label``, ``numeric``, ``categorical``), in file order."""
        return [c for c, s in self.columns.items() if s.kind == kind]

    @property
    def id_column(self) -> str | None:
        """The id column's name, or None."""
        return next(iter(self.of_kind("id")), None)

    @property
    def label_column(self) -> str | None:
        """The label column's name, or None."""
        return next(iter(self.of_kind("label")), None)

    @property
    def feature_columns(self) -> list[str]:
        """The numeric and categorical columns, in declaration order."""
        return [c for c, s in self.columns.items() if s.kind in ("numeric", "categorical")]


def parse_schema(obj, where: str = "schema") -> TableSchema:
    """A :class:`TableSchema` from a mapping ``{column: kind | {kind: ..., categories: [...]}}``.

    Raises :class:`SchemaError` naming ``where`` and the column for anything malformed.
    """
    if isinstance(obj, TableSchema):
        return obj
    if not isinstance(obj, dict) or not obj:
        raise SchemaError(f"{where}: expected a non-empty mapping of column name to kind, got {obj!r}")
    columns = {}
    for name, spec in obj.items():
        spec = {"kind": spec} if isinstance(spec, str) else spec
        try:
            columns[str(name)] = ColumnSchema.model_validate(spec)
        except ValidationError as exc:
            msg = "; ".join(e["msg"] for e in exc.errors())
            raise SchemaError(f"{where}.{name}: {msg} (kinds: numeric, categorical, id, label)") from None
    try:
        return TableSchema(columns=columns)
    except ValidationError as exc:
        raise SchemaError(f"{where}: {'; '.join(e['msg'] for e in exc.errors())}") from None


def _first(mask: np.ndarray, batch_start: int | None = None) -> int:
    return int(np.flatnonzero(mask)[0]) + 1 + (batch_start or 0)  # 1-based data row of the table


def numeric_column(values, path: Path, column: str, *, allow_missing: bool = True,
                   batch_start: int | None = None) -> np.ndarray:
    """``values`` as float64 with NaN for empty cells; raises SchemaError at the first cell holding text.

    ``batch_start``: ``values`` are a row batch starting at this 0-based row of the table (errors name
    the table's row; a batch with no value is not an error: the caller checks the whole column)."""
    import pandas as pd

    raw = pd.Series(values)
    missing = raw.isna().to_numpy()
    num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.isnan(num) & ~missing
    if bad.any():
        r = _first(bad)
        raise SchemaError(f"{path}: column {column!r} row {_first(bad, batch_start)}: {raw.iloc[r - 1]!r} is not "
                          f"a number")
    if np.isinf(num).any():
        raise SchemaError(f"{path}: column {column!r} row {_first(np.isinf(num), batch_start)}: infinite value")
    _check_missing(missing, path, column, allow_missing, batch_start)
    return num


def categorical_column(values, path: Path, column: str, spec: ColumnSchema | None = None, *,
                       predicting: bool = False, batch_start: int | None = None) -> tuple[np.ndarray, list[str]]:
    """Codes (float64, NaN for missing) and the vocabulary of a categorical column.

    With ``spec.categories`` the codes index that list (unknown values: SchemaError, or the ``other``
    bucket when ``predicting``); without, the vocabulary is the sorted distinct values found.
    ``batch_start``: as for :func:`numeric_column`.
    """
    import pandas as pd

    raw = pd.Series(values)
    missing = raw.isna().to_numpy()
    text = raw.astype(str).str.strip().to_numpy()
    _check_missing(missing, path, column, spec.allow_missing if spec else True, batch_start)
    vocab = spec.vocabulary if spec is not None and spec.categories is not None else \
        sorted({t for t, m in zip(text, missing) if not m})
    index = {c: i for i, c in enumerate(vocab)}
    codes = np.array([index.get(t, -1) if not m else -2 for t, m in zip(text, missing)], dtype=np.int64)
    unknown = codes == -1
    if unknown.any():
        if predicting and spec is not None and spec.other is not None:
            codes[unknown] = index[spec.other]
        else:
            r = _first(unknown)
            hint = (f"; it has an 'other' bucket ({spec.other!r}) used only when scoring"
                    if spec is not None and spec.other else "")
            raise SchemaError(f"{path}: column {column!r} row {_first(unknown, batch_start)}: category "
                              f"{text[r - 1]!r} is not among the "
                              f"declared {spec.categories}{hint}")
    out = codes.astype(np.float64)
    out[missing] = np.nan
    return out, list(vocab)


def _check_missing(missing: np.ndarray, path: Path, column: str, allow_missing: bool,
                   batch_start: int | None = None) -> None:
    if batch_start is None and len(missing) and missing.all():
        raise SchemaError(f"{path}: column {column!r} is empty in every row (all values missing)")
    if missing.any() and not allow_missing:
        raise SchemaError(f"{path}: column {column!r} row {_first(missing, batch_start)}: missing value, and the schema "
                          f"sets allow_missing: false")
