"""MultiConfederated learning resumed from any round's checkpoint ends exactly where the uninterrupted run ends.

In-process (the process-level SIGKILL test over gRPC + mTLS is in test_mc_job.py): every peer saves its
checkpoint states through a real :class:`CheckpointStore` (JSON + ``.npy``, hashed); new peers built
with ``resume=`` the stored states of round k (every peer the same k) must end with the same pools
(bit for bit), round records, forks and personal models. One peer's labels are flipped so that forks happen.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mc_harness import LOCAL, SPEC, cancer_shards, config, run_peers  # noqa: E402

from secureflhv.horizontal.mc_peer import MultiConfederatedPeer  # noqa: E402
from secureflhv.runtime.store.checkpoint import CheckpointStore  # noqa: E402
from secureflhv.transport.inprocess import InProcessNetwork  # noqa: E402
from secureflhv.transport.lifecycle import Checkpointer  # noqa: E402

CFG = config(rounds=4, fork_margin=0.05, max_models=7, merge_tolerance=0.05,
             local=dataclasses.replace(LOCAL, epochs=2, batch_size=16, lr=0.1))


@pytest.fixture(scope="module")
def data():
    shards = cancer_shards(3, rows=70, seed=2)
    (X2, y2) = shards[2]
    return shards[:2] + [(X2, 1 - y2)]  # a peer whose labels disagree: it forks its own model


def _run(data, root: Path, resume_step: int | None = None):
    stores = {pid: CheckpointStore(root / pid, job_id="mc-resume", party_id=pid, keep=10)
              for pid in (f"p{i}" for i in range(len(data)))}  # run_peers' peer ids
    peers, errors, _ = run_peers(data, CFG, callbacks={pid: [Checkpointer(s)] for pid, s in stores.items()},
                                 resume=None if resume_step is None else
                                 {pid: s.load(resume_step) for pid, s in stores.items()})
    assert not errors, errors
    return peers, stores


def _records(peer):
    return [{k: v for k, v in dataclasses.asdict(r).items() if k != "seconds"} for r in peer.history]


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    return _run(data, tmp_path_factory.mktemp("mc-full"))


def test_resume_from_every_round_equals_uninterrupted(data, uninterrupted, tmp_path):
    full, stores = uninterrupted
    assert all(s.steps() == list(range(1, CFG.rounds + 1)) for s in stores.values())
    assert any(r.forked for p in full for r in p.history), "the scenario should fork"
    for k in range(1, CFG.rounds + 1):  # k == rounds: nothing left to run, the state alone must be whole
        root = tmp_path / f"resume-{k}"
        for pid, s in stores.items():  # a copy of the stores as they were after round k
            CheckpointStore(root / pid, job_id="mc-resume", party_id=pid, keep=10).save(
                k, arrays=s.load(k)[0], state=s.load(k)[1])
        resumed, later = _run(data, root, resume_step=k)
        for a, b in zip(full, resumed):
            assert list(a.pool) == list(b.pool), (k, a.party_id)
            for m in a.pool:
                assert a.pool[m].dtype == b.pool[m].dtype and np.array_equal(a.pool[m], b.pool[m]), (k, m)
            assert _records(a) == _records(b)
            assert a.pending_fork == b.pending_fork and np.array_equal(a.personal_model, b.personal_model)
        assert all(s.steps() == list(range(k, CFG.rounds + 1)) for s in later.values())  # only what it ran


def test_a_checkpoint_of_another_peer_or_shape_is_refused(data, uninterrupted):
    _, stores = uninterrupted
    arrays, state = stores["p0"].load(2)
    with pytest.raises(ValueError, match=r"checkpoint: not a MultiConfederated checkpoint of p1 .*party/peers/dim"):
        _run_one_with(data, (arrays, state), "p1")
    bad = {"pool": arrays["pool"][:, :-1]}
    with pytest.raises(ValueError, match=r"checkpoint: .* of p0 .*\(pool do not fit\)"):
        _run_one_with(data, (bad, state), "p0")


def _run_one_with(data, resume, pid):
    """Build peer ``pid`` with ``resume`` and start it: the restore fails before any message."""
    ids = ["p0", "p1", "p2"]
    net = InProcessNetwork("mc-bad", ids, deadline=2)
    X, y = data[ids.index(pid)]
    peer = MultiConfederatedPeer(net.transport(pid), ids, X[:-20], y[:-20], X[-20:], y[-20:], SPEC, CFG, resume=resume)
    peer.run()
