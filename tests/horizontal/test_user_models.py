"""The user's own model, data and loops in horizontal FL (issue 37): every strategy with a batch-norm model named by
a factory, a dataset factory and a user training loop, through secure aggregation and through plaintext aggregation
of the same quantised updates (bit for bit); the user loop against the built-in one; FedBN against aggregated
statistics; trainable-only layouts; bundles rebuilt through the factory; and the clear errors of preflight and of
the layout agreement."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import byom_code
from fl_harness import job_dict, run_in_process

from secureflhv.horizontal.fl import FLConfig, HorizontalClient, HorizontalServer, LayoutMismatch
from secureflhv.horizontal.strategies import FedAvg
from secureflhv.horizontal.user_model import UserModelSpec, aggregated_names, layout_of
from secureflhv.horizontal.models import build_model
from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.runtime.job.load import parse_job
from secureflhv.runtime.job.preflight import preflight
from secureflhv.secagg import AggregationConfig
from secureflhv.transport import InProcessNetwork

CODE = str(Path(byom_code.__file__).parent)
MODEL = {"factory": "byom_code:bn_net", "kwargs": {"n_classes": 3}, "path": CODE, "n_classes": 3}
LOOPS = {"train": {"factory": "byom_code:train", "path": CODE}, "evaluate": {"factory": "byom_code:evaluate",
                                                                              "path": CODE}}


def _shards(tmp_path: Path, n_clients: int = 3) -> list[Path]:
    """npz shards of (n, 1, 8, 8) images, a different label mix per client."""
    X, y = byom_code.image_blobs(n_rows=90 * n_clients)
    order = np.argsort(y + np.random.default_rng(1).uniform(0, 1.5, len(y)), kind="stable")  # label skew
    paths = []
    for i, rows in enumerate(np.array_split(order, n_clients)):
        p = tmp_path / f"c{i}.npz"
        np.savez(p, X=X[rows], y=y[rows])
        paths.append(p)
    return paths


def _job(tmp_path: Path, *, strategy="fedavg", kind="secagg", model=None, loops=True, **params) -> dict:
    doc = job_dict(_shards(tmp_path), {
        "strategy": strategy, "model": model or MODEL, "rounds": 2, "local_epochs": 1, "batch_size": 16,
        "learning_rate": 0.1, "momentum": 0.5 if strategy != "fednova" else 0.0, "seed": 3, "test_fraction": 0.25,
        "device": "cpu", "aggregation": {"kind": kind, "clip": 4.0, "precision_bits": 16, "seed": 11},
        **(LOOPS if loops else {}), **params}, tls=True)
    for party in doc["parties"][1:]:
        party["data"] = {"factory": "secureflhv.data.torch_datasets:numpy_arrays",
                         "kwargs": {"path": party["data"]["path"]}}
    return doc


def _run(doc: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    run_in_process(parse_job(copy.deepcopy(doc), out))
    return out / "out"


def _metrics(out: Path, party: str) -> dict:
    doc = json.loads((out / party / "metrics.json").read_text())
    for r in doc.get("rounds", []):
        r.pop("seconds", None)
    doc.get("final", {}).pop("seconds", None)
    return doc


STRATEGIES = [("fedavg", {}), ("fedprox", {"mu": 0.1}), ("scaffold", {}), ("fednova", {}), ("ifca", {}),
              ("fedper", {}), ("fedavg", {"contribution_temperature": 1.0})]


@pytest.mark.parametrize("strategy,extra", STRATEGIES, ids=[s + ("+ccn" if e.get("contribution_temperature") else "")
                                                            for s, e in STRATEGIES])
def test_every_strategy_with_a_user_model_and_loop_secagg_equals_plain(tmp_path, strategy, extra):
    """A batch-norm model from a factory, a dataset factory and the user's train / evaluate loops: secure
    aggregation ends where plaintext aggregation of the same quantised updates ends, at the server (global model,
    metrics) and at every client, and the model learned something."""
    doc = _job(tmp_path, strategy=strategy, **extra)
    secure, plain = _run(doc, tmp_path / "secagg"), None
    doc["params"]["aggregation"]["kind"] = "plain_quantised"
    plain = _run(doc, tmp_path / "plain")
    with np.load(secure / "server" / "global_model.npz") as a, np.load(plain / "server" / "global_model.npz") as b:
        assert sorted(a.files) == sorted(b.files) and "bn.running_mean" in a.files
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k
    for party in ("server", "client-1", "client-2", "client-3"):
        ma, mb = _metrics(secure, party), _metrics(plain, party)
        ma.pop("job_digest", None), mb.pop("job_digest", None)
        for r in ma.get("rounds", []) + mb.get("rounds", []):
            r.pop("aggregation", None) if party == "server" else None
        assert ma["rounds"] == mb["rounds"], party
    final = _metrics(secure, "server")["rounds"][-1]
    assert final["test_accuracy"] > 0.5, final  # three separable classes: chance is 1/3


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "scaffold", "fednova"])
def test_a_user_loop_that_mirrors_the_built_in_one_trains_the_same_model(tmp_path, strategy):
    """The user's loop (SGD through ctx.optimizer(), ctx.epochs passes over the loader) sees the batches the
    built-in loop draws, and the wrapper applies FedProx's proximal gradient and SCAFFOLD's correction as the
    built-in loop does: the two global models agree to float32 rounding (FedAvg and FedNova: exactly)."""
    extra = {"mu": 0.1} if strategy == "fedprox" else {}
    doc = _job(tmp_path, strategy=strategy, kind="plain", loops=False, **extra)
    builtin = _run(doc, tmp_path / "builtin")
    doc["params"].update(LOOPS)
    user = _run(doc, tmp_path / "user")
    with np.load(builtin / "server" / "global_model.npz") as a, np.load(user / "server" / "global_model.npz") as b:
        for k in a.files:
            if strategy in ("fedavg", "fednova"):
                assert np.array_equal(a[k], b[k]), k
            else:
                np.testing.assert_allclose(a[k], b[k], rtol=0, atol=2e-6, err_msg=k)


def test_fedbn_keeps_batch_norm_at_each_client_and_off_the_wire(tmp_path):
    """``buffers: local`` (FedBN): the layout has no batch-norm tensor, the clients' final batch-norm statistics
    and affine parameters are their own (they differ), while every shared tensor is the server's; with
    ``buffers: aggregate`` the server's model carries aggregated running statistics."""
    spec = UserModelSpec(**MODEL, buffers="local")
    names = aggregated_names(build_model(spec, seed=0), "local")
    assert not [n for n in names if n.startswith("bn.")] and "conv.weight" in names
    doc = _job(tmp_path, model={**MODEL, "buffers": "local"}, loops=False)
    out = _run(doc, tmp_path / "fedbn")
    from safetensors.numpy import load_file

    states = {c: load_file(str(out / c / "model" / "model.safetensors")) for c in ("client-1", "client-2", "server")}
    assert not np.array_equal(states["client-1"]["bn.running_mean"], states["client-2"]["bn.running_mean"])
    assert not np.array_equal(states["client-1"]["bn.weight"], states["client-2"]["bn.weight"])
    for k in names:
        assert np.array_equal(states["client-1"][k], states["server"][k]), k
    (tmp_path / "agg").mkdir()
    agg = _run(_job(tmp_path / "agg", loops=False), tmp_path / "agg")
    with np.load(agg / "server" / "global_model.npz") as z:
        assert np.abs(z["bn.running_mean"]).max() > 0.01  # initialised at 0: the clients' statistics moved it


