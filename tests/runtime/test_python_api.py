"""The Python API (issue 37): ``secureflhv.Job`` validates as it is built (pydantic's error names the field),
``secureflhv.simulate`` runs every party in one process over the real protocol (secure aggregation with
certificate identities) and returns a result whose history, model and plot work, the same job written by
``job.write`` and run as ``secureflhv run`` processes over gRPC + mutual TLS ends with the same model bit for
bit, and a party that raises gives one error naming it, promptly."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from pydantic import ValidationError

import secureflhv
from secureflhv.runtime.algorithms import horizontal_fl
from secureflhv.runtime.api import job_builder, simulation
from secureflhv.runtime.job.load import JobConfigError, load_job_params
from secureflhv.runtime.job.preflight import preflight
from secureflhv.secagg import bonawitz_client, bonawitz_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "horizontal"))
from fl_harness import _without_timing, partitioned_blobs  # noqa: E402 - tests/horizontal (it adds tests/)
from resume_harness import run_job  # noqa: E402

CLIENTS = ["hospital-a", "hospital-b", "hospital-c"]
MODEL = {"name": "mlp", "n_features": 6, "n_classes": 4, "hidden": [12, 8]}
PARAMS = {"model": MODEL, "rounds": 2, "local_epochs": 1, "batch_size": 16, "learning_rate": 0.1, "momentum": 0.5,
          "seed": 5, "test_fraction": 0.25,
          "aggregation": {"kind": "secagg", "clip": 1.0, "stage_timeout_s": 20, "seed": 11}}


def blobs_job(tmp_path: Path, **kw) -> secureflhv.Job:
    """3 clients holding label-skewed npz shards of Gaussian blobs, a tiny MLP, 2 rounds of secure aggregation."""
    paths = partitioned_blobs(tmp_path / "data", "label_dirichlet", {"beta": 1.0}, n_clients=3)
    args = dict(params=PARAMS, job_id="api-blobs", output_dir="sim", base_dir=tmp_path)
    args.update(kw)
    return secureflhv.Job.horizontal(clients=dict(zip(CLIENTS, [f"data/{p.name}" for p in paths])),
                                     **args)


@pytest.fixture
def authenticated(monkeypatch):
    """Secure aggregation must run its actively secure variant: no party may lack a certificate identity."""
    def unauthenticated(party):
        raise AssertionError(f"{party}: secure aggregation ran without a certificate identity")

    monkeypatch.setattr(bonawitz_client, "warn_unauthenticated", unauthenticated)
    monkeypatch.setattr(bonawitz_server, "warn_unauthenticated", unauthenticated)


# ----------------------------------------------------------------------------------------- building
def test_a_bad_value_raises_pydantic_error_naming_the_field(tmp_path):
    with pytest.raises(ValidationError, match=r"params\.learning_rate\n.*greater than 0"):
        blobs_job(tmp_path, params={**PARAMS, "learning_rate": -0.1})
    with pytest.raises(ValidationError, match=r"params\.aggregation\.kind"):
        blobs_job(tmp_path, params={**PARAMS, "aggregation": {"kind": "secret-sauce"}})
    with pytest.raises(ValidationError, match=r"params\.learnig_rate\n.*Extra inputs are not permitted"):
        blobs_job(tmp_path, params={**PARAMS, "learnig_rate": 0.1})
    with pytest.raises(ValidationError, match=r"job\.id"):
        blobs_job(tmp_path, job_id="no spaces please")
    with pytest.raises(ValidationError, match=r"parties\.0\.address"):
        blobs_job(tmp_path, addresses={"server": "nowhere"})
    with pytest.raises(JobConfigError, match=r"parties: a horizontal job needs at least two clients"):
        secureflhv.Job.horizontal(clients={"hospital-a": "a.npz"}, params=PARAMS)


def test_built_job_is_what_the_job_file_loader_parses(tmp_path):
    job = blobs_job(tmp_path)
    assert type(job.params) is horizontal_fl.HorizontalJobParams and job.params.aggregation.kind == "secagg"
    assert [p.id for p in job.config.clients] == CLIENTS and job.config.server.id == "server"
    assert job.config.guest.id == "hospital-a" and job.output_dir == (tmp_path / "sim").resolve()
    # from_dict / from_yaml of the same document, and a params model instead of a dict
    again = secureflhv.Job.from_dict(job.to_dict(), base_dir=tmp_path)
    assert again.params == job.params and again.config == job.config
    typed = blobs_job(tmp_path, params=job.params)
    assert typed.params == job.params
    path = job.write(tmp_path / "deploy", certificates=False)
    assert secureflhv.Job.from_yaml(path).params == job.params
    assert job.replace(output_dir="elsewhere").output_dir == (tmp_path / "elsewhere").resolve()


def test_write_gives_a_job_file_secureflhv_run_loads_with_certificates(tmp_path):
    job = blobs_job(tmp_path)
    path = job.write(tmp_path / "deploy" / "here")
    doc = yaml.safe_load(path.read_text())
    assert doc["security"] == {"ca": "certs/ca.pem"}
    assert doc["parties"][1]["data"]["path"] == "../../data/party_00.npz"  # relative to job.yaml
    assert doc["parties"][1]["cert"] == "certs/hospital-a.pem"
    cfg, params = load_job_params(path)  # what `secureflhv run` / `party` load
    assert params == job.params and cfg.job.output_dir == Path("sim")
    for party in cfg.parties:  # certificates, key, data and output folder all check out (as `validate --party`)
        assert preflight(cfg, party.id, params, check_port=False) == []
    with pytest.raises(FileExistsError):
        job.write(tmp_path / "deploy" / "here")


def test_data_mappings_pass_through_and_factory_paths_follow_the_job_file(tmp_path):
    factory = {"factory": "mypkg.data:hospital", "kwargs": {"root": "raw", "split": "train"}}
    assert job_builder._data_section(factory, "y") == factory and job_builder._data_section("a.npz", "y") == \
        {"path": "a.npz", "label_column": "y"}
    doc = {"security": {"ca": "certs/ca.pem"},
           "parties": [{"id": "a", "data": {"path": "data/a.csv"}, "cert": "/abs/a.pem", "key": "k/a.key"},
                       {"id": "b", "data": factory}],
           "params": {"model": {"factory": "mypkg.nets:resnet", "path": "code", "weights": "init.safetensors"}}}
    out = job_builder._rebased(doc, tmp_path, tmp_path / "deploy")
    assert out["security"]["ca"] == "../certs/ca.pem" and out["parties"][0]["data"]["path"] == "../data/a.csv"
    assert out["parties"][0]["cert"] == "/abs/a.pem" and out["parties"][0]["key"] == "../k/a.key"
    assert out["params"]["model"]["path"] == "../code" and out["params"]["model"]["weights"] == "../init.safetensors"
    assert out["parties"][1]["data"]["kwargs"] == {"root": "../raw", "split": "train"}


def test_dataset_factories_simulate_and_deploy_like_files(tmp_path):
    """Clients whose data is a dataset factory (``parties[i].data.factory``) train the model the same files give."""
    files = blobs_job(tmp_path)
    factory = "secureflhv.data.torch_datasets:numpy_arrays"
    clients = {p.id: {"factory": factory, "kwargs": {"path": str(p.data.path)}} for p in files.config.clients}
    job = secureflhv.Job.horizontal(clients=clients, params=PARAMS, job_id="api-blobs", output_dir="factories",
                                    base_dir=tmp_path)
    assert job.to_dict()["parties"][1]["data"] == clients["hospital-a"]  # passed through untouched
    a = secureflhv.simulate(job, progress=False).model.state_dict()
    b = secureflhv.simulate(files, progress=False).model.state_dict()
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in b)
    cfg, params = load_job_params(job.write(tmp_path / "deploy"))
    assert cfg.parties[1].data.kwargs == {"path": "../data/party_00.npz"}
    assert all(preflight(cfg, p.id, params, check_port=False) == [] for p in cfg.parties)


# --------------------------------------------------------------------------------------- simulation
def test_simulate_horizontal_secure_aggregation(tmp_path, authenticated, capsys):
    job = blobs_job(tmp_path)
    result = secureflhv.simulate(job, progress=True)
    assert "@progress" not in capsys.readouterr().out  # the events fed the bar, not raw lines
    assert [r["round"] for r in result.history] == [1, 2]
    assert all(r["survivors"] == CLIENTS and not r["refused"] for r in result.history)
    assert result.history[-1]["aggregation"]["model"]["survivors"] == 3  # the secagg sum of all three
    assert 0.3 < result.history[-1]["test_accuracy"] <= 1.0 and result.metrics["round"] == 2
    assert sorted(result.client_metrics) == CLIENTS and all(len(v) == 2 for v in result.client_metrics.values())
    assert result.output_dir == (tmp_path / "sim").resolve()
    # the model: the torch module rebuilt from the server's signed bundle = the global model the server saved
    model = result.model
    assert isinstance(model, torch.nn.Module) and not model.training
    with np.load(tmp_path / "sim" / "server" / "global_model.npz") as saved:
        state = model.state_dict()
        assert sorted(saved.files) == sorted(state)
        assert all(np.array_equal(saved[k], state[k].numpy()) for k in saved.files)
    X = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    with torch.no_grad():
        probs = torch.softmax(model(torch.from_numpy(X)), 1).numpy()
    np.testing.assert_allclose(result.load_model().predict_proba(X), probs, rtol=1e-6)
    fig = result.plot(tmp_path / "acc.png")
    assert (tmp_path / "acc.png").stat().st_size > 1000
    assert list(fig.axes[0].lines[0].get_ydata()) == [r["test_accuracy"] for r in result.history]
    text = repr(result)
    assert "api-blobs" in text and "2 rounds" in text and "test_accuracy" in text


def test_simulate_a_vertical_job(tmp_path):
    rows = range(12)
    (tmp_path / "guest.csv").write_text("id,label,f1,f2\n" + "".join(f"u{i},{i % 2},{i * .5},{10 - i}\n" for i in rows))
    (tmp_path / "host.csv").write_text("id,h1,h2\n" + "".join(f"u{i},{i * 2},{i + .25}\n" for i in rows))
    job = secureflhv.Job.vertical(("guest", {"path": "guest.csv", "label_column": "label"}), {"host-1": "host.csv"},
                                  {"mode": "arbiter", "epochs": 2, "key_bits": 1024}, server="server",
                                  insecure_test_keys=True, job_id="api-vlr", base_dir=tmp_path)
    result = secureflhv.simulate(job, progress=False)
    assert [r["epoch"] for r in result.history] == [1, 2] and result.history[1]["loss"] < result.history[0]["loss"]
    assert result.model.bundle.party_id == "guest" and result.metrics["test"]["n"] > 0
    assert result.plot().axes[0].get_ylabel() == "loss"


@pytest.mark.slow
def test_simulation_equals_the_written_job_run_as_processes(tmp_path, authenticated):
    job = blobs_job(tmp_path)
    sim = secureflhv.simulate(job, progress=False)
    path = job.write(tmp_path / "deploy")  # its parties write under deploy/sim
    out = run_job(path, timeout_s=240)
    assert "(secagg): 3 survivors" in out and "round 2/2" in out
    deployed = tmp_path / "deploy" / "sim"
    for name in ("global_model.npz",):
        with np.load(sim.output_dir / "server" / name) as a, np.load(deployed / "server" / name) as b:
            assert sorted(a.files) == sorted(b.files)
            assert all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a.files), name
    state = sim.model.state_dict()
    with np.load(deployed / "server" / "global_model.npz") as b:
        assert all(np.array_equal(state[k].numpy(), b[k]) for k in b.files)
    for party in ["server", *CLIENTS]:  # every round record and client metric, seconds and byte counts aside
        a, b = (json.loads((o / party / "metrics.json").read_text()) for o in (sim.output_dir, deployed))
        assert _without_timing(a["rounds"]) == _without_timing(b["rounds"]), party
        assert _without_timing(a["final"]) == _without_timing(b["final"]), party


# ----------------------------------------------------------------------------------------- failures
def test_a_party_raising_gives_one_error_naming_it(tmp_path, monkeypatch):
    def broken_server(*_a, **_kw):
        raise RuntimeError("disk full at the aggregator")

    monkeypatch.setattr(horizontal_fl, "_run_server", broken_server)
    started = time.monotonic()
    with pytest.raises(simulation.SimulationError) as err:
        secureflhv.simulate(blobs_job(tmp_path), progress=False)
    assert time.monotonic() - started < simulation.GRACE_S  # the clients were told, not left to their deadline
    e = err.value
    assert str(e).startswith("job 'api-blobs' failed: server failed: disk full at the aggregator")
    assert e.party == "server" and isinstance(e.__cause__, RuntimeError) and e.result is None
    assert {f.party for f in e.failures.values()} == {"server"}, e.failures  # every client names the server


def test_a_client_raising_is_named_with_its_own_reason(tmp_path, monkeypatch):
    load = horizontal_fl.load_client_data

    def flaky(cfg, party, params):
        if party.id == "hospital-b":
            raise OSError("hospital-b's database is down")
        return load(cfg, party, params)

    monkeypatch.setattr(horizontal_fl, "load_client_data", flaky)
    started = time.monotonic()
    with pytest.raises(simulation.SimulationError, match=r"hospital-b failed: hospital-b's database is down") as err:
        secureflhv.simulate(blobs_job(tmp_path, deadline_s=3), progress=False)
    assert time.monotonic() - started < 3 + simulation.GRACE_S  # within the deadline, never a hang
    assert err.value.party == "hospital-b" and isinstance(err.value.__cause__, OSError)


def test_a_dropped_client_fails_the_simulation_but_keeps_the_result(tmp_path, monkeypatch):
    final_metrics = horizontal_fl._final_metrics

    def flaky(cfg, party, *a):
        if party.id == "hospital-c":
            raise RuntimeError("hospital-c ran out of disk writing its predictions")
        return final_metrics(cfg, party, *a)

    monkeypatch.setattr(horizontal_fl, "_final_metrics", flaky)  # after training: the others all finish
    with pytest.raises(simulation.SimulationError, match=r"finished without hospital-c: hospital-c failed: "
                                                         r"hospital-c ran out of disk") as err:
        secureflhv.simulate(blobs_job(tmp_path), progress=False)
    result = err.value.result
    assert err.value.party == "hospital-c" and [r["round"] for r in result.history] == [1, 2]
    assert result.client_metrics["hospital-c"] == {} and len(result.client_metrics["hospital-a"]) == 2


def test_timeout_stops_every_party(tmp_path):
    started = time.monotonic()
    with pytest.raises(simulation.SimulationError, match=r"did not finish within 1s \(timeout_s\)") as err:
        secureflhv.simulate(blobs_job(tmp_path, params={**PARAMS, "rounds": 500}), progress=False, timeout_s=1)
    assert err.value.party is None and time.monotonic() - started < 15
