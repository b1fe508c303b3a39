"""torch Datasets over a party's own files: image folders, NumPy arrays, tables and Fashion-MNIST.

A job names one of these as a client's data factory, e.g.
``parties[i].data: {factory: "secureflhv.data.torch_datasets:image_folder", kwargs: {root: scans/}}``
(a relative path is taken from the party's working directory); users may also call them from Python.
Nothing downloads and nothing is unpickled (``np.load(allow_pickle=False)``).

Every loader returns a :class:`torch.utils.data.Dataset` whose item ``i`` is ``(x, y)``:

* ``x``: a torch tensor, float32, any shape (``(C, H, W)`` images, ``(d,)`` table rows, the stored row
  shape for arrays);
* ``y``: a Python ``int`` class id in ``0 .. n_classes-1`` (``task="classification"``) or a Python
  ``float`` (``task="regression"``).

Every returned dataset also has ``targets``: all labels as a numpy array of shape ``(n,)`` (int64 for
classification, float64 for regression), so the framework can check label ranges and count rows
without reading every item; and ``classes``: the class names (list of str, index = class id) for
classification, None for regression.

Loaders:

* :func:`image_folder`: ``root/<class name>/<image file>`` (files in subfolders of a class folder
  count too; hidden folders are skipped). Classes are the sorted subfolder names (or ``classes=``),
  labels their index, files sorted within each class. The class scan lists files only; images are
  read lazily in ``__getitem__`` with Pillow into float32 ``(C, H, W)`` in [0, 1] (RGB: C = 3;
  ``grayscale``: C = 1), optionally resized (bilinear) and normalised per channel. Pillow, not
  torchvision: torchvision's PyPI wheel does not load against the CPU build of torch 2.13 that the
  project pins, and no CPU torchvision wheel is available offline.
  :func:`write_image_folder` writes uint8 arrays as such a folder of PNGs.
* :func:`numpy_arrays`: an ``.npz`` file or a folder holding ``X.npy`` and ``y.npy``; rows keep their
  shape (``(n,)`` becomes ``(n, 1)``), cast to float32.
* :func:`table`: a CSV or Parquet file through pandas; numeric feature columns, x float32 ``(d,)``; a
  text label column becomes class ids (``classes`` its sorted values).
* :func:`fashion_mnist`: Debian's Fashion-MNIST IDX files (Xiao et al. 2017) read by
  :func:`secureflhv.data.loaders.load_fashion_mnist`, as ``(1, 28, 28)`` float32 in [0, 1].

Helpers: :func:`dataset_targets` (all labels of any map-style dataset, a ``Subset`` or a
``ConcatDataset``) and :func:`collate` (a list of items as one batch).

Errors: every loader raises :class:`~secureflhv.data.dataset.DataError` (a ValueError) naming the path,
and where it applies the file, column, key and row (rows are 1-based data rows, header excluded): a
missing path, no class folders or a class folder without images, an unreadable image (when read), a
missing key or column, a non-numeric or empty feature cell, non-integral, negative or empty class
labels, arrays whose row counts differ. Bad arguments (task, size, mean/std) raise ValueError.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset, Subset

from .dataset import DataError
from .loaders import FMNIST_CLASSES, _id_array, _read_frame, load_fashion_mnist

__all__ = ["ArrayDataset", "ImageFolderDataset", "collate", "dataset_targets", "fashion_mnist", "image_folder",
           "numpy_arrays", "table", "write_image_folder"]

TASKS = ("classification", "regression")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp")


# ------------------------------------------------------------------------------------------------
# labels
# ------------------------------------------------------------------------------------------------
def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")


def _label_array(y, task: str, where: str) -> tuple[np.ndarray, list[str] | None]:
    """``y`` as int64 class ids (and the names "0".."max") or float64 values; DataError naming ``where``
    for a wrong shape, a non-numeric, empty, non-integral or negative class label."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{where}: labels must have shape (n,), got {y.shape}")
    if y.dtype.kind not in "biuf":
        raise DataError(f"{where}: labels must be numeric, got dtype {y.dtype}")
    if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
        raise DataError(f"{where}: labels contain NaN or infinite values (first at row "
                        f"{int(np.flatnonzero(~np.isfinite(y))[0]) + 1})")
    if task == "regression":
        return y.astype(np.float64), None
    if y.dtype.kind == "f" and not np.all(y == np.round(y)):
        r = int(np.flatnonzero(y != np.round(y))[0]) + 1
        raise DataError(f"{where}: class labels must be integers, row {r} holds {y[r - 1].item()!r} "
                        f"(use task='regression' for real-valued targets)")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        raise DataError(f"{where}: class labels must be >= 0 (class ids), row "
                        f"{int(np.flatnonzero(y < 0)[0]) + 1} holds {int(y.min())}")
    return y, [str(c) for c in range(int(y.max()) + 1 if y.size else 0)]


