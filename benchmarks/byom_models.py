"""The shared workload of the user-model ("bring your own model") throughput benchmark: two plain torch models
and Fashion-MNIST split over N clients, importable both by secureflhv and by Flower's own virtualenv.

This file imports only torch and numpy (never secureflhv): ``flower_side.py`` runs it inside ``.venv-flower``,
whose protobuf is older than secureflhv's. It is also the factory a job names for the user-model path,
``params.model.factory: "byom_models:resnet8"`` (with ``path`` the ``benchmarks`` folder).

* :func:`resnet8`: a CIFAR-style ResNet-8 (He, Zhang, Ren, Sun, "Deep Residual Learning for Image
  Recognition", CVPR 2016, section 4.2: 6n+2 layers with n = 1) for 1×28×28 images: 3×3 conv to 16 channels,
  batch norm, ReLU, then three stages of one basic block each (widths 16, 32, 64; the second and third halve
  the resolution, with a 1×1 convolution + batch norm on the shortcut), global average pool, linear to
  ``n_classes``. 77,754 parameters + 2 × 336 batch-norm running statistics for 10 classes.
* :func:`cnn`: NIID-Bench's simple CNN for 28×28 (Li, Diao, Chen, He, "Federated Learning on Non-IID Data
  Silos: An Experimental Study", ICDE 2022, section V-A), the same architecture as secureflhv's built-in
  ``cnn``: conv 5×5 → 6, ReLU, max-pool 2, conv 5×5 → 16, ReLU, max-pool 2, FC 120, FC 84, FC ``n_classes``
  (44,426 parameters for 10 classes).

Both take float32 input of shape (batch, 784) (secureflhv's flat rows) or (batch, 1, 28, 28) and return
(batch, n_classes) logits.

Data: :func:`load_fmnist` reads Debian's ``dataset-fashion-mnist`` IDX files (Xiao, Rasul, Vollgraf 2017);
:func:`dirichlet_split` splits rows over clients by label with Dirichlet(beta) proportions (the label-skew
partition of NIID-Bench, section IV-A); :func:`workload` puts the two together, deterministically in its seed.
"""
from __future__ import annotations

import functools
import gzip
import importlib.util
import os
import struct
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
EXAMPLE_MODELS = Path(__file__).resolve().parents[1] / "examples" / "byom" / "models.py"
IMAGE = (1, 28, 28)


def _as_image(x: torch.Tensor, channels: int) -> torch.Tensor:
    """(batch, c·28·28) flat rows, or images already (batch, c, 28, 28), as images."""
    return x.reshape(x.shape[0], channels, IMAGE[1], IMAGE[2]) if x.dim() == 2 else x


