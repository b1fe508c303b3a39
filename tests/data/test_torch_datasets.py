"""torch Dataset loaders over a party's own files (issue 37): image folders, arrays, tables, Fashion-MNIST.

Expected values are computed independently with plain numpy / Pillow / gzip, never through the module."""
import gzip

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from secureflhv.data.dataset import DataError
from secureflhv.data.torch_datasets import (collate, dataset_targets, fashion_mnist, image_folder, numpy_arrays,
                                            table, write_image_folder)


def _images(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def _order(labels):
    """Item order of a folder written by write_image_folder: by class, then by file index."""
    return np.argsort(labels, kind="stable")


# ------------------------------------------------------------------------------------------------
# image folders
# ------------------------------------------------------------------------------------------------
def test_image_folder_grayscale_round_trip(tmp_path):
    imgs, labels = _images((9, 5, 7)), np.array([2, 0, 1, 2, 0, 0, 1, 2, 1])
    root = write_image_folder(imgs, labels, tmp_path / "g")
    assert sorted(p.name for p in root.iterdir()) == ["0", "1", "2"]
    assert sorted(p.name for p in (root / "2").iterdir()) == ["000000.png", "000003.png", "000007.png"]
    ds = image_folder(root, grayscale=True)
    assert len(ds) == 9 and ds.classes == ["0", "1", "2"]
    order = _order(labels)
    np.testing.assert_array_equal(ds.targets, labels[order])
    assert ds.targets.dtype == np.int64
    for k, i in enumerate(order):
        x, y = ds[k]
        assert type(y) is int and y == labels[i]
        assert x.dtype == torch.float32 and x.shape == (1, 5, 7)
        np.testing.assert_array_equal(x.numpy()[0], imgs[i].astype(np.float32) / np.float32(255))


def test_image_folder_rgb_and_start(tmp_path):
    imgs = _images((4, 3, 6, 3), seed=1)
    labels = np.array([1, 0, 1, 0])
    write_image_folder(imgs[:2], labels[:2], tmp_path, ["cat", "dog"])
    write_image_folder(imgs[2:], labels[2:], tmp_path, ["cat", "dog"], start=2)  # a second chunk
    ds = image_folder(tmp_path)
    assert ds.classes == ["cat", "dog"] and list(ds.targets) == [0, 0, 1, 1]
    for k, i in enumerate([1, 3, 0, 2]):
        x, y = ds[k]
        assert x.shape == (3, 3, 6) and y == labels[i]
        np.testing.assert_array_equal(x.numpy(), imgs[i].transpose(2, 0, 1).astype(np.float32) / np.float32(255))
    gray = image_folder(tmp_path, grayscale=True)[0][0]
    expect = np.asarray(Image.fromarray(imgs[1]).convert("L"), dtype=np.float32) / np.float32(255)
    np.testing.assert_array_equal(gray.numpy()[0], expect)


def test_image_folder_resize_and_normalise(tmp_path):
    imgs, labels = _images((3, 8, 10, 3), seed=2), np.array([0, 1, 0])
    write_image_folder(imgs, labels, tmp_path)
    ds = image_folder(tmp_path, size=(4, 9))
    assert all(ds[k][0].shape == (3, 4, 9) for k in range(3))
    expect = np.asarray(Image.fromarray(imgs[0]).resize((9, 4), Image.Resampling.BILINEAR), dtype=np.float32)
    np.testing.assert_allclose(ds[0][0].numpy(), expect.transpose(2, 0, 1) / 255, atol=1e-7)
    assert image_folder(tmp_path, size=6)[1][0].shape == (3, 6, 6)
    mean, std = np.array([0.5, 0.4, 0.3]), np.array([0.2, 0.25, 0.5])
    x = image_folder(tmp_path, mean=mean, std=std)[2][0].numpy()
    expect = (imgs[1].astype(np.float64) / 255 - mean) / std  # item 2 is class 1: image 1
    np.testing.assert_allclose(x, expect.transpose(2, 0, 1), rtol=1e-5, atol=1e-6)
    xg = image_folder(tmp_path, grayscale=True, mean=0.5, std=0.5)[0][0].numpy()
    assert xg.shape == (1, 8, 10) and xg.min() >= -1 and xg.max() <= 1
    with pytest.raises(ValueError, match="mean needs 1 or 3"):
        image_folder(tmp_path, mean=[0.1, 0.2])
    with pytest.raises(ValueError, match="std must be > 0"):
        image_folder(tmp_path, std=0)


def test_image_folder_explicit_class_order(tmp_path):
    imgs, labels = _images((4, 2, 2)), np.array([0, 1, 1, 0])
    write_image_folder(imgs, labels, tmp_path, ["zebra", "ant"])
    assert image_folder(tmp_path).classes == ["ant", "zebra"]  # sorted names renumber the classes
    ds = image_folder(tmp_path, classes=["zebra", "ant"])
    assert list(ds.targets) == [0, 0, 1, 1]
    np.testing.assert_array_equal(ds[0][0].numpy()[0] * 255, imgs[0])


def test_image_folder_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        image_folder(tmp_path / "nope")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "readme.txt").write_text("x")
    with pytest.raises(DataError, match="no class folders"):
        image_folder(tmp_path / "root")
    write_image_folder(_images((2, 3, 3)), [0, 0], tmp_path / "root", ["a"])
    (tmp_path / "root" / "b").mkdir()
    (tmp_path / "root" / "b" / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match="'b' has no images"):
        image_folder(tmp_path / "root")
    (tmp_path / "root" / "b" / "broken.PNG").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    ds = image_folder(tmp_path / "root")  # the scan opens no image
    assert len(ds) == 3 and list(ds.targets) == [0, 0, 1]
    with pytest.raises(DataError, match="broken.PNG"):
        ds[2]
    # a consortium's class list: this silo holds classes a and c only; labels stay the list's indices
    write_image_folder(_images((2, 3, 3)), [0, 0], tmp_path / "silo", ["c"])
    write_image_folder(_images((1, 3, 3)), [0], tmp_path / "silo", ["a"])
    silo = image_folder(tmp_path / "silo", classes=["a", "b", "c"])
    assert silo.classes == ["a", "b", "c"] and sorted(silo.targets.tolist()) == [0, 2, 2]
    with pytest.raises(DataError, match="no images of the classes"):
        image_folder(tmp_path / "silo", classes=["x", "y"])
    with pytest.raises(DataError, match="class_names"):
        write_image_folder(_images((1, 2, 2)), [0], tmp_path / "w", ["T-shirt/top"])
    with pytest.raises(DataError, match="uint8"):
        write_image_folder(np.zeros((1, 2, 2)), [0], tmp_path / "w")