def test_trainable_only_aggregates_only_parameters_that_require_grad():
    """A frozen backbone stays out of the layout; only the trainable head is aggregated."""
    model = byom_code.bn_net()
    for p in [model.conv.weight, model.conv.bias, model.fc1.weight, model.fc1.bias]:
        p.requires_grad_(False)
    names = aggregated_names(model, "local", trainable_only=True)
    assert names == ["bn.weight", "bn.bias", "fc2.weight", "fc2.bias"] or names == ["fc2.weight", "fc2.bias"]
    assert aggregated_names(model, "local", trainable_only=True) == ["fc2.weight", "fc2.bias"]


def test_bundle_of_a_user_model_is_rebuilt_through_its_factory(tmp_path):
    """``load_model`` rebuilds the client's model through the factory named in the bundle and scores its local
    test rows as the job did (predictions.csv)."""
    import pandas as pd
    import secureflhv

    doc = _job(tmp_path, loops=False)
    out = _run(doc, tmp_path / "run")
    model = secureflhv.load_model(out / "client-2", ca=tmp_path / "run" / "certs" / "ca.pem")
    pred = pd.read_csv(out / "client-2" / "predictions.csv")
    with np.load(tmp_path / "c1.npz") as z:
        X = z["X"][pred["row"].to_numpy()]
    proba = model.predict_proba(X)
    np.testing.assert_allclose(proba, pred[[f"p{c}" for c in range(3)]].to_numpy(), rtol=0, atol=1e-6)


def _finding(tmp_path, doc, party="client-2"):
    cfg = parse_job(doc, tmp_path)
    from secureflhv.runtime.job.registry import job_params

    return [str(f) for f in preflight(cfg, party, job_params(cfg), insecure=True, check_port=False)]


