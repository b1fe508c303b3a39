"""Vertical LR under every vertical partition of the library (``vertical_split``: even, random over three
parties, explicit column lists, overlap, and hosts holding a sample of the ids, aligned by PSI) equals the
independent centralised Taylor-LR (:func:`vlr_harness.reference_taylor_lr`, plain numpy) on the joined table:
the rows every party holds in PSI's agreed order, each party's columns side by side (a column held by two
parties twice: two features), the same batches and seed, to ``vlr_harness.TAYLOR_TOL`` (16 quantisation steps
of the encoded features; its comment gives the error budget). Both protocol modes take part."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from secureflhv.data import load_sklearn, vertical_split
from secureflhv.transport import InProcessNetwork
from secureflhv.vertical.psi import align_ids_guest, align_ids_host
from vlr_harness import TAYLOR_TOL as TOL, reference_taylor_lr, run_vertical_lr

CFG = dict(key_bits=512, insecure_test_key=True, epochs=3, batch_size=64, learning_rate=0.3, momentum=0.5,
           l2=0.01, seed=6, early_stopping_rounds=None)

SCENARIOS = {
    "even": (dict(n_hosts=1, scheme="even"), "arbiter"),
    "random-2hosts": (dict(n_hosts=2, scheme="random"), "two_party"),
    "explicit": (dict(n_hosts=1, scheme="explicit", columns=[list(range(0, 30, 3)), [c for c in range(30) if c % 3]]),
                 "arbiter"),
    "overlap": (dict(n_hosts=1, scheme="overlap", shared_fraction=0.2), "two_party"),
    "sample-overlap-psi": (dict(n_hosts=2, scheme="random", sample_overlap=0.8), "arbiter"),
}


def _psi(vp) -> list[list[str]]:
    """Every party's ids after PSI (threads over one in-process network), parties in ``vp`` order."""
    pids = ["guest"] + [f"host-{i}" for i in range(1, len(vp.parties))]
    net = InProcessNetwork("vlr-psi", pids, deadline=60)
    out, errors = {}, {}

    def run(i, pid):
        try:
            t = net.transport(pid)
            ids = list(vp.ids[i])
            psi = align_ids_guest(t, ids, pids[1:], workers=1) if i == 0 else align_ids_host(t, ids, "guest", workers=1)
            out[i] = list(psi.ids)
        except BaseException as exc:  # noqa: BLE001
            errors[pid] = exc

    threads = [threading.Thread(target=run, args=(i, p), daemon=True) for i, p in enumerate(pids)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    return [out[i] for i in range(len(pids))]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_vertical_partition_equals_the_centralised_taylor_lr(name):
    split, mode = SCENARIOS[name]
    ds = load_sklearn("breast_cancer")
    vp = vertical_split(ds, seed=3, **split)
    aligned = _psi(vp)
    assert all(ids == aligned[0] for ids in aligned)  # one agreed row order...
    assert set(aligned[0]) == set.intersection(*(set(i.tolist()) for i in vp.ids))  # ...of the common ids
    # each party's table in PSI order, standardised on its own columns
    blocks = []
    for i in range(len(vp.parties)):
        pos = {v: r for r, v in enumerate(vp.ids[i].tolist())}
        X = ds.X[vp.rows[i]][:, vp.columns[i]][[pos[v] for v in aligned[i]]]
        blocks.append((X - X.mean(0)) / X.std(0))
    row_of = dict(zip(vp.ids[0].tolist(), vp.rows[0].tolist()))
    y = ds.y[[row_of[v] for v in aligned[0]]]
    cfg = dict(CFG, mode=mode)
    results, errors, _, _ = run_vertical_lr(blocks[0], y, blocks[1:], cfg)
    assert not errors, errors

    # the twin: the joined table (a shared column twice) built from the dataset, not from the parties' tables
    rows = np.array([row_of[v] for v in aligned[0]])
    joined = np.column_stack([ds.X[rows][:, cols] for cols in vp.columns])
    joined = (joined - joined.mean(0)) / joined.std(0)
    w_ref, b_ref, losses_ref = reference_taylor_lr(joined, y, **cfg)
    fed = np.concatenate([results["guest"].weights] + [results[f"host-{i}"].weights
                                                       for i in range(1, len(vp.parties))])
    scale = np.max(np.abs(w_ref))
    assert scale > 0.1  # the model moved
    print(f"{name}: |federated - twin| weights {np.max(np.abs(fed - w_ref)):.3g}, intercept "
          f"{abs(results['guest'].intercept - b_ref):.3g}, losses "
          f"{np.max(np.abs(np.subtract(results['guest'].losses, losses_ref))):.3g} (TOL {TOL:.3g})")
    np.testing.assert_allclose(fed, w_ref, rtol=0, atol=TOL)
    assert results["guest"].intercept == pytest.approx(b_ref, rel=0, abs=TOL)
    np.testing.assert_allclose(results["guest"].losses, losses_ref, rtol=0, atol=TOL)
    if vp.shared_columns.size:  # a column held by both parties: the two copies are two features, equal weights
        g = list(vp.columns[0]).index(vp.shared_columns[0])
        h = list(vp.columns[1]).index(vp.shared_columns[0])
        assert results["guest"].weights[g] == pytest.approx(results["host-1"].weights[h], rel=1e-6)
