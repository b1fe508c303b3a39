"""Client contribution normalisation (Kundalwal et al. 2024, Alg. 1, eqs. 3–8) under secure aggregation:
the factors Λ_r the clients obtain from the two secure sums equal the paper's formula computed in the
clear from every client's z_r; lying values never produce NaN/inf weights; a job file turns it on."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fl_harness import blobs, run_fl  # noqa: E402

from secureflhv.horizontal.contribution import ContributionClient, exp_score, unit  # noqa: E402
from secureflhv.horizontal.models import ModelSpec  # noqa: E402
from secureflhv.horizontal.strategies import LocalTrainConfig  # noqa: E402
from secureflhv.proto import messages_pb2  # noqa: E402
from secureflhv.transport.base import ProtocolError  # noqa: E402
from secureflhv.transport.codec import tensor_to_proto  # noqa: E402

SPEC = ModelSpec(name="mlp", n_features=6, n_classes=3, hidden=(16, 8))
LOCAL = LocalTrainConfig(epochs=1, batch_size=16, lr=0.1)
T = 0.5


def paper_factors(Z: np.ndarray, temperature: float) -> np.ndarray:
    """Λ in the clear, as the paper writes it: S(q,p) = cos(z_q, z_p), s = row sums, softmax(s/T)."""
    n = len(Z)
    S = np.empty((n, n))
    for q in range(n):
        for p in range(n):
            S[q, p] = Z[q] @ Z[p] / (np.linalg.norm(Z[q]) * np.linalg.norm(Z[p]))
    s = S.sum(axis=1)
    return np.exp(s / temperature) / np.exp(s / temperature).sum()


def test_secure_factors_equal_the_paper_formula(secagg_cert_dir):
    from secagg_harness import RecordingTransport
    recs = []

    class Rec(RecordingTransport):
        def __init__(self, net, pid):
            super().__init__(net, pid)
            recs.append(self)

    shards, test = blobs(40, 4, n_features=6, n_classes=3, seed=4, skew=True)
    server, clients, errors = run_fl(shards, test, SPEC, "fedavg", "secagg", rounds=1, seed=2, local=LOCAL,
                                     fl_kw={"contribution_temperature": T}, cert_dir=secagg_cert_dir,
                                     server_transport_cls=Rec)
    assert not errors, errors
    # the server's transcript holds no client's ẑ_r, e_r or Λ_r (as float64, the clients' own values)
    transcript = b"".join(p for _, _, p in recs[0].received)
    for c in clients:
        for secret in (unit(c.contrib.z)[:4], [c.contrib.e], [c.contrib.factor]):
            assert np.asarray(secret, dtype="<f8").tobytes() not in transcript
    Z = np.stack([c.contrib.z for c in clients])
    lam = np.array([c.contrib.factor for c in clients])
    expected = paper_factors(Z, T)
    assert not np.allclose(expected, 0.25, atol=1e-3)  # the skew makes the factors differ
    np.testing.assert_allclose(lam, expected, rtol=1e-5)
    rec = server.history[0].contribution
    assert rec["status"] == "ok" and rec["n"] == 4
    # the server learnt Σẑ (its norm) and Σ e: both as the clear formula gives them
    zsum = sum(unit(z) for z in Z)
    assert rec["latent_sum_norm"] == pytest.approx(np.linalg.norm(zsum), rel=1e-5)
    assert rec["exp_sum"] == pytest.approx(sum(exp_score(unit(z), zsum, T)[1] for z in Z), rel=1e-5)
    # the model was aggregated with weights Λ_r n_r: the total weight the server saw is Σ Λ_r n_r
    n = np.array([len(y) for _, y in shards])
    assert server.history[0].aggregation["model"]["weight"] == pytest.approx(float(lam @ n), abs=4 / 2 ** 16)
    assert all(c.history[0]["contribution_factor"] == pytest.approx(f) for c, f in zip(clients, lam))


def test_plain_transcript_does_show_the_latents():
    """Control for the transcript check above: with ``plain`` aggregation the server sees every ẑ_r."""
    from secagg_harness import RecordingTransport
    recs = []

    class Rec(RecordingTransport):
        def __init__(self, net, pid):
            super().__init__(net, pid)
            recs.append(self)

    shards, test = blobs(20, 3, n_features=6, n_classes=3, seed=4, skew=True)
    _, clients, errors = run_fl(shards, test, SPEC, "fedavg", "plain", rounds=1, seed=2, local=LOCAL,
                                fl_kw={"contribution_temperature": T}, server_transport_cls=Rec)
    assert not errors, errors
    transcript = b"".join(p for _, _, p in recs[0].received)
    assert all(np.asarray(unit(c.contrib.z)[:4], dtype="<f8").tobytes() in transcript for c in clients)


# Composition with every base strategy (FedAvg, FedProx, SCAFFOLD, FedNova): secagg = plain_quantised bit for
# bit over two rounds, the factors equal the paper's formula and change the model, under every library
# partition: test_strategy_partition_grid.py (rows "<strategy>+contribution").


def _liar(client, which: str):
    """Make ``client`` lie in one of the two sums: a negative exp term, or a latent with weight 0.5."""
    agg = client.contrib.exp_client if which == "exp" else client.contrib.latent_client
    honest = agg.submit

    def lying(round_id, participants, vector, weight):
        if which == "exp":
            return honest(round_id, participants, np.array([-1.0]), weight)
        return honest(round_id, participants, vector, 0.5)

    agg.submit = lying


@pytest.mark.parametrize("which", ["exp", "latent"])
def test_a_lying_client_is_rejected_never_nan(which, caplog, monkeypatch):
    import fl_harness

    class Lying(fl_harness.HorizontalClient):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            if self.party_id == "c1":
                _liar(self, which)

    monkeypatch.setattr(fl_harness, "HorizontalClient", Lying)
    caplog.set_level(logging.WARNING, logger="secureflhv.horizontal.contribution")
    shards, test = blobs(24, 2, n_features=6, n_classes=3, seed=3)
    server, clients, errors = run_fl(shards, test, SPEC, "fedavg", "secagg", rounds=1, seed=1, local=LOCAL,
                                     fl_kw={"contribution_temperature": T},
                                     agg_kw=dict(min_clients=2, max_colluders=0))  # two clients: the opt-in
    assert not errors, errors
    assert server.history[0].contribution["status"] == "rejected"
    assert "a client lied" in caplog.text
    assert np.all(np.isfinite(server.global_vec))
    assert all(c.contrib.factor is None for c in clients)  # plain weights this round
    assert all("contribution_factor" not in c.history[0] for c in clients)


def _client(dim=3):
    from secureflhv.secagg import AggregationConfig
    from secureflhv.transport.inprocess import InProcessNetwork
    net = InProcessNetwork("unit", ["server", "c0"])
    return ContributionClient(net.transport("c0"), "server", dim, AggregationConfig(), T, 1.0)


@pytest.mark.parametrize("value, n", [(float("nan"), 3), (float("inf"), 3), (0.0, 3), (-0.5, 3), (0.2, 3),
                                      (3.5, 3), (1.0, 1), (1.0, 4), (1.0, 2.5)])
def test_client_refuses_a_bad_exp_sum(value, n):
    parse = _client()._exp_parser(3, own=0.5)
    msg = messages_pb2.Bundle(scalars={"exp_sum": value, "n": n}, text={"status": "ok"})
    with pytest.raises(ProtocolError):
        parse(msg.SerializeToString())


def test_client_accepts_a_good_exp_sum_and_refuses_bad_latent_sums():
    c = _client()
    ok = messages_pb2.Bundle(scalars={"exp_sum": 1.25, "n": 3}, text={"status": "ok"})
    assert c._exp_parser(3, own=0.5)(ok.SerializeToString()) == ("ok", 1.25)
    parse = c._latent_parser(3)
    good = messages_pb2.Bundle(tensors={"latent_sum": tensor_to_proto(np.array([1.0, 1.5, 0.5]), "<f8")},
                               scalars={"n": 3}, text={"status": "ok"})
    status, total, n = parse(good.SerializeToString())
    assert status == "ok" and n == 3 and np.array_equal(total, [1.0, 1.5, 0.5])
    for tensor, status in ((np.array([3.0, 3.0, 0.0]), "ok"), (np.array([np.nan, 0, 0]), "ok"),
                           (np.array([1.0, 1.0]), "ok"), (np.array([1.0, 1.0, 1.0]), "maybe")):
        bad = messages_pb2.Bundle(tensors={"latent_sum": tensor_to_proto(tensor, "<f8")}, scalars={"n": 3},
                                  text={"status": status})
        with pytest.raises(ProtocolError):
            parse(bad.SerializeToString())


def test_job_file_turns_it_on_and_runs_through_secagg(tmp_path):
    from test_fl_job import PARAMS, check_artifacts, job_dict, run_in_process, shards as job_shards

    from secureflhv.runtime.job.load import JobConfigError, parse_job
    from secureflhv.runtime.algorithms import horizontal_fl as hj
    from secureflhv.runtime.job.registry import job_params

    npz, _ = job_shards(tmp_path, 3)
    with pytest.raises(JobConfigError, match=r"params\.contribution_temperature"):
        parse_job(job_dict(npz, {**PARAMS, "contribution_temperature": 0}), tmp_path)
    # FedProx (PARAMS). FedNova + normalisation once fell from 0.60 to 0.15 test accuracy in round 2 under CI
    # load. Investigated: not a protocol fault. At this job's lr 0.1 and momentum 0.9 local training is chaotic,
    # and FedNova's d = delta / a (a ~ 300 steps) makes its fixed-point rounding ~1000x FedAvg's, so the
    # unseeded stochastic rounding alone moved round 2 between 0.33 and 0.72 over 81 runs (FedProx + CCN:
    # 0.66-0.67); at lr 0.03 both are stable. The one real fault found on the way, FedNova combining part sums
    # over different clients, is refused now (test_fl_dropout.py). FedNova's composition is covered exactly
    # by the strategy x partition grid.
    cfg = parse_job(job_dict(npz, {**PARAMS, "contribution_temperature": 1.0}, tls=True), tmp_path)
    assert hj.fl_config(cfg, job_params(cfg)).contribution_temperature == 1.0
    run_in_process(cfg)
    metrics = check_artifacts(cfg, tmp_path / "out", 2)
    assert all(r["contribution"]["status"] == "ok" and r["contribution"]["n"] == 3 for r in metrics["rounds"])
    assert all(r["aggregation"]["model"]["k_bits"] > 0 for r in metrics["rounds"])
    # each client's own accuracy (on its own split) and the worst one are in the job's metrics
    assert all(sorted(r["client_accuracy"]) == ["client-1", "client-2", "client-3"] and
               r["worst_client_accuracy"] == min(r["client_accuracy"].values()) for r in metrics["rounds"])


def test_a_client_dropping_in_training_leaves_a_normalised_round_of_the_others():
    """c3 crashes in local training: the latent and exp sums, and the model, are over the 3 survivors,
    whose factors are the paper's formula over those 3 (t = 3 of 4)."""
    shards, test = blobs(30, 4, n_features=6, n_classes=3, seed=6, skew=True)
    server, clients, errors = run_fl(shards, test, SPEC, "fedprox", "secagg", rounds=1, seed=2, local=LOCAL,
                                     fl_kw={"contribution_temperature": T}, fail={3: 1}, deadline=20,
                                     agg_kw={"threshold": 3, "stage_timeout_s": 3, "input_timeout_s": 10})
    assert set(errors) == {"c3"}
    rec = server.history[0]
    assert rec.contribution["status"] == "ok" and rec.contribution["n"] == 3 and rec.dropped == ["c3"]
    alive = clients[:3]
    lam = np.array([c.contrib.factor for c in alive])
    np.testing.assert_allclose(lam, paper_factors(np.stack([c.contrib.z for c in alive]), T), rtol=1e-5)
    assert np.all(np.isfinite(server.global_vec))


