"""A client's rows as the training and evaluation code reads them: a numpy matrix or the user's torch Dataset.

Built-in models read flat float32 rows ``X`` (n, n_features); a user's model reads whatever its Dataset gives.
:class:`DatasetRows` makes a torch ``Dataset`` of ``(x, y)`` items look like ``X`` where the FL code indexes it:
``rows[idx]`` (a slice, or an index array or tensor) is the stacked batch of inputs (dtype kept: images
float32, token ids int64), ``len(rows)`` the row count, and :meth:`subset` a view of some rows. The labels
stay a numpy array ``y`` beside it (the dataset's ``targets``), so counts, label checks and partitions work
without reading every image. Batches are stacked in the order asked, in this process (no worker processes):
the batch order comes from the seeded generators of :mod:`.strategies`, so a run is reproducible.
"""
from __future__ import annotations

from typing import Union

import numpy as np
import torch
from torch.utils.data import Dataset, Subset


class DatasetRows:
    """The inputs of a torch ``Dataset`` of ``(x, y)`` items, indexable like a row matrix (module docstring)."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key) -> torch.Tensor:
        if isinstance(key, slice):
            index = range(*key.indices(len(self)))
        else:
            index = np.asarray(key.cpu().numpy() if isinstance(key, torch.Tensor) else key).reshape(-1).tolist()
        items = [self.dataset[int(i)][0] for i in index]
        xs = [x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x)) for x in items]
        if not xs:
            raise IndexError("no rows selected")
        shape = xs[0].shape
        for i, x in zip(index, xs):
            if x.shape != shape:
                raise ValueError(f"dataset item {i} has input shape {list(x.shape)}, item {index[0]} has "
                                 f"{list(shape)}: a batch needs equal shapes")
        return torch.stack(xs)

    def subset(self, idx: np.ndarray) -> "DatasetRows":
        """The rows ``idx`` (int array) as a new view."""
        return DatasetRows(Subset(self.dataset, np.asarray(idx, dtype=np.int64).tolist()))

    @property
    def shape(self) -> tuple:
        """(rows, *input shape of the first item) -- for messages; rows may have other shapes."""
        return (len(self), *tuple(self.dataset[0][0].shape)) if len(self) else (0,)


Rows = Union[np.ndarray, DatasetRows]


def take(X: Rows, idx: np.ndarray) -> Rows:
    """Rows ``idx`` of ``X`` (a numpy matrix, or a :class:`DatasetRows` view)."""
    return X.subset(idx) if isinstance(X, DatasetRows) else X[idx]


def as_inputs(X: Rows) -> Rows:
    """``X`` as the training loop indexes it: a float32 tensor of a numpy matrix (one copy, as before), or the
    :class:`DatasetRows` itself (its batches are built per step)."""
    if isinstance(X, DatasetRows):
        return X
    return torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32))


def input_batch(X: Rows, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of ``X`` as a tensor (float32 for a numpy matrix)."""
    if isinstance(X, DatasetRows):
        return X[start:stop]
    return torch.from_numpy(np.ascontiguousarray(X[start:stop], dtype=np.float32))
