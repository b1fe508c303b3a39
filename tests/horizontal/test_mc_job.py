"""MultiConfederated learning as a job (``job.algorithm: multiconfederated``): no server role in config
validation, and real peer processes over gRPC + mutual TLS reach the models of an in-process run."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fl_harness  # noqa: E402
from fl_harness import run_job_threads, write_grpc_job  # noqa: E402
from mc_harness import cancer_shards  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from resume_harness import kill_after, resumed_steps, run_job  # noqa: E402

from secureflhv import load_model  # noqa: E402
from secureflhv.runtime.job.load import JobConfigError, parse_job  # noqa: E402
from secureflhv.runtime.job.data_prep import local_split  # noqa: E402
from secureflhv.runtime.algorithms.horizontal_fl import load_client_data  # noqa: E402
from secureflhv.runtime.algorithms import multiconfederated as mcj  # noqa: E402
from secureflhv.runtime.job.registry import job_params, job_spec  # noqa: E402
from secureflhv.runtime.process.rendezvous import partners  # noqa: E402

MODEL = {"name": "mlp", "n_features": 30, "n_classes": 2, "hidden": [8]}
PARAMS = {"model": MODEL, "rounds": 2, "batch_size": 32, "learning_rate": 0.05, "seed": 4, "test_fraction": 0.2,
          "fork_margin": 0.05}
PEERS = ["peer-a", "peer-b", "peer-c"]


def write_data(tmp_path: Path, n: int = 3) -> list[Path]:
    paths = []
    (tmp_path / "data").mkdir(exist_ok=True)
    for i, (X, y) in enumerate(cancer_shards(n, rows=80, seed=1)):
        cols = {f"f{j}": X[:, j] for j in range(X.shape[1])}
        lines = [",".join(["y", *cols])] + [",".join([str(int(y[r]))] + [repr(float(X[r, j])) for j in range(30)])
                                            for r in range(len(y))]
        path = tmp_path / "data" / f"peer{i}.csv"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


MC_JOB = {"algorithm": "multiconfederated", "job_id": "mc-test", "clients": PEERS}  # fl_harness.job_dict's


def job_dict(paths, *, server=False, params=PARAMS) -> dict:
    return fl_harness.job_dict(paths, params, server=server, **MC_JOB)


def test_a_server_is_refused_naming_the_field(tmp_path):
    paths = write_data(tmp_path, 2)
    with pytest.raises(JobConfigError, match=r"parties\[0\]\.role: multiconfederated is decentralised and has no "
                                             r"server role; remove party 'server'"):
        parse_job(job_dict(paths, server=True), tmp_path)
    with pytest.raises(JobConfigError, match=r"parties: multiconfederated needs at least two peers"):
        parse_job(job_dict(paths[:1]), tmp_path)
    with pytest.raises(JobConfigError, match=r"params\.tolerance"):
        parse_job(job_dict(paths, params={**PARAMS, "tolerance": -1.0}), tmp_path)
    with pytest.raises(JobConfigError, match=r"params\.initial_models"):
        parse_job(job_dict(paths, params={**PARAMS, "initial_models": 5, "max_models": 4}), tmp_path)
    # the local-training fields are horizontal FL's (one base class), its federated preprocessing is not
    with pytest.raises(JobConfigError, match=r"params\.preprocessing: unknown parameter"):
        parse_job(job_dict(paths, params={**PARAMS, "preprocessing": {"standardize": True}}), tmp_path)
    with pytest.raises(JobConfigError, match=r"params\.momentum"):
        parse_job(job_dict(paths, params={**PARAMS, "momentum": 1.0}), tmp_path)
    as_strategy = job_dict(paths, server=True)
    as_strategy["job"]["algorithm"], as_strategy["params"] = "horizontal", {**PARAMS, "strategy": "multiconfederated"}
    with pytest.raises(JobConfigError, match=r"params\.strategy: multiconfederated is decentralised .* "
                                             r"job\.algorithm: multiconfederated"):
        parse_job(as_strategy, tmp_path)
    cfg = parse_job(job_dict(paths), tmp_path)
    assert cfg.server is None and job_spec("multiconfederated").family == "peer"
    assert partners(cfg, cfg.parties[0], "peer") == ["peer-b"]  # every peer meets every other


def run_in_process(cfg) -> None:
    run_job_threads(cfg, mcj.run)


def pools(out: Path) -> dict:
    res = {}
    for p in PEERS:
        with np.load(out / p / "pool_models.npz", allow_pickle=False) as z:
            res[p] = {k: z[k] for k in z.files}
    return res


@pytest.mark.slow
def test_grpc_tls_peers_reach_the_models_of_an_in_process_run(tmp_path):
    job, path = write_grpc_job(tmp_path, write_data(tmp_path), PARAMS, server=False, **MC_JOB)
    out = run_job(path, timeout_s=240)
    assert "[server]" not in out and all(f"[{p}]" in out for p in PEERS)  # only the peers were started

    job["job"]["output_dir"] = "out-inprocess"
    run_in_process(parse_job(job, tmp_path))
    grpc, local = pools(tmp_path / "out"), pools(tmp_path / "out-inprocess")
    for p in PEERS:
        assert sorted(grpc[p]) == sorted(local[p]), p
        for k in grpc[p]:
            assert grpc[p][k].dtype == np.float32
            np.testing.assert_allclose(grpc[p][k], local[p][k], rtol=0, atol=1e-6, err_msg=f"{p} {k}")
        m_grpc = json.loads((tmp_path / "out" / p / "metrics.json").read_text())
        m_local = json.loads((tmp_path / "out-inprocess" / p / "metrics.json").read_text())
        assert [r["trained"] for r in m_grpc["rounds"]] == [r["trained"] for r in m_local["rounds"]]
        assert m_grpc["final"]["personal"] == m_local["final"]["personal"]
        assert m_grpc["final"]["test_accuracy"] == pytest.approx(m_local["final"]["test_accuracy"], abs=1e-9)
        assert m_grpc["wire"]["total"]["sent"] > 0  # the peers talked directly to each other
        assert set(m_grpc["wire"]["peers"]) == set(PEERS) - {p}
    # each peer's saved bundle (its personal model) scores its local test split as the job reported
    cfg = parse_job(job, tmp_path)
    params = job_params(cfg)
    for spec in cfg.clients:
        X, y = load_client_data(cfg, spec, params)
        test = local_split(len(y), params.test_fraction, params.seed, spec.id).test
        final = json.loads((tmp_path / "out" / spec.id / "metrics.json").read_text())["final"]
        acc = float(np.mean(load_model(tmp_path / "out" / spec.id, ca=tmp_path / "certs" / "ca.pem").predict(X[test]) == y[test]))
        assert acc == pytest.approx(final["test_accuracy"], abs=1e-12) and final["test_n"] == len(test)


RESUME_PARAMS = {**PARAMS, "rounds": 4, "fork_margin": 0.02}
KILL_AFTER = 2  # rounds peer-c completes (and checkpoints) before it is SIGKILLed
DEADLINE = 15


@pytest.mark.slow
def test_a_killed_peer_is_named_and_resume_equals_the_uninterrupted_run(tmp_path):
    """Real peer processes over gRPC + mTLS: peer-c is SIGKILLed after round 2; peer-a and peer-b stop within
    their deadline naming it; ``run --resume`` continues from the last round every peer checkpointed and the
    finished pools equal an uninterrupted run's (in-process, which the test above shows equal to gRPC)."""
    job, path = write_grpc_job(tmp_path, write_data(tmp_path), RESUME_PARAMS, server=False, **MC_JOB,
                               edit=lambda job: job["job"].update(deadline_s=DEADLINE))
    reference = dict(job, job={**job["job"], "output_dir": "out-ref"})
    run_in_process(parse_job(reference, tmp_path))

    killed = kill_after(path, PEERS, "peer-c", f"round {KILL_AFTER}/{RESUME_PARAMS['rounds']}", wait_s=150)
    for p, out in killed.outputs.items():
        # its last line (the job's first failure) names the dead peer, and the log says where: it could
        # not deliver its update to peer-c, timed out waiting for peer-c's, or was told by the other survivor
        assert re.search(r"\bpeer-c\b", killed.last_lines()[p]), out[-2000:]
        assert re.search(r"'mc\.update' \(round [34]\).*'peer-c'|'peer-c'.*'mc\.update'", out), out[-2000:]
    # they stop by themselves: a deadline each (send retries, then the wait for peer-c) plus a round's training,
    # which takes tens of seconds on a loaded 2-core machine; never the job's 240 s timeout
    assert killed.waited_s < 2 * DEADLINE + 90, f"survivors took {killed.waited_s:.0f} s after the kill"
    held = sorted(d.name for d in (tmp_path / "out" / "peer-c" / "checkpoints").iterdir() if d.name.startswith("step-"))
    assert held == [f"step-{s:08d}" for s in (KILL_AFTER - 1, KILL_AFTER)]  # keep=2

    out = run_job(path, "--resume", timeout_s=240)
    steps = resumed_steps(out)
    # every survivor completed round 2 unless the other's abort reached it first
    assert len(steps) == 1 and steps.pop() in (KILL_AFTER - 1, KILL_AFTER), out[-4000:]
    assert out.count("resuming after checkpoint step") == len(PEERS)
    resumed, ref = pools(tmp_path / "out"), pools(tmp_path / "out-ref")
    for p in PEERS:
        assert sorted(resumed[p]) == sorted(ref[p]), p
        for k in ref[p]:
            np.testing.assert_allclose(resumed[p][k], ref[p][k], rtol=0, atol=1e-6, err_msg=f"{p} {k}")
        m_res = json.loads((tmp_path / "out" / p / "metrics.json").read_text())
        m_ref = json.loads((tmp_path / "out-ref" / p / "metrics.json").read_text())
        assert [r["trained"] for r in m_res["rounds"]] == [r["trained"] for r in m_ref["rounds"]]
        assert [r["forked"] for r in m_res["rounds"]] == [r["forked"] for r in m_ref["rounds"]]
        assert m_res["final"]["personal"] == m_ref["final"]["personal"]
        assert m_res["final"]["test_accuracy"] == m_ref["final"]["test_accuracy"]