@pytest.mark.slow
def test_multiprocess_grpc_tls_job_with_contribution_normalisation(tmp_path):
    """SCAFFOLD + contribution normalisation over label-Dirichlet shards, server and 3 clients as real
    processes over gRPC with mutual TLS: the two secure sums and answers run every round, and (the learning
    check) every party's state, factors and metrics equal to the bit those of the same job in one process
    with plaintext aggregation of the same quantised updates."""
    import json

    from fl_harness import compare_with_in_process
    from test_fl_job import GRPC_JOB_PARTIES as ids, PARAMS, check_artifacts, run_grpc_job

    from secureflhv.runtime.job.load import parse_job

    params = {**PARAMS, "strategy": "scaffold", "contribution_temperature": 1.0, "local_epochs": 1,
              "aggregation": {**PARAMS["aggregation"], "seed": 7}}  # the same stochastic rounding in both runs
    job, out = run_grpc_job(tmp_path, params)
    metrics = check_artifacts(parse_job(job, tmp_path), tmp_path / "out", 2, floor=None)
    compare_with_in_process(job, tmp_path, tmp_path / "threads", ids)
    assert all(r["contribution"]["status"] == "ok" and r["contribution"]["n"] == 3 for r in metrics["rounds"])
    for c in ids[1:]:  # each client kept its own factor; together they sum to 1 (up to quantisation)
        rounds = json.loads((tmp_path / "out" / c / "metrics.json").read_text())["rounds"]
        assert all(0 < r["contribution_factor"] <= 1 for r in rounds)
    total = sum(json.loads((tmp_path / "out" / c / "metrics.json").read_text())["rounds"][-1]["contribution_factor"]
                for c in ids[1:])
    assert total == pytest.approx(1.0, abs=1e-6)