def test_image_folder_batches_through_dataloader(tmp_path):
    write_image_folder(_images((5, 4, 4, 3)), [0, 1, 2, 1, 0], tmp_path)
    xb, yb = next(iter(DataLoader(image_folder(tmp_path), batch_size=5, collate_fn=collate)))
    assert xb.shape == (5, 3, 4, 4) and xb.dtype == torch.float32
    assert yb.tolist() == [0, 0, 1, 1, 2] and yb.dtype == torch.int64


# ------------------------------------------------------------------------------------------------
# arrays and tables
# ------------------------------------------------------------------------------------------------
def test_numpy_npz_and_folder(tmp_path):
    X = _images((6, 1, 4, 4))
    y = np.array([3, 0, 1, 3, 2, 0])
    np.savez(tmp_path / "d.npz", X=X, y=y)
    ds = numpy_arrays(tmp_path / "d.npz")
    assert len(ds) == 6 and ds.classes == ["0", "1", "2", "3"] and ds.targets.dtype == np.int64
    x, lab = ds[4]
    assert x.dtype == torch.float32 and x.shape == (1, 4, 4) and type(lab) is int and lab == 2
    np.testing.assert_array_equal(x.numpy(), X[4].astype(np.float32))
    d = tmp_path / "arrays"
    d.mkdir()
    Xr, yr = np.random.default_rng(1).normal(size=(5, 3)), np.linspace(-1, 1, 5)
    np.save(d / "feats.npy", Xr)
    np.save(d / "target.npy", yr)
    reg = numpy_arrays(d, x_key="feats", y_key="target", task="regression")
    assert reg.classes is None and reg.targets.dtype == np.float64
    x, t = reg[1]
    assert type(t) is float and t == yr[1] and x.shape == (3,)
    np.testing.assert_array_equal(x.numpy(), Xr[1].astype(np.float32))
    np.save(d / "y.npy", np.arange(5.0))
    np.save(d / "X.npy", np.arange(5.0))  # one feature as (n,)
    assert numpy_arrays(d)[2][0].shape == (1,) and numpy_arrays(d)[2][1] == 2


