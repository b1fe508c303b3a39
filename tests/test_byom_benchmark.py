"""The throughput benchmark's shared workload (benchmarks/byom_models.py: plain numpy / torch, also run in Flower's
virtualenv) and a small run of its secureflhv side through the user-model path (issue 37)."""
import gzip
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import byom_models as bm  # noqa: E402
import byom_throughput  # noqa: E402

def test_dirichlet_split_partitions_and_respects_min_size():
    y = np.random.default_rng(1).integers(0, 10, 3000)
    parts = bm.dirichlet_split(y, 10, 0.3, seed=4)
    allidx = np.concatenate(parts)
    assert sorted(allidx.tolist()) == list(range(3000))
    assert min(len(p) for p in parts) >= 10
    assert all(np.array_equal(a, b) for a, b in zip(parts, bm.dirichlet_split(y, 10, 0.3, seed=4)))
    # label skew: with beta 0.3 some client's majority label holds far more than a tenth of its rows
    assert max(np.bincount(y[p], minlength=10).max() / len(p) for p in parts) > 0.3

def test_dirichlet_split_refuses_too_few_rows():
    with pytest.raises(ValueError, match="cannot give"):
        bm.dirichlet_split(np.zeros(50, int), 10, 0.5, 0)

def test_read_idx_gz_and_bad_header(tmp_path):
    data = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    p = tmp_path / "x-idx3-ubyte.gz"
    with gzip.open(p, "wb") as f:
        f.write(struct.pack(">HBB3I", 0, 8, 3, 2, 3, 4) + data.tobytes())
    assert np.array_equal(bm._read_idx(p), data)
    q = tmp_path / "bad"
    q.write_bytes(struct.pack(">HBB1I", 0, 8, 1, 5) + b"\x00\x01")
    with pytest.raises(ValueError, match="header says"):
        bm._read_idx(q)

def test_resnet8_shape_and_parameter_count():
    m = bm.resnet8()
    assert m(torch.zeros(2, 784)).shape == (2, 10)
    assert sum(p.numel() for p in m.parameters()) == 77754
    convs = [x for x in m.modules() if isinstance(x, torch.nn.Conv2d) and x.kernel_size == (3, 3)]
    assert len(convs) + 1 == 8  # 7 weighted 3x3 conv layers + the linear: ResNet-8
    assert bm.resnet8(in_channels=3)(torch.zeros(1, 3, 28, 28)).shape == (1, 10)

def test_workload_from_debian_files_is_deterministic():
    a = bm.workload(5, 300, 100, 0.5, 3)
    bm.workload.cache_clear()
    b = bm.workload(5, 300, 100, 0.5, 3)
    assert sum(len(s[1]) for s in a[0]) == 300 and a[1][0].shape == (100, 784)
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(a[0], b[0]))
    assert 0 <= a[0][0][0].min() and a[0][0][0].max() <= 1


def test_secureflhv_side_runs_the_user_model_path():
    """ResNet-8 (batch norm) through params.model.factory, secure and plain aggregation: figures for both."""
    out = byom_throughput.secureflhv_figures(3, 1, train_rows=120, test_rows=60, model="resnet8")
    for kind in ("secagg", "plain"):
        assert out[kind]["samples"] == 120 and out[kind]["client_samples_per_s"] > 0
        assert 0 <= out[kind]["accuracy"] <= 1
