"""A hospital's image folder when it has no images of some classes: the consortium's data factory.

``secureflhv.data.torch_datasets.image_folder(root, classes=[...])`` numbers the classes by their place in
``classes`` but requires a folder with at least one image for each of them. Under a label-skewed split
(Dirichlet(0.3) over labels) most hospitals lack a few classes, and their labels must still be the
consortium's class ids, not ids among the classes they happen to hold. :func:`hospital_images` reads the class
folders a hospital has with ``image_folder`` and maps their labels back to the agreed ids.

The job names it as each client's data factory::

    data: {factory: "hospital_data:hospital_images", path: <this folder>,
           kwargs: {root: clients/hospital-01, grayscale: true, classes: [t-shirt-top, trouser, ...]}}
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from secureflhv.data.dataset import DataError
from secureflhv.data.torch_datasets import ImageFolderDataset, image_folder


def hospital_images(root, classes, *, grayscale: bool = True, **kwargs) -> ImageFolderDataset:
    """The images under ``root/<class>/`` for the classes of ``classes`` that have a folder at ``root``, labelled
    with their index in ``classes`` (the agreed class ids), as a Dataset of (float32 (C, H, W) in [0, 1], int).

    ``targets``: (n,) int64 agreed class ids; ``classes``: all of ``classes`` (index = class id). Other keyword
    arguments go to ``image_folder`` (size, mean, std, extensions). Raises the DataError of ``image_folder``
    (a missing root, a present class folder without images) and DataError when no class of ``classes`` has a
    folder at ``root``.
    """
    classes = [str(c) for c in classes]
    held = [c for c in classes if (Path(root) / c).is_dir()]
    if not held:
        raise DataError(f"{root}: none of the class folders {classes} is there")
    ds = image_folder(root, grayscale=grayscale, classes=held, **kwargs)
    agreed = np.array([classes.index(c) for c in held], dtype=np.int64)
    ds.samples = [(path, int(agreed[label])) for path, label in ds.samples]
    ds.targets = agreed[ds.targets]
    ds.classes = classes
    return ds
