"""SecureBoost across real processes over gRPC with mutual TLS on loopback: vertical (guest + 2 hosts, the
library's ``overlap`` feature split) and horizontal (server + 3 clients with secure aggregation on the
library's ``label_dirichlet+feature_noise`` partition; also on ``quantity_dirichlet`` with one client
SIGKILLed mid-training). Each run's model must equal the independent numpy twin (tests/tree/numpy_gbdt.py:
its own cuts and base margin; after the kill: the twin on all rows before, on the survivors' rows from the
killed client's round on)."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

import sb_procs
import numpy_gbdt as twin
from sb_harness import assert_trees_equal_twin, horizontal_nodes, pooled_grid_cuts, two_phase_twin, vertical_nodes
from secureflhv.runtime.job.demo import free_ports
from secureflhv.transport.certs import generate_certificates
from secureflhv.tree.model import model_from_dict


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


def _assert_horizontal(model_doc, want) -> None:
    model = model_from_dict(model_doc)
    for got, cuts in zip(model.cuts, want.cuts, strict=True):
        np.testing.assert_array_equal(got, cuts)
    np.testing.assert_allclose(model.base_margin, want.base, rtol=1e-12, atol=0)
    assert_trees_equal_twin([(t.output, horizontal_nodes(t)) for t in model.trees], want)


@pytest.mark.slow
def test_vertical_guest_and_two_hosts_over_grpc_tls(tmp_path):
    out = _run(sb_procs.vertical_party, ["guest", *sb_procs.HOSTS], tmp_path)
    X, y = sb_procs.breast_cancer()
    cols = sb_procs.columns()
    assert len(set.intersection(*map(set, cols))) >= 2       # the overlap split: columns every party holds
    Xo = X[:, np.concatenate(cols)]
    params = sb_procs.vparams()
    ref = twin.fit(Xo, y, [twin.quantile_cuts(Xo[:, j], params.max_bin) for j in range(Xo.shape[1])],
                   twin.Config.of(params))
    margin, doc = out["guest"]
    model = model_from_dict(doc)
    hosts = [(h, len(c), out[h]) for h, c in zip(sb_procs.HOSTS, cols[1:])]
    assert_trees_equal_twin([(t.output, vertical_nodes(t, len(cols[0]), hosts)) for t in model.trees], ref)
    np.testing.assert_allclose(np.array(margin), ref.predict_margin(Xo), rtol=0, atol=1e-5)
    assert len(out["host-1"]) + len(out["host-2"]) > 0  # the hosts' private split tables were used


@pytest.mark.slow
def test_horizontal_server_and_three_clients_over_grpc_tls(tmp_path):
    out = _run(sb_procs.horizontal_party, ["server", *sb_procs.CLIENTS], tmp_path)
    X, y = (np.concatenate(a) for a in zip(*sb_procs.shards("label_dirichlet+feature_noise")))
    pred, doc = out["server"]
    params = sb_procs.hparams()
    ref = twin.fit(X, y, pooled_grid_cuts(X, params), twin.Config.of(params))
    _assert_horizontal(doc, ref)
    np.testing.assert_allclose(np.array(pred), 1 / (1 + np.exp(-ref.predict_margin(X)[:, 0])), rtol=0, atol=1e-6)
    for c in sb_procs.CLIENTS:
        np.testing.assert_allclose(np.array(out[c]), np.array(pred), rtol=0, atol=0)


@pytest.mark.slow
def test_horizontal_client_killed_mid_training_the_others_finish_over_grpc_tls(tmp_path):
    survivors = ["client-1", "client-3"]
    out = _run(sb_procs.horizontal_dropout_party, ["server", *sb_procs.CLIENTS], tmp_path,
               report=["server", *survivors])
    assert "client-2" not in out   # killed: it reported nothing
    shards = sb_procs.shards("quantity_dirichlet")
    X, y = (np.concatenate(a) for a in zip(*shards))
    pred, doc = out["server"]
    params = sb_procs.hparams()
    want = two_phase_twin(shards, [0, 2], 1, params)
    _assert_horizontal(doc, want)
    np.testing.assert_allclose(np.array(pred), 1 / (1 + np.exp(-want.predict_margin(X)[:, 0])), rtol=0, atol=1e-6)
    full = twin.fit(X, y, want.cuts, twin.Config.of(params))
    assert not np.allclose(np.array(pred), 1 / (1 + np.exp(-full.predict_margin(X)[:, 0])), atol=1e-4)
    for c in survivors:
        np.testing.assert_allclose(np.array(out[c]), np.array(pred), rtol=0, atol=0)