class ArrayDataset(Dataset):
    """In-memory ``(x, y)`` pairs: ``X`` float32 tensor ``(n, ...)``, item ``x = X[i]`` (a view);
    ``targets`` (n,) int64 (y a Python int) or float64 (y a Python float); ``classes`` or None.
    Optional ``feature_names`` (table columns) and ``ids`` (str array of the id column)."""

    def __init__(self, X: np.ndarray, targets: np.ndarray, classes: list[str] | None = None, *,
                 feature_names: list[str] | None = None, ids: np.ndarray | None = None, name: str = ""):
        if len(X) != len(targets):
            raise DataError(f"{name}: {len(X)} rows of x but {len(targets)} labels")
        self.X = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32))
        self.targets = targets
        self.classes = classes
        self.feature_names, self.ids, self.name = feature_names, ids, name
        self._is_class = targets.dtype.kind == "i"

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i):
        y = self.targets[i]
        return self.X[i], (int(y) if self._is_class else float(y))


# ------------------------------------------------------------------------------------------------
# image folders
# ------------------------------------------------------------------------------------------------
def _image_files(folder: Path, extensions: tuple[str, ...]) -> list[str]:
    """Image files under ``folder`` (recursively, hidden folders skipped), sorted; opens no image."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [os.path.join(dirpath, f) for f in filenames
                  if os.path.splitext(f)[1].lower() in extensions and not f.startswith(".")]
    return sorted(found)


def _scan(root: Path, classes, extensions) -> tuple[list[str], list[tuple[str, int]]]:
    """The class names and the ``(path, label)`` samples of an image folder (no image opened)."""
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist or is not a folder")
    agreed = classes is not None  # the consortium's class list: a silo may hold some classes only (non-IID)
    if classes is None:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise DataError(f"image folder {root} has no class folders (expected root/<class>/<image>)")
    classes = [str(c) for c in classes]
    exts = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
    samples: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        if not (root / name).is_dir():
            if agreed:
                continue
            raise DataError(f"image folder {root}: class folder {name!r} not found")
        files = _image_files(root / name, exts)
        if not files and not agreed:
            raise DataError(f"image folder {root}: class folder {name!r} has no images ({', '.join(exts)})")
        samples += [(f, label) for f in files]
    if not samples:
        raise DataError(f"image folder {root}: no images of the classes {classes[:10]}")
    return classes, samples


def _channel_stats(v, channels: int, what: str, default: float) -> np.ndarray:
    """``mean`` / ``std`` as a float32 (C, 1, 1) array; ValueError for a wrong length or std <= 0."""
    a = np.full(channels, default, np.float32) if v is None else np.asarray(v, np.float32).reshape(-1)
    if a.size == 1:
        a = np.repeat(a, channels)
    if a.size != channels:
        raise ValueError(f"{what} needs 1 or {channels} values (one per channel), got {a.size}")
    if what == "std" and np.any(a <= 0):
        raise ValueError(f"std must be > 0, got {a.tolist()}")
    return a.reshape(channels, 1, 1)


def _image_size(size) -> tuple[int, int] | None:
    if size is None:
        return None
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    if int(h) <= 0 or int(w) <= 0:
        raise ValueError(f"size must be positive (h, w), got {size!r}")
    return int(h), int(w)


class ImageFolderDataset(Dataset):
    """Images of a class folder, read on access. Attributes: ``root``, ``classes``, ``samples``
    (list of (file path, label)), ``targets`` (n,) int64; ``mode`` "RGB" or "L", ``size`` (h, w) or None,
    ``mean``/``std`` float32 (C, 1, 1). Item: (float32 tensor (C, H, W), int label)."""

    def __init__(self, root: Path, classes: list[str], samples: list[tuple[str, int]], *, grayscale: bool,
                 size, mean, std):
        self.root, self.classes, self.samples = root, classes, samples
        self.targets = np.fromiter((t for _, t in samples), dtype=np.int64, count=len(samples))
        self.mode = "L" if grayscale else "RGB"
        self.size = _image_size(size)
        channels = 1 if grayscale else 3
        self.normalise = mean is not None or std is not None
        self.mean = _channel_stats(mean, channels, "mean", 0.0)
        self.std = _channel_stats(std, channels, "std", 1.0)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        return torch.from_numpy(self.read(path)), int(label)

    def read(self, path: str) -> np.ndarray:
        """One image as float32 (C, H, W): /255, resized, normalised; DataError naming an unreadable file."""
        from PIL import Image

        try:
            with Image.open(path) as im:
                im = im.convert(self.mode)
                if self.size is not None and im.size != (self.size[1], self.size[0]):
                    im = im.resize((self.size[1], self.size[0]), Image.Resampling.BILINEAR)
                a = np.asarray(im, dtype=np.float32)
        except Exception as e:  # noqa: BLE001 - Pillow raises OSError, SyntaxError, ValueError, ...
            raise DataError(f"cannot read image {path}: {type(e).__name__}: {e}") from e
        a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
        a = a / np.float32(255)  # divide (not * 1/255): exact pixel / 255 in float32
        if self.normalise:
            a = (a - self.mean) / self.std
        return np.ascontiguousarray(a, dtype=np.float32)


def image_folder(root, *, grayscale: bool = False, size=None, mean=None, std=None,
                 extensions: Sequence[str] = IMAGE_EXTENSIONS, classes: Sequence[str] | None = None
                 ) -> ImageFolderDataset:
    """Images in ``root/<class name>/<image file>`` as a Dataset of (float32 (C, H, W), int label).

    Args:
        root: the folder; its non-hidden subfolders are the classes, sorted by name (label = index),
            unless ``classes`` lists the class folder names in label order (e.g. when names do not sort
            in label order): the consortium's class list, of which a silo may hold some only (a listed
            folder that is absent or empty gives no images; labels stay the list's indices). Files with one of ``extensions`` (case-insensitive) under a class folder,
            also in its subfolders, sorted by path, are its images.
        grayscale: True: 1 channel (Pillow mode "L"); False: RGB, 3 channels (alpha dropped).
        size: None (keep each file's size; batching then needs equal sizes), an int or (h, w): resize,
            bilinear.
        mean, std: None, a number or one per channel: x = (pixel / 255 - mean) / std.

    The scan lists files only; images are read in ``__getitem__``. Raises DataError for a missing root,
    no class folders, a class folder without images (unless ``classes`` lists it), no image at all; DataError naming the
    file when an image cannot be read (at access); ValueError for a bad size, mean or std.
    """
    root = Path(root)
    names, samples = _scan(root, classes, tuple(extensions))
    return ImageFolderDataset(root, names, samples, grayscale=grayscale, size=size, mean=mean, std=std)


def _folder_names(labels: np.ndarray, class_names) -> list[str]:
    """Folder name per class id; DataError for unsafe or repeated names or a label without a name."""
    if class_names is None:
        width = len(str(int(labels.max()))) if labels.size else 1
        return [f"{c:0{width}d}" for c in range(int(labels.max()) + 1 if labels.size else 0)]
    names = [str(c) for c in class_names]
    bad = [c for c in names if c in ("", ".", "..") or "/" in c or "\\" in c or c.startswith(".")]
    if bad or len(set(names)) != len(names):
        raise DataError(f"class_names must be distinct, non-hidden folder names without '/' or '\\', got {names}")
    if labels.size and labels.max() >= len(names):
        raise DataError(f"label {int(labels.max())} has no name: {len(names)} class_names given")
    return names


def write_image_folder(images: np.ndarray, labels: np.ndarray, root, class_names: Sequence[str] | None = None,
                       *, start: int = 0) -> Path:
    """Write uint8 images as PNGs ``root/<class>/<start + i:06d>.png``; returns ``root`` (a Path).

    Args:
        images: uint8 (n, H, W) (grayscale) or (n, H, W, C) with C = 1, 3 (RGB) or 4 (RGBA).
        labels: (n,) integer class ids >= 0.
        class_names: folder name per class id; None: the id, zero-padded to the width of the largest label
            in this call (so names sort in label order; for chunked writes of labels >= 10 pass names).
            :func:`image_folder` numbers folders by sorted name: pass ``classes=class_names`` there when
            the names do not sort in label order (Fashion-MNIST's do not; "T-shirt/top" has a '/').
        start: index of the first image, for writing a large set in chunks.

    Raises DataError for a non-uint8 array, a wrong shape, a label count mismatch, negative or non-integer
    labels, and bad class names.
    """
    from PIL import Image

    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or (images.ndim == 4
                                                                  and images.shape[3] not in (1, 3, 4)):
        raise DataError(f"images must be uint8 (n, H, W) or (n, H, W, C) with C in 1, 3, 4; "
                        f"got {images.dtype} {images.shape}")
    y, _ = _label_array(labels, "classification", "write_image_folder labels")
    if y.shape[0] != images.shape[0]:
        raise DataError(f"write_image_folder: {images.shape[0]} images but {y.shape[0]} labels")
    names = _folder_names(y, class_names)
    root = Path(root)
    for c in np.unique(y):
        (root / names[c]).mkdir(parents=True, exist_ok=True)
    if images.ndim == 4 and images.shape[3] == 1:
        images = images[..., 0]
    for i, (img, c) in enumerate(zip(images, y)):
        Image.fromarray(img).save(root / names[c] / f"{start + i:06d}.png", format="PNG", compress_level=1)
    return root


# ------------------------------------------------------------------------------------------------
# arrays, tables, Fashion-MNIST
# ------------------------------------------------------------------------------------------------
def _load_npy(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"array file {path} not found")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read NumPy file {path}: {e}") from e


def _read_arrays(path: Path, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    if path.is_dir():
        return _load_npy(path / f"{x_key}.npy"), _load_npy(path / f"{y_key}.npy")
    if not path.is_file() or path.suffix.lower() != ".npz":
        raise DataError(f"{path}: expected an .npz file or a folder holding {x_key}.npy and {y_key}.npy")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in (x_key, y_key) if k not in z.files]
            if missing:
                raise DataError(f"{path}: key(s) {missing} not found; keys are {list(z.files)}")
            return z[x_key], z[y_key]
    except (OSError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"cannot read NumPy file {path}: {e}") from e


def numpy_arrays(path, *, x_key: str = "X", y_key: str = "y", task: str = "classification") -> ArrayDataset:
    """Arrays ``x_key`` and ``y_key`` of an ``.npz`` file, or files ``<x_key>.npy`` and ``<y_key>.npy`` in the
    folder ``path``, as a Dataset of (float32 tensor of one row's shape, label).

    x: numeric (n, ...) cast to float32 (e.g. (n, 1, 28, 28) or (n, d); (n,) becomes (n, 1)). y: (n,) or
    (n, 1); classification: integral values >= 0 (int64 ``targets``, ``classes`` "0".."max"); regression:
    float64. Raises DataError naming the path for a missing file or key, a non-numeric x, an object
    (pickled) array, a label problem or unequal row counts; ValueError for an unknown task.
    """
    _check_task(task)
    path = Path(path)
    X, y = _read_arrays(path, x_key, y_key)
    if X.ndim == 0 or X.dtype.kind not in "biuf":
        raise DataError(f"{path}: {x_key} must be a numeric (n, ...) array, got {X.dtype} {X.shape}")
    if X.ndim == 1:
        X = X[:, None]
    targets, classes = _label_array(y, task, f"{path} ({y_key})")
    if X.shape[0] != targets.shape[0]:
        raise DataError(f"{path}: {x_key} has {X.shape[0]} rows but {y_key} has {targets.shape[0]}")
    return ArrayDataset(X, targets, classes, name=path.stem)


def _first_row(mask) -> int:
    return int(np.flatnonzero(np.asarray(mask))[0]) + 1


def _numeric_column(col, path: Path, name: str) -> np.ndarray:
    """A feature column as float64; DataError naming the column and the first bad or empty row."""
    import pandas as pd

    if col.dtype.kind not in "biuf":
        num = pd.to_numeric(col, errors="coerce")
        bad = num.isna() & col.notna()
        if bad.any():
            r = _first_row(bad)
            raise DataError(f"{path}: feature column {name!r} is not numeric: row {r} holds {col.iloc[r - 1]!r} "
                            f"(rows are 1-based, header excluded)")
        col = num
    if col.isna().any():
        raise DataError(f"{path}: empty cell in feature column {name!r} at row {_first_row(col.isna())} "
                        f"(rows are 1-based, header excluded)")
    return col.to_numpy(dtype=np.float64)


def _table_labels(col, path: Path, name: str, task: str) -> tuple[np.ndarray, list[str] | None]:
    """The label column: text becomes class ids of its sorted values; else see :func:`_label_array`."""
    if col.isna().any():
        raise DataError(f"{path}: empty cell in label column {name!r} at row {_first_row(col.isna())}")
    if col.dtype.kind in "biuf":
        return _label_array(col.to_numpy(), task, f"{path} label column {name!r}")
    if task == "regression":
        return _label_array(_numeric_column(col, path, name), task, f"{path} label column {name!r}")
    values = col.astype(str).to_numpy()
    classes, codes = np.unique(values, return_inverse=True)
    return codes.astype(np.int64), [str(c) for c in classes]


def _table_format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".parquet", ".pq"):
        return "parquet"
    if ".csv" in suffixes[-2:]:
        return "csv"
    raise DataError(f"{path}: unknown table format; use a .csv (or .csv.gz) or .parquet file")


def table(path, *, label_column: str, feature_columns: Sequence[str] | None = None, id_column: str | None = None,
          task: str = "classification") -> ArrayDataset:
    """A CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``) table as a Dataset of
    (float32 (d,), label).

    Features: ``feature_columns`` in that order, else every column but the label and id columns; each must
    be numeric with no empty cell. Label: classification: integral numbers >= 0 (``classes`` "0".."max") or
    text (class ids of the sorted values, ``classes`` those values); regression: numbers (float64).
    ``id_column`` (read as text, unique) gives ``ids``; ``feature_names`` lists the feature columns.

    Raises DataError naming the file for a missing file or column, and naming the column and row
    (1-based, header excluded) for a non-numeric or empty feature cell or an empty / bad label; ValueError
    for an unknown task.
    """
    _check_task(task)
    path = Path(path)
    if not path.is_file():
        raise DataError(f"table file {path} not found")
    df = _read_frame(path, _table_format(path), [id_column] if id_column is not None else [])
    df.columns = cols = [str(c) for c in df.columns]
    special = [c for c in (label_column, id_column) if c is not None]
    features = [str(c) for c in feature_columns] if feature_columns is not None else \
        [c for c in cols if c not in special]
    missing = [c for c in special + features if c not in cols]
    if missing:
        raise DataError(f"{path}: column(s) {missing} not found; columns are {cols[:20]}"
                        f"{' ...' if len(cols) > 20 else ''}")
    if not features:
        raise DataError(f"{path}: no feature columns")
    X = np.empty((len(df), len(features)), dtype=np.float32)
    for j, c in enumerate(features):
        X[:, j] = _numeric_column(df[c], path, c)
    y, classes = _table_labels(df[label_column], path, label_column, task)
    ids = _id_array(df, path, id_column) if id_column is not None else None
    return ArrayDataset(X, y, classes, feature_names=features, ids=ids, name=path.stem)


def fashion_mnist(split: str = "train", *, root=None, limit: int | None = None) -> ArrayDataset:
    """Fashion-MNIST (Xiao et al. 2017) as a Dataset of (float32 (1, 28, 28) in [0, 1], int label 0..9).

    ``root``: the folder of the IDX files (raw or .gz); None: ``$SECUREFLHV_FMNIST_DIR``, else
    ``/usr/share/datasets/fashion-mnist`` (Debian's ``dataset-fashion-mnist``). ``limit``: keep the first
    ``limit`` images (train 60,000, test 10,000). ``classes`` are the ten class names. Raises
    FileNotFoundError naming the missing file (see :func:`~secureflhv.data.loaders.load_fashion_mnist`),
    ValueError for an unknown split or a negative limit.
    """
    if limit is not None and int(limit) < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    ds = load_fashion_mnist(split, root)
    n = len(ds) if limit is None else min(int(limit), len(ds))
    X = ds.X[:n].reshape(n, 1, 28, 28)
    return ArrayDataset(X, ds.y[:n].astype(np.int64), list(FMNIST_CLASSES), name=f"fashion_mnist_{split}")


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def _as_targets(t) -> np.ndarray:
    t = np.asarray(t)
    return t.astype(np.int64) if t.dtype.kind in "biu" else t.astype(np.float64)


def dataset_targets(ds) -> np.ndarray:
    """All labels of a map-style dataset as a numpy (n,) array (int64 if every label is an integer, else
    float64): its ``targets`` when 1-D and of length ``len(ds)``; for a ``Subset`` its parent's targets at
    its indices, for a ``ConcatDataset`` its parts' targets joined (recursively); otherwise read ``ds[i][1]``
    for every item (Python/numpy numbers or 0-d tensors). Raises ValueError for a non-scalar label."""
    n = len(ds)
    t = getattr(ds, "targets", None)
    if t is not None:
        t = t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        if t.ndim == 1 and t.shape[0] == n and t.dtype.kind in "biuf":
            return _as_targets(t)
    if isinstance(ds, Subset):
        return dataset_targets(ds.dataset)[np.asarray(ds.indices, dtype=np.int64)]
    if isinstance(ds, ConcatDataset):
        parts = [dataset_targets(d) for d in ds.datasets]
        return _as_targets(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    ys = [_scalar_label(ds[i][1], i) for i in range(n)]
    return _as_targets(np.array(ys)) if ys else np.zeros(0, np.int64)


def _scalar_label(y, i: int):
    """``y`` as a Python int (bool and integer types) or float; ValueError naming item ``i`` otherwise."""
    if isinstance(y, (torch.Tensor, np.ndarray)):
        if (y.numel() if isinstance(y, torch.Tensor) else y.size) != 1:
            raise ValueError(f"item {i}: label must be a scalar, got shape {tuple(y.shape)}")
        y = y.item()
    if isinstance(y, (bool, int, np.integer, np.bool_)):
        return int(y)
    if isinstance(y, (float, np.floating)):
        return float(y)
    raise ValueError(f"item {i}: label must be an int or a float, got {type(y).__name__}")


def collate(items) -> tuple[torch.Tensor, torch.Tensor]:
    """A list of ``(x, y)`` items as one batch: ``xb = torch.stack(xs)`` (dtype kept), ``yb`` int64 when
    every y is an integer, else float32. Usable as a DataLoader ``collate_fn``. Raises ValueError for an
    empty list, and naming the first item whose x shape or dtype differs from item 0's or whose y is not
    a scalar number."""
    items = list(items)
    if not items:
        raise ValueError("collate: no items")
    xs = [x if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x, _ in items]
    for i, x in enumerate(xs):
        if x.shape != xs[0].shape or x.dtype != xs[0].dtype:
            raise ValueError(f"collate: item {i} has x {tuple(x.shape)} {x.dtype}, item 0 has "
                             f"{tuple(xs[0].shape)} {xs[0].dtype}")
    ys = [_scalar_label(y, i) for i, (_, y) in enumerate(items)]
    if all(isinstance(y, int) for y in ys):
        return torch.stack(xs), torch.tensor(ys, dtype=torch.int64)
    return torch.stack(xs), torch.tensor(ys, dtype=torch.float32)
