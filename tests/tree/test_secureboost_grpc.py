"""SecureBoost across real processes over gRPC with mutual TLS on loopback:
vertical (guest + 2 hosts) and horizontal (server + 3 clients with secure aggregation; also with one
client SIGKILLed mid-training). Each run's model must equal the centralised twin (after the kill: the
twin on all rows before, on the survivors' rows from the killed client's round on)."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

import sb_procs
from sb_harness import two_phase_reference
from secureflhv.runtime.job.demo import free_ports
from secureflhv.transport.certs import generate_certificates
from secureflhv.tree.binning import fit_cuts
from secureflhv.tree.model import BoostedModel
from secureflhv.tree.reference import fit_reference


def _run(target, party_ids, tmp_path, report=None):
    """Run ``target`` for each party in its own process; collect the reports of ``report`` (default all)."""
    generate_certificates(tmp_path / "certs", party_ids)
    addresses = {p: f"127.0.0.1:{port}" for p, port in zip(party_ids, free_ports(len(party_ids)))}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(p, addresses, str(tmp_path / "certs"), q)) for p in party_ids]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in report or party_ids:
            pid, val = q.get(timeout=240)
            out[pid] = val
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    errors = {k: v for k, v in out.items() if isinstance(v, str) and v.startswith("ERROR")}
    assert not errors, errors
    return out


@pytest.mark.slow
def test_vertical_guest_and_two_hosts_over_grpc_tls(tmp_path):
    out = _run(sb_procs.vertical_party, ["guest", *sb_procs.HOSTS], tmp_path)
    X, y = sb_procs.breast_cancer()
    order = np.concatenate(sb_procs.COLS)
    cuts = [c for cols in sb_procs.COLS for c in fit_cuts(X[:, cols], sb_procs.vparams().max_bin)]
    ref = fit_reference(X[:, order], y, cuts, sb_procs.vparams())
    np.testing.assert_allclose(np.array(out["guest"]), ref.predict_margin(X[:, order]), rtol=1e-9, atol=1e-12)
    assert out["host-1"] + out["host-2"] > 0  # the hosts' private split tables were used


@pytest.mark.slow
def test_horizontal_server_and_three_clients_over_grpc_tls(tmp_path):
    out = _run(sb_procs.horizontal_party, ["server", *sb_procs.CLIENTS], tmp_path)
    X, y = sb_procs.breast_cancer()
    pred, cuts, base = out["server"]
    ref = fit_reference(X, y, [np.array(c) for c in cuts], sb_procs.hparams(), base=np.array(base))
    np.testing.assert_allclose(np.array(pred), ref.predict(X), rtol=1e-9, atol=1e-12)
    for c in sb_procs.CLIENTS:
        np.testing.assert_allclose(np.array(out[c]), np.array(pred), rtol=0, atol=0)


@pytest.mark.slow
def test_horizontal_client_killed_mid_training_the_others_finish_over_grpc_tls(tmp_path):
    survivors = ["client-1", "client-3"]
    out = _run(sb_procs.horizontal_dropout_party, ["server", *sb_procs.CLIENTS], tmp_path,
               report=["server", *survivors])
    assert "client-2" not in out   # killed: it reported nothing
    X, y = sb_procs.breast_cancer()
    pred, cuts, base = out["server"]
    model = BoostedModel(sb_procs.hparams(), np.array(base), [], [np.array(c) for c in cuts])
    shards = [(X[r], y[r]) for r in (sb_procs.client_rows(c, len(y)) for c in sb_procs.CLIENTS)]
    model.trees = two_phase_reference(shards, [0, 2], 1, model, sb_procs.hparams())
    np.testing.assert_allclose(np.array(pred), model.predict(X), rtol=1e-9, atol=1e-12)
    full = fit_reference(X, y, model.cuts, sb_procs.hparams(), base=model.base_margin)
    assert not np.allclose(np.array(pred), full.predict(X))   # the survivors' rows alone built trees 1, 2
    for c in survivors:
        np.testing.assert_allclose(np.array(out[c]), np.array(pred), rtol=0, atol=0)