def test_numpy_errors(tmp_path):
    with pytest.raises(DataError, match="expected an .npz"):
        numpy_arrays(tmp_path / "missing.npz")
    np.savez(tmp_path / "a.npz", X=np.zeros((3, 2)), y=np.array([0.0, 1.5, 1.0]), o=np.array([{"a": 1}]))
    with pytest.raises(DataError, match=r"key\(s\) \['Z'\] not found"):
        numpy_arrays(tmp_path / "a.npz", x_key="Z")
    with pytest.raises(DataError, match="row 2 holds 1.5"):
        numpy_arrays(tmp_path / "a.npz")
    assert numpy_arrays(tmp_path / "a.npz", task="regression")[1][1] == 1.5
    with pytest.raises(DataError, match="cannot read NumPy"):  # a pickled object array is refused
        numpy_arrays(tmp_path / "a.npz", x_key="o")
    np.savez(tmp_path / "b.npz", X=np.zeros((3, 2)), y=np.array([0, 1]))
    with pytest.raises(DataError, match="3 rows but y has 2"):
        numpy_arrays(tmp_path / "b.npz")
    np.savez(tmp_path / "c.npz", X=np.zeros((2, 2)), y=np.array([0, -1]))
    with pytest.raises(DataError, match=">= 0"):
        numpy_arrays(tmp_path / "c.npz")
    with pytest.raises(ValueError, match="task"):
        numpy_arrays(tmp_path / "c.npz", task="ranking")


def _frame():
    return pd.DataFrame({"id": ["u1", "u2", "u3", "u4"], "a": [1.5, 2.0, -3.0, 4.25], "b": [1, 0, 7, 2],
                         "label": ["no", "yes", "no", "maybe"], "score": [0.5, 1.5, 2.5, 3.5]})


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_table_round_trip(tmp_path, suffix):
    df, path = _frame(), tmp_path / f"t{suffix}"
    df.to_csv(path, index=False) if suffix == ".csv" else df.to_parquet(path, index=False)
    ds = table(path, label_column="label", id_column="id", feature_columns=["b", "a"])
    assert ds.classes == ["maybe", "no", "yes"] and list(ds.targets) == [1, 2, 1, 0]
    assert list(ds.ids) == ["u1", "u2", "u3", "u4"] and ds.feature_names == ["b", "a"]
    x, y = ds[3]
    assert x.dtype == torch.float32 and x.tolist() == [2.0, 4.25] and y == 0
    with pytest.raises(DataError, match=r"'label' is not numeric: row 1 holds 'no'"):
        table(path, label_column="score", id_column="id", task="regression")
    reg = table(path, label_column="score", feature_columns=["a", "b"], task="regression")
    assert reg[2][1] == 2.5 and reg.targets.dtype == np.float64 and reg.classes is None
    num = table(path, label_column="b", feature_columns=["a"])
    assert num.classes == [str(c) for c in range(8)] and num[2][1] == 7