def _example_models():
    """``examples/byom/models.py`` (plain torch: the example consortium's ResNet-8), loaded by path so that this
    file stays importable in Flower's virtualenv, where neither secureflhv nor ``examples`` is a package."""
    spec = importlib.util.spec_from_file_location("byom_example_models", EXAMPLE_MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ResNet8 = _example_models().ResNet8  # the same architecture (and layout) as the example's


class SimpleCNN(nn.Module):
    """NIID-Bench's simple CNN for 1×28×28 (see the module docstring)."""

    def __init__(self, n_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(_as_image(x, 1))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc3(F.relu(self.fc2(x)))


def resnet8(n_classes: int = 10, in_channels: int = 1) -> nn.Module:
    """A fresh ResNet-8 (torch's default initialisation, from torch's global generator)."""
    return ResNet8(n_classes, in_channels)


def cnn(n_classes: int = 10) -> nn.Module:
    """A fresh NIID-Bench simple CNN for 1×28×28 images."""
    return SimpleCNN(n_classes)


MODELS = {"resnet8": resnet8, "cnn": cnn}


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file (LeCun's MNIST format; raw or gzip) as a uint8 array of its declared shape.

    Raises ValueError for a file that is not unsigned-byte IDX or whose size does not match its header."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape}, file holds {body.size} values")
    return body.reshape(shape)


@functools.lru_cache(maxsize=2)
def load_fmnist(split: str = "train", directory: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST ``split`` ("train": 60,000 rows, "test": 10,000) as (X float32 (n, 784) in [0, 1],
    y int64 (n,) in 0..9), from ``directory`` (else $SECUREFLHV_FMNIST_DIR, else Debian's folder).

    Cached per process (read-only arrays). Raises FileNotFoundError naming the file and the Debian package."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    d = Path(directory or os.environ.get("SECUREFLHV_FMNIST_DIR") or FMNIST_DIR)
    prefix = "train" if split == "train" else "t10k"
    arrays = []
    for stem in (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"):
        path = next((p for p in (d / stem, d / f"{stem}.gz") if p.is_file()), None)
        if path is None:
            raise FileNotFoundError(f"{d / stem}[.gz] not found (apt-get install dataset-fashion-mnist)")
        arrays.append(_read_idx(path))
    X = (arrays[0].reshape(arrays[0].shape[0], -1).astype(np.float32) / np.float32(255.0))
    y = arrays[1].astype(np.int64)
    X.flags.writeable = y.flags.writeable = False
    return X, y


def dirichlet_split(y: np.ndarray, n_clients: int, beta: float, seed: int, min_size: int = 10,
                    tries: int = 1000) -> list[np.ndarray]:
    """Row indices of each of ``n_clients`` clients: for every label, Dirichlet(beta) proportions over the
    clients, redrawn until every client holds at least ``min_size`` rows (NIID-Bench's rule).

    Returns ``n_clients`` sorted int64 arrays that partition ``range(len(y))``. Raises ValueError when
    ``len(y) < n_clients * min_size`` or no draw in ``tries`` satisfies ``min_size``."""
    if n_clients < 1 or not beta > 0:
        raise ValueError(f"need n_clients >= 1 and beta > 0, got {n_clients}, {beta}")
    if len(y) < n_clients * min_size:
        raise ValueError(f"{len(y)} rows cannot give {n_clients} clients {min_size} rows each")
    rng = np.random.default_rng(seed)
    for _ in range(tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for label in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == label))
            cuts = (np.cumsum(rng.dirichlet(np.full(n_clients, beta))) * len(idx)).astype(int)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        out = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
        if min(len(o) for o in out) >= min_size:
            return out
    raise ValueError(f"no Dirichlet({beta}) draw in {tries} gave every one of {n_clients} clients {min_size} rows")


@functools.lru_cache(maxsize=4)
def workload(n_clients: int, train_rows: int, test_rows: int, beta: float = 0.5, seed: int = 0,
             directory: str | None = None):
    """The benchmark's data: ``train_rows`` rows drawn (seeded) from Fashion-MNIST's training set, split over
    ``n_clients`` by :func:`dirichlet_split`, and the first ``test_rows`` rows of its test set.

    Returns (shards: list of (X float32 (n_k, 784), y int64 (n_k,)), (X_test, y_test)). Deterministic in its
    arguments, so every process (secureflhv's, each Ray actor of Flower's) builds the same split."""
    X, y = load_fmnist("train", directory)
    Xt, yt = load_fmnist("test", directory)
    if not 0 < train_rows <= len(y) or not 0 < test_rows <= len(yt):
        raise ValueError(f"train_rows must be in [1, {len(y)}] and test_rows in [1, {len(yt)}]")
    rows = np.sort(np.random.default_rng(seed).choice(len(y), train_rows, replace=False))
    Xs, ys = X[rows], y[rows]
    shards = [(Xs[i], ys[i]) for i in dirichlet_split(ys, n_clients, beta, seed)]
    return shards, (Xt[:test_rows].copy(), yt[:test_rows].copy())


def warm_up(model: nn.Module, X: np.ndarray, y: np.ndarray, batch_size: int) -> None:
    """One forward, backward and SGD step of a throwaway copy of ``model`` on ``X[:batch_size]``: pays the
    process's first-call costs (torch's lazy imports, kernel selection) before anything is timed."""
    import copy

    m = copy.deepcopy(model).train()
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    F.cross_entropy(m(torch.tensor(X[:batch_size])), torch.tensor(y[:batch_size])).backward()
    opt.step()
