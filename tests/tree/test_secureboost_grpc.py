"""SecureBoost across real processes over gRPC with mutual TLS on loopback:
vertical (guest + 2 hosts) and horizontal (server + 3 clients with secure aggregation).
Each run's model must equal the centralised twin."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

import sb_procs
from secureflhv.runtime.demo import free_ports
from secureflhv.transport.certs import generate_certificates
from secureflhv.tree.binning import fit_cuts
from secureflhv.tree.reference import fit_reference


def _run(target, party_ids, tmp_path):
    generate_certificates(tmp_path / "certs", party_ids)
    addresses = {p: f"127.0.0.1:{port}" for p, port in zip(party_ids, free_ports(len(party_ids)))}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(p, addresses, str(tmp_path / "certs"), q)) for p in party_ids]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in party_ids:
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
