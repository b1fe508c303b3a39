"""Split NN with user-defined torch modules (issue 37): bottom and top models named by a factory
(``host_bottom_factory``, ``guest_bottom_factory``, ``top_factory``; :mod:`snn_user_modules` is the consortium's
code) instead of MLP widths, joined by the same Paillier-protected interactive layer.

* Training equals the independent centralised torch twin (:mod:`snn_twin`, which imports the factories itself
  and follows the documented seeding rule; the parties' initial weights are checked against it bit for bit)
  to 1e-6, and so do the predictions.
* Every failure of a user module is a clear error naming the party and the job-file field, raised before any
  split NN message: declared width mismatch, factory module missing, factory raising, forward pass raising,
  not a module; a missing module stops a job's party before PSI, with nothing sent.
* A job's model bundles (safetensors state_dict, the factory reference in the config, its ``path`` relative
  to the job file) rebuild the modules in a prediction job, which predicts what the job predicted.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from pydantic import ValidationError

from secureflhv.data import load_sklearn
from secureflhv.params import FactoryError
from secureflhv.runtime.algorithms import predict, vertical_nn
from secureflhv.runtime.job.demo import write_vertical_nn_job
from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.runtime.job.load import load_job_params
from secureflhv.runtime.store.model_bundle import read_bundle
from secureflhv.transport import InProcessNetwork
from secureflhv.vertical.split_nn import SplitNNConfig, SplitNNGuest, SplitNNHost
from snn_harness import make_roles, run_roles, toy
from snn_twin import ADAM_TOL, SplitNNTwin, job_twin, roles_state, seeded_twin
from snn_user_modules import ConvBottom

HERE = Path(__file__).resolve().parent
KEY = {"key_bits": 512, "insecure_test_key": True}


def ref(name: str, **kwargs) -> dict:
    return {"factory": f"snn_user_modules:{name}", "kwargs": kwargs}


CASES = {
    "conv-host-bottom_two-layer-top_sgd": dict(
        n_hosts=1, host_bottom_factory=ref("conv_bottom", channels=2), host_bottom_output_width=3,
        guest_bottom=[4, 3], top_factory=ref("two_layer_top", hidden=4, dropout=0.0), optimizer="sgd",
        learning_rate=0.2, epochs=2),
    "layernorm-bottoms_two-hosts_mlp-top_adam": dict(
        n_hosts=2, host_bottom_factory=ref("norm_bottom", hidden=4), host_bottom_output_width=2,
        guest_bottom_factory=ref("norm_bottom"), guest_bottom_output_width=3, top_hidden=[3], optimizer="adam",
        learning_rate=0.02, epochs=1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_user_modules_equal_the_centralised_twin(case):
    spec = dict(CASES[case])
    n_hosts = spec.pop("n_hosts")
    X, y = toy(n=40, d=2 + 5 * n_hosts, seed=3)
    Xg, Xhs = X[:, :2], [X[:, 2 + 5 * i: 7 + 5 * i] for i in range(n_hosts)]
    cfg = SplitNNConfig(**KEY, **spec, interactive_units=3, batch_size=16, interactive_lr=0.2, seed=5, init_seed=2)
    net, guest, hosts = make_roles(Xg, y, Xhs, cfg)
    # the modules are the factories' (float64), not MLPs from the default widths
    if cfg.host_bottom_factory.factory.endswith("conv_bottom"):
        assert isinstance(hosts[0].bottom, ConvBottom) and hosts[0].bottom.conv.weight.dtype == torch.float64
        assert any(isinstance(m, torch.nn.Dropout) for m in guest.top)
    else:
        assert isinstance(guest.bottom[0], torch.nn.LayerNorm) and all(isinstance(h.bottom[0], torch.nn.LayerNorm)
                                                                       for h in hosts)
    assert hosts[0].E.shape == (cfg.host_bottom_output_width, 3)
    twin = seeded_twin(cfg, guest, hosts, Xg, Xhs, y)  # initial weights = the seeding rule's, bit for bit
    results, errors = run_roles(guest, hosts, predict_sets=(Xg, Xhs))
    assert not errors, errors
    ref_losses = twin.fit(Xg, Xhs, y)
    assert len(ref_losses) == 3 * cfg.epochs
    np.testing.assert_allclose(results["guest"].batch_losses, ref_losses, rtol=1e-6, atol=1e-9)
    fed, want = roles_state(guest, hosts), twin.state()
    moved = 0.0
    start = SplitNNTwin(cfg, Xg.shape[1], [h.shape[1] for h in Xhs], y).state()
    for k in want:
        np.testing.assert_allclose(fed[k], want[k], rtol=1e-6, atol=1e-8, err_msg=k)
        moved = max(moved, float(np.max(np.abs(want[k] - start[k]))))
    assert moved > 1e-3  # training moved the weights far beyond the tolerance
    np.testing.assert_allclose(results["proba"], twin.predict(Xg, Xhs), rtol=1e-6, atol=1e-9)


def test_initial_weights_depend_only_on_the_seed():
    X, y = toy(n=20, d=7, seed=1)
    cfg = SplitNNConfig(**KEY, host_bottom_factory=ref("conv_bottom"), host_bottom_output_width=3)
    net = InProcessNetwork("seed", ["guest", "host-1", "host-2"], deadline=5)
    torch.manual_seed(123)  # the global generator's state before the build does not matter
    before = torch.get_rng_state()
    a = SplitNNHost(net.transport("host-1"), "guest", ["host-1"], X[:, 2:], cfg).state_arrays()
    assert torch.equal(torch.get_rng_state(), before)  # and the build leaves it as it was
    torch.rand(7)
    b = SplitNNHost(net.transport("host-1"), "guest", ["host-1"], X[:5, 2:], cfg).state_arrays()
    c = SplitNNHost(net.transport("host-1"), "guest", ["host-1"], X[:, 2:],
                    cfg.model_copy(update={"init_seed": 1})).state_arrays()
    assert a.keys() == b.keys() and "bottom.conv.weight" in a and "bottom.norm.weight" in a
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert not np.array_equal(a["bottom.conv.weight"], c["bottom.conv.weight"])


def _sent(net: InProcessNetwork, pid: str) -> int:
    """Messages ``pid`` has sent on ``net``."""
    return sum(peer.get("messages_sent", 0) for peer in net.wire_stats()[pid].values())


ERRORS = {
    "declared-width-mismatch": (
        "host", dict(host_bottom_factory=ref("fixed_width", width=3), host_bottom_output_width=4),
        r"^host-1: params\.host_bottom_output_width: .*\(4, 3\), not to a floating-point \(4, 4\)"),
    "top-width-mismatch": (
        "guest", dict(top_factory=ref("fixed_width", width=3)),
        r"^guest: params\.top_factory: .*\(4, 3\), not to a floating-point \(4, 1\) as the task's output width "
        r"\(2 classes: 1\)"),
    "missing-module": (
        "guest", dict(guest_bottom_factory={"factory": "no_such_consortium_pkg.nets:bottom"},
                      guest_bottom_output_width=2),
        r"^guest: params\.guest_bottom_factory\.factory: cannot import 'no_such_consortium_pkg\.nets'"),
    "missing-function": (
        "host", dict(host_bottom_factory=ref("no_such_function"), host_bottom_output_width=2),
        r"^host-1: params\.host_bottom_factory\.factory: 'snn_user_modules' has no 'no_such_function'"),
    "factory-raises": (
        "host", dict(host_bottom_factory=ref("broken"), host_bottom_output_width=2),
        r"^host-1: params\.host_bottom_factory\.factory: .*raised RuntimeError: this factory needs a GPU"),
    "forward-raises": (
        "host", dict(host_bottom_factory=ref("wrong_input"), host_bottom_output_width=2),
        r"^host-1: params\.host_bottom_factory\.factory: the module's forward pass on float64 rows of shape \(4, 5\)"),
    "not-a-module": (
        "guest", dict(top_factory=ref("not_a_module")),
        r"^guest: params\.top_factory\.factory: snn_user_modules:not_a_module returned a list, not a torch"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_user_module_errors_name_the_party_and_the_field(case):
    role, fields, message = ERRORS[case]
    X, y = toy(n=20, d=7, seed=2)
    cfg = SplitNNConfig(**KEY, **fields)
    net = InProcessNetwork("errors", ["guest", "host-1"], deadline=5)
    with pytest.raises(FactoryError, match=message) as info:
        if role == "host":
            SplitNNHost(net.transport("host-1"), "guest", ["host-1"], X[:, 2:], cfg)
        else:
            SplitNNGuest(net.transport("guest"), ["host-1"], X[:, :2], y, cfg)
    assert info.value.party == ("guest" if role == "guest" else "host-1")
    assert _sent(net, info.value.party) == 0  # found before any message


def test_declared_widths_are_required_with_a_factory_and_only_then():
    with pytest.raises(ValidationError, match="host_bottom_output_width: required with host_bottom_factory"):
        SplitNNConfig(**KEY, host_bottom_factory=ref("conv_bottom"))
    with pytest.raises(ValidationError, match="guest_bottom_output_width: applies to guest_bottom_factory only"):
        SplitNNConfig(**KEY, guest_bottom_output_width=3)
    with pytest.raises(ValidationError, match="factory"):
        SplitNNConfig(**KEY, top_factory={"factory": "not a reference"})
    # parties agree on the factory and its kwargs; its folder is each machine's own
    here, there = (SplitNNConfig(**KEY, host_bottom_factory={**ref("conv_bottom", channels=2), "path": p},
                                 host_bottom_output_width=3) for p in ("code", "/opt/consortium"))
    assert here.protocol_fields() == there.protocol_fields()
    assert here.protocol_fields()["host_bottom_factory"] == ref("conv_bottom", channels=2)
    other = SplitNNConfig(**KEY, host_bottom_factory=ref("conv_bottom", channels=3), host_bottom_output_width=3)
    assert other.protocol_fields() != here.protocol_fields()
    assert here.resolved(Path("/jobs/a")).host_bottom_factory.path == Path("/jobs/a/code")


def test_a_missing_factory_module_is_a_preflight_finding_and_stops_the_party_before_psi(tmp_path):
    params = {"epochs": 1, "key_bits": 512, "host_bottom_factory": {"factory": "no_such_consortium_pkg:bottom"},
              "host_bottom_output_width": 3}
    job = write_vertical_nn_job(tmp_path, None, None, params, dataset=load_sklearn("breast_cancer"), n_hosts=1,
                                tls=False, insecure_test_keys=True)
    cfg, job_params = load_job_params(job)
    # preflight's hook (secureflhv party / run): a finding at the host, none at the guest (it builds no factory)
    (field, message), = job_params.party_checks(cfg, cfg.party("host-1"))
    assert field == "params.host_bottom_factory.factory" and "cannot import 'no_such_consortium_pkg'" in message
    assert job_params.party_checks(cfg, cfg.guest) == []
    net = InProcessNetwork(cfg.job.id, [p.id for p in cfg.parties], deadline=30)
    t0 = time.perf_counter()
    with pytest.raises(JobConfigError, match=r"^host-1: params\.host_bottom_factory\.factory: cannot import "
                                             r"'no_such_consortium_pkg'"):
        vertical_nn.run(cfg, cfg.party("host-1"), net.transport("host-1"), job_params)
    assert time.perf_counter() - t0 < 5  # no wait for the guest: nothing was exchanged
    assert _sent(net, "host-1") == 0, net.wire_stats()["host-1"]


def _run_in_process(job: Path, run) -> None:
    """``run(cfg, party, transport, params)`` of every party of ``job`` in threads over one in-process network."""
    cfg, params = load_job_params(job)
    net = InProcessNetwork(cfg.job.id, [p.id for p in cfg.parties], deadline=60)
    errors = {}

    def work(party):
        try:
            run(cfg, party, net.transport(party.id), params)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors[party.id] = exc

    threads = [threading.Thread(target=work, args=(p,), daemon=True) for p in cfg.parties]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a party hung"
    assert not errors, errors


USER_PARAMS = {"epochs": 1, "batch_size": 128, "key_bits": 512, "interactive_units": 3, "guest_bottom": [6],
               "host_bottom_output_width": 3, "learning_rate": 0.05, "optimizer": "sgd", "test_fraction": 0.25,
               "split_seed": 3, "seed": 1}


def breast_cancer(n: int):
    """The first ``n`` rows of scikit-learn's breast cancer set (a short job)."""
    ds = load_sklearn("breast_cancer")
    return dataclasses.replace(ds, X=ds.X[:n], y=ds.y[:n], ids=None if ds.ids is None else ds.ids[:n])


