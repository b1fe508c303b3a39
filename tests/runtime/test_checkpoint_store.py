"""CheckpointStore: atomic steps, hash checks, keep=2, safe formats."""
from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest

from secureflhv.runtime.store import checkpoint as ck
from secureflhv.runtime.store.artifacts import sha256_hex
from secureflhv.runtime.store.checkpoint import CheckpointError, CheckpointStore, store_for


def _store(tmp_path, **kw):
    return store_for(tmp_path, job_id="job-1", party_id="guest", **kw)


def test_round_trip_exact(tmp_path):
    store = _store(tmp_path)
    w = np.random.default_rng(0).normal(size=(5, 3))
    store.save(3, arrays={"w": w, "ids": np.arange(4, dtype=np.int64)}, state={"epoch": 3, "loss": [0.5, 0.25]})
    arrays, state = store.load(3)
    assert np.array_equal(arrays["w"], w) and arrays["w"].dtype == w.dtype
    assert arrays["ids"].tolist() == [0, 1, 2, 3]
    assert state == {"epoch": 3, "loss": [0.5, 0.25]}
    assert store.last_complete_step() == 3
    assert (tmp_path / "guest" / "checkpoints" / "step-00000003" / "manifest.json").is_file()


def test_keeps_last_two(tmp_path):
    store = _store(tmp_path)
    for step in range(5):
        store.save(step, state={"s": step})
    assert store.steps() == [3, 4]
    assert store.load(3)[1] == {"s": 3}


def test_crash_mid_write_leaves_previous_step(tmp_path, monkeypatch):
    store = _store(tmp_path)
    store.save(1, arrays={"w": np.ones(3)}, state={"epoch": 1})
    real = ck._write_synced
    calls = {"n": 0}

    def dying(path, data, mode=0o644):
        calls["n"] += 1
        if calls["n"] == 2:  # the process "dies" after one file of step 2
            raise KeyboardInterrupt("simulated crash")
        real(path, data, mode)

    monkeypatch.setattr(ck, "_write_synced", dying)
    with pytest.raises(KeyboardInterrupt):
        store.save(2, arrays={"w": np.zeros(3)}, state={"epoch": 2})
    monkeypatch.setattr(ck, "_write_synced", real)
    assert store.last_complete_step() == 1
    assert store.load(1)[0]["w"].tolist() == [1.0, 1.0, 1.0]


def test_half_written_folder_is_not_a_step(tmp_path):
    """A temporary folder left by a SIGKILL (no rename) is ignored and cleaned on the next save."""
    store = _store(tmp_path)
    store.save(1, state={"epoch": 1})
    leftover = store.root / ".tmp-step-00000002-abc"
    leftover.mkdir()
    (leftover / "state.json").write_text("{")
    assert store.steps() == [1] and store.last_complete_step() == 1
    store.save(2, state={"epoch": 2})
    assert not leftover.exists()


def test_tampered_file_rejected_and_falls_back(tmp_path):
    store = _store(tmp_path)
    store.save(1, arrays={"w": np.ones(3)}, state={"epoch": 1})
    store.save(2, arrays={"w": np.full(3, 2.0)}, state={"epoch": 2})
    path = store.root / "step-00000002" / "w.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="w.npy"):
        store.load(2)
    assert store.last_complete_step() == 1


def test_tampered_manifest_and_extra_file_rejected(tmp_path):
    store = _store(tmp_path)
    store.save(1, state={"epoch": 1})
    mpath = store.root / "step-00000001" / "manifest.json"
    manifest = json.loads(mpath.read_text())
    manifest["files"]["state.json"] = "0" * 64
    mpath.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="state.json"):
        store.load(1)
    store.save(2, state={"epoch": 2})
    (store.root / "step-00000002" / "evil.pkl").write_bytes(b"\x80\x04")
    with pytest.raises(CheckpointError, match="evil.pkl"):
        store.load(2)


def test_other_party_or_job_rejected(tmp_path):
    _store(tmp_path).save(1, state={})
    other_job = CheckpointStore(tmp_path / "guest" / "checkpoints", job_id="job-2", party_id="guest")
    with pytest.raises(CheckpointError, match="job_id"):
        other_job.load(1)
    other_party = CheckpointStore(tmp_path / "guest" / "checkpoints", job_id="job-1", party_id="host1")
    assert other_party.last_complete_step() is None


def test_no_pickle(tmp_path):
    store = _store(tmp_path)
    with pytest.raises(CheckpointError, match="object"):
        store.save(1, arrays={"x": np.array([{"a": 1}], dtype=object)})
    # a hand-made pickled .npy with a matching hash is still refused by np.load(allow_pickle=False)
    store.save(1, arrays={"x": np.zeros(2)})
    folder = store.root / "step-00000001"
    import io
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (folder / "x.npy").write_bytes(buf.getvalue())
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["x.npy"] = sha256_hex(buf.getvalue())
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="x.npy"):
        store.load(1)


def test_bad_steps(tmp_path):
    store = _store(tmp_path)
    for bad in (-1, True, 1.5, "3", ck.MAX_STEP + 1):
        with pytest.raises(CheckpointError):
            store.save(bad, state={})


def test_secret_mode_0600(tmp_path):
    store = _store(tmp_path)
    path = store.write_secret("paillier_private.json", b'{"p": 1}')
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert store.read_secret("paillier_private.json") == b'{"p": 1}'
    assert store.read_secret("absent.json") is None