def test_the_prediction_job_scores_peer_bundles_as_load_model_does(tmp_path):
    """A multiconfederated bundle holds the peer's whole personal model (its registry entry has a
    local_model), so the prediction job accepts it too: each peer scores its own new rows, nothing is
    sent, and the scores equal ``load_model``'s."""
    import pandas as pd
    import yaml

    from secureflhv.runtime.algorithms import predict
    from secureflhv.transport.certs import generate_certificates

    paths = write_data(tmp_path, 2)
    generate_certificates(tmp_path / "certs", PEERS[:2])
    doc = fl_harness.job_dict(paths, {**PARAMS, "rounds": 1}, server=False, tls=True, **MC_JOB)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    run_in_process(parse_job(doc, tmp_path))
    new = {}
    for peer, path in zip(PEERS, paths):
        frame = pd.read_csv(path).iloc[:15]
        frame.insert(0, "id", [f"{peer}-{i}" for i in range(len(frame))])
        new[peer] = tmp_path / f"new-{peer}.csv"
        frame.to_csv(new[peer], index=False, float_format="%.17g")
    pcfg = parse_job(yaml.safe_load(predict.write_predict_job(tmp_path / "job.yaml", tmp_path / "job-predict.yaml",
                                                              data=new).read_text()), tmp_path)
    pparams = job_params(pcfg)
    for party in pcfg.clients:
        assert predict.run(pcfg, party, None, pparams)["rows_scored"] == 15
        scored = pd.read_csv(pcfg.output_dir(party.id) / "predictions.csv")
        X = pd.read_csv(new[party.id]).drop(columns=["id", "y"]).to_numpy()
        model = load_model(tmp_path / "out" / party.id, ca=tmp_path / "certs" / "ca.pem")
        np.testing.assert_allclose(scored[["p0", "p1"]].to_numpy(), model.predict_proba(X), atol=1e-6)  # float32 net