def test_bundle_of_a_user_module_model_predicts_what_the_job_predicted(tmp_path):
    # the consortium's code in a folder named relative to the job file (not installed, not on sys.path)
    (tmp_path / "code").mkdir()
    shutil.copy(HERE / "snn_user_modules.py", tmp_path / "code" / "consortium_nets_37.py")
    code = {"path": "../code"}
    params = {**USER_PARAMS, "host_bottom_factory": {"factory": "consortium_nets_37:conv_bottom",
                                                     "kwargs": {"channels": 2}, **code},
              "top_factory": {"factory": "consortium_nets_37:two_layer_top", "kwargs": {"hidden": 4}, **code}}
    job = write_vertical_nn_job(tmp_path / "train", None, None, params, dataset=breast_cancer(240),
                                n_hosts=1, tls=True, insecure_test_keys=True)
    _run_in_process(job, vertical_nn.run)
    out, ca = job.parent / "out", job.parent / "certs" / "ca.pem"
    host_bundle = read_bundle(out / "host-1", ca=ca, expect_party="host-1")
    factory = host_bundle.config["host_bottom_factory"]
    assert factory["factory"] == "consortium_nets_37:conv_bottom" and factory["kwargs"] == {"channels": 2}
    assert Path(factory["path"]) == (tmp_path / "code").resolve()  # absolute: found from any prediction job
    assert {"bottom.conv.weight", "bottom.norm.weight", "interactive.E"} <= set(host_bundle.file("state.safetensors"))
    guest_bundle = read_bundle(out / "guest", ca=ca, expect_party="guest")
    assert "top.3.weight" in guest_bundle.file("state.safetensors")  # two_layer_top's last Linear

    cfg, _ = load_job_params(job)
    pjob = predict.write_predict_job(job, tmp_path / "elsewhere" / "deeper" / "job.yaml",
                                     data={p.id: cfg.resolve(p.data.path) for p in cfg.clients})
    _run_in_process(pjob, predict.run)
    in_job = pd.read_csv(out / "guest" / "predictions.csv", dtype={"id": str}).set_index("id")
    scored = pd.read_csv(pjob.parent / "predictions" / "guest" / "predictions.csv", dtype={"id": str}).set_index("id")
    assert len(in_job) > 40
    np.testing.assert_allclose(scored.loc[in_job.index, "score"].to_numpy(), in_job["probability"].to_numpy(),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_user_module_job_over_grpc_tls_equals_the_twin(tmp_path):
    """``secureflhv run`` (guest and host processes, mutual TLS) with a user bottom and top: the model and the
    held-out predictions equal the twin trained on the joined table."""
    code = {"path": str(HERE)}
    params = {**USER_PARAMS, "optimizer": "adam", "learning_rate": 0.02,
              "host_bottom_factory": {"factory": "snn_user_modules:norm_bottom", "kwargs": {"hidden": 4}, **code},
              "top_factory": {"factory": "snn_user_modules:two_layer_top", **code}}
    job = write_vertical_nn_job(tmp_path, None, None, params, dataset=load_sklearn("breast_cancer"), n_hosts=1,
                                scheme="random", seed=2, deadline_s=120, insecure_test_keys=True)
    env = {**os.environ, "PYTHONPATH": ""}  # the factories come from params' path, nothing else
    proc = subprocess.run([sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", "240"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    twin, held_out, host_ids = job_twin(job, params, SplitNNConfig)
    out, ca = job.parent / "out", job.parent / "certs" / "ca.pem"
    from snn_twin import federated_state

    bundles = {p: read_bundle(out / p, ca=ca, expect_party=p).file("state.safetensors") for p in ["guest", *host_ids]}
    fed, want = federated_state(bundles["guest"], [bundles[h] for h in host_ids], host_ids), twin.state()
    assert fed.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(fed[k], want[k], rtol=1e-6, atol=ADAM_TOL, err_msg=k)
    pred = pd.read_csv(out / "guest" / "predictions.csv", dtype={"id": str}).set_index("id")
    np.testing.assert_allclose(pred.set_index(pred.index.astype(str)).loc[held_out["ids"], "probability"].to_numpy(),
                               twin.predict(held_out["Xg"], held_out["Xhs"]), rtol=1e-6, atol=1e-9)