@pytest.mark.parametrize("model,field,words", [
    ({**MODEL, "factory": "hospital_models.nets:resnet8"}, "params.model.factory", "cannot import 'hospital_models.nets'"),
    ({**MODEL, "factory": "byom_code:raising_net"}, "params.model.factory", "CUDA driver not found"),
    ({**MODEL, "factory": "byom_code:not_a_module"}, "params.model.factory", "not a torch nn.Module"),
    ({**MODEL, "layout_hash": "sha256:" + "0" * 64}, "params.model.layout_hash", "agreed version"),
    ({**MODEL, "kwargs": {"n_classes": 4}}, "params.model.factory", "expected [2, 3]"),
])
def test_preflight_names_the_party_and_the_field(tmp_path, model, field, words):
    """A missing factory module, a factory that raises or returns something else, a layout other than the declared
    hash, and a model whose output does not fit n_classes: each is a preflight finding naming the party and the
    job-file field, before anything is sent."""
    found = _finding(tmp_path, _job(tmp_path, model=model))
    assert any(field in f and "client-2" in f and words in f for f in found), found


def test_preflight_checks_the_dataset_factory_and_the_loops(tmp_path):
    doc = _job(tmp_path, train={"factory": "byom_code:no_such_loop", "path": CODE})
    doc["parties"][2]["data"]["kwargs"]["path"] = str(tmp_path / "missing.npz")
    found = _finding(tmp_path, doc)
    assert any("params.train" in f and "no_such_loop" in f for f in found), found
    assert any("parties[2].data.factory" in f and "missing.npz" in f for f in found), found
    ok = _finding(tmp_path, _job(tmp_path))
    assert ok == [], ok


def test_the_declared_layout_hash_passes_preflight(tmp_path):
    digest = layout_of(build_model(UserModelSpec(**MODEL), seed=3)).digest()
    assert _finding(tmp_path, _job(tmp_path, model={**MODEL, "layout_hash": digest})) == []


def test_a_client_whose_model_differs_is_named_before_round_one():
    """Without a declared hash the parties agree on the layout over the wire (``fl.layout``): the server stops the
    job naming the client whose model differs and the first tensor that does."""
    net = InProcessNetwork("j", ["server", "c0", "c1", "c2"], deadline=20)
    config = FLConfig(rounds=1, seed=0, aggregation=AggregationConfig(kind="plain", min_clients=3,
                                                                      job_clients=("c0", "c1", "c2")),
                      round_timeout_s=20)
    X, y = byom_code.image_blobs(30)
    from secureflhv.horizontal.local_data import DatasetRows
    from torch.utils.data import TensorDataset

    rows = DatasetRows(TensorDataset(torch.from_numpy(X), torch.from_numpy(y)))
    errors = {}

    def client(cid, width):
        spec = UserModelSpec(**{**MODEL, "kwargs": {"n_classes": 3, "width": width}})
        try:
            HorizontalClient(net.transport(cid), "server", rows, y, rows, y, spec, FedAvg(), config).run()
        except Exception as exc:  # noqa: BLE001 - the clients are told to stop
            errors[cid] = exc

    import threading

    threads = [threading.Thread(target=client, args=(c, 6 if c == "c1" else 4)) for c in ("c0", "c1", "c2")]
    for t in threads:
        t.start()
    server = HorizontalServer(net.transport("server"), ["c0", "c1", "c2"], UserModelSpec(**MODEL), FedAvg(), config)
    with pytest.raises(LayoutMismatch, match=r"c1: params.model: .*'conv.weight' is float32 \[4, 1, 3, 3\] at the "
                                             r"server, float32 \[6, 1, 3, 3\] at c1"):
        server.run()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)


def test_device_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    from secureflhv.runtime.algorithms.user_code import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(JobConfigError, match="params.device: cuda"):
        resolve_device("cuda")


def test_fednova_refuses_a_user_optimiser_it_cannot_normalise():
    """FedNova's a_i assumes SGD at the job's momentum: the wrapper refuses Adam (and SGD at another momentum),
    so a user loop cannot make FedNova's normalisation silently wrong."""
    from secureflhv.horizontal.strategies import LocalTrainConfig
    from secureflhv.horizontal.user_loop import StrategyOptimizer

    params = list(byom_code.bn_net().parameters())
    with pytest.raises(ValueError, match="FedNova's a_i assumes torch.optim.SGD"):
        StrategyOptimizer(torch.optim.Adam(params, lr=1e-3), "fednova", LocalTrainConfig(), None, 0.0, None)
    with pytest.raises(ValueError, match="FedNova's a_i assumes torch.optim.SGD"):
        StrategyOptimizer(torch.optim.SGD(params, lr=0.1, momentum=0.5), "fednova", LocalTrainConfig(), None, 0.0,
                          None)
    StrategyOptimizer(torch.optim.SGD(params, lr=0.1), "fednova", LocalTrainConfig(), None, 0.0, None)


def test_a_dataset_factory_is_refused_by_a_vertical_job(tmp_path):
    doc = _job(tmp_path)
    doc["job"]["algorithm"] = "vertical_lr"
    with pytest.raises(JobConfigError, match=r"data.factory \(party .client-1.\): vertical_lr reads tables"):
        parse_job(doc, tmp_path)