def test_table_bad_cells(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b,y\n1,2,0\n3,,1\n5,6,0\n")
    with pytest.raises(DataError, match=r"empty cell in feature column 'b' at row 2"):
        table(p, label_column="y")
    p.write_text("a,b,y\n1,2,0\n3,4,1\n5,six,0\n")
    with pytest.raises(DataError, match=r"'b' is not numeric: row 3 holds 'six'"):
        table(p, label_column="y")
    p.write_text("a,y\n1,0\n3,\n")
    with pytest.raises(DataError, match="empty cell in label column 'y' at row 2"):
        table(p, label_column="y")
    with pytest.raises(DataError, match=r"\['z'\] not found"):
        table(p, label_column="z")
    pq = tmp_path / "bad.parquet"
    pd.DataFrame({"a": [1.0, 2.0], "c": ["1", "x"], "y": [0, 1]}).to_parquet(pq)
    with pytest.raises(DataError, match=r"'c' is not numeric: row 2 holds 'x'"):
        table(pq, label_column="y")
    with pytest.raises(DataError, match="not found"):
        table(tmp_path / "none.csv", label_column="y")


# ------------------------------------------------------------------------------------------------
# Fashion-MNIST and helpers
# ------------------------------------------------------------------------------------------------
def test_fashion_mnist_limit():
    ds = fashion_mnist("train", limit=100)
    assert len(ds) == 100 and ds.targets.dtype == np.int64 and ds.classes[0] == "T-shirt/top"
    x, y = ds[99]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and type(y) is int
    assert 0 <= ds.targets.min() and ds.targets.max() <= 9 and len(np.unique(ds.targets)) == 10
    root = "/usr/share/datasets/fashion-mnist"
    with gzip.open(f"{root}/train-images-idx3-ubyte.gz") as f:  # independent IDX read: 16-byte header
        raw = np.frombuffer(f.read(16 + 100 * 784), np.uint8, offset=16).reshape(100, 28, 28)
    with gzip.open(f"{root}/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(8 + 100), np.uint8, offset=8)
    np.testing.assert_array_equal(ds.targets, labels)
    np.testing.assert_array_equal(x.numpy()[0], raw[99].astype(np.float32) / np.float32(255))
    assert len(fashion_mnist("test")) == 10000
    with pytest.raises(FileNotFoundError):
        fashion_mnist(root="/nonexistent")


class _NoTargets(Dataset):
    def __init__(self, ys):
        self.ys = ys

    def __len__(self):
        return len(self.ys)

    def __getitem__(self, i):
        return torch.zeros(2), self.ys[i]


def test_dataset_targets(tmp_path):
    np.savez(tmp_path / "d.npz", X=np.zeros((6, 2)), y=np.array([5, 4, 3, 2, 1, 0]))
    ds = numpy_arrays(tmp_path / "d.npz")
    sub = Subset(Subset(ds, [5, 1, 3, 0]), [2, 0])
    np.testing.assert_array_equal(dataset_targets(sub), [2, 0])
    np.testing.assert_array_equal(dataset_targets(ConcatDataset([ds, sub])), [5, 4, 3, 2, 1, 0, 2, 0])
    t = dataset_targets(_NoTargets([torch.tensor(3), np.int32(1), 2]))
    assert t.dtype == np.int64 and t.tolist() == [3, 1, 2]
    f = dataset_targets(_NoTargets([0.5, 1, torch.tensor(2.5)]))
    assert f.dtype == np.float64 and f.tolist() == [0.5, 1.0, 2.5]
    wrong = _NoTargets([1, 0])
    wrong.targets = np.array([9, 9, 9])  # wrong length: read the items instead
    assert dataset_targets(wrong).tolist() == [1, 0]
    with pytest.raises(ValueError, match="item 0: label must be a scalar"):
        dataset_targets(_NoTargets([torch.zeros(3)]))


def test_collate():
    xb, yb = collate([(torch.ones(2, 3, dtype=torch.float64), 1), (torch.zeros(2, 3, dtype=torch.float64), 0)])
    assert xb.shape == (2, 2, 3) and xb.dtype == torch.float64 and yb.dtype == torch.int64
    assert yb.tolist() == [1, 0] and xb[0].sum() == 6
    _, yf = collate([(torch.ones(2), 1), (torch.ones(2), 0.5)])
    assert yf.dtype == torch.float32 and yf.tolist() == [1.0, 0.5]
    _, yt = collate([(torch.ones(2), torch.tensor(4)), (torch.ones(2), np.int64(2))])
    assert yt.dtype == torch.int64 and yt.tolist() == [4, 2]
    with pytest.raises(ValueError, match=r"item 2 has x \(3,\)"):
        collate([(torch.ones(2), 0), (torch.ones(2), 1), (torch.ones(3), 0), (torch.ones(4), 1)])
    with pytest.raises(ValueError, match="item 1 has x"):
        collate([(torch.ones(2), 0), (torch.ones(2, dtype=torch.int64), 1)])
    with pytest.raises(ValueError, match="no items"):
        collate([])
