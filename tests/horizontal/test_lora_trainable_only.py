"""Trainable-only aggregation of a tiny ``transformers`` BERT with PEFT LoRA adapters (issue 37).

The consortium's code (:mod:`lora_code`: plain torch / transformers / peft) builds a BERT sequence classifier from a
config, adds LoRA adapters on query and value and trains the classification head in full (``modules_to_save``);
the job sets ``params.model.trainable_only: true``. Checked here:

1. the layout holds exactly the adapters and the saved head, none of the frozen backbone (a small fraction of the
   model), and the factory builds the same backbone from the same torch seed;
2. over real party processes (gRPC + mutual TLS, secure aggregation, 2 rounds), the bytes each transport counted
   (``metrics.json["wire"]``, and the per-message trace ``SECUREFLHV_WIRE_TRACE``) show only adapter-sized
   tensors on the wire: each ``fl.round`` / ``fl.eval`` global model and each client's ``agg.masked`` input;
   the same job with ``trainable_only: false`` (in one process, the same byte accounting) sends the whole model;
3. after training the adapters and the head moved while every frozen tensor at every party and in every bundle is
   the initial backbone bit for bit, and ``secureflhv.load_model`` scores int64 token ids as the job did.

The expected sizes come from the model itself (plain torch), not from the library's layout helpers.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import lora_code
from fl_harness import job_dict, run_job_threads, write_grpc_job

from secureflhv.horizontal.models import build_model
from secureflhv.horizontal.user_model import UserModelSpec, aggregated_names, layout_of
from secureflhv.runtime.job.load import parse_job

CODE = str(Path(lora_code.__file__).parent)
SEED, ROUNDS, N_ROWS = 3, 2, 96
MODEL = {"factory": "lora_code:lora_bert", "kwargs": {"n_labels": 2}, "path": CODE, "n_classes": 2,
         "trainable_only": True}
PARAMS = {"strategy": "fedavg", "model": MODEL, "rounds": ROUNDS, "local_epochs": 2, "batch_size": 16,
          "learning_rate": 1.0, "momentum": 0.5, "seed": SEED, "test_fraction": 0.25, "device": "cpu",
          "aggregation": {"kind": "secagg", "clip": 4.0, "precision_bits": 16, "seed": 11, "stage_timeout_s": 20},
          "train": {"factory": "byom_code:train", "path": CODE}, "evaluate": {"factory": "byom_code:evaluate",
                                                                              "path": CODE}}
CLIENTS = ["client-1", "client-2", "client-3"]
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")  # transformers via peft


def _initial_model(**kwargs) -> torch.nn.Module:
    """The factory seeded as every party seeds it (torch.manual_seed(params.seed))."""
    torch.manual_seed(SEED)
    return lora_code.lora_bert(**{"n_labels": 2, **kwargs})


def _is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name or ".modules_to_save." in name


def _sizes() -> tuple[int, int, list[str]]:
    """(adapter + head scalars, scalars of the whole model, the adapter names): from plain torch."""
    model = _initial_model()
    state = model.state_dict()
    adapters = [n for n in state if _is_adapter(n)]
    return sum(state[n].numel() for n in adapters), sum(t.numel() for t in state.values()), adapters


def _use_data_factory(job: dict) -> None:
    for i, party in enumerate(job["parties"][1:]):
        party["data"] = {"factory": "lora_code:token_rows", "kwargs": {"n_rows": N_ROWS, "client": i}}


# ------------------------------------------------------------------ 1. the layout
def test_the_layout_holds_the_adapters_and_the_head_only():
    n_adapter, n_full, adapters = _sizes()
    spec = UserModelSpec(**MODEL)
    model = build_model(spec, seed=SEED)
    names = aggregated_names(model, trainable_only=True)
    assert names == adapters and len(names) == 2 * 2 * 2 + 2  # 2 layers x (query, value) x (A, B) + head w, b
    assert not [n for n in names if "base_layer" in n or "original_module" in n or "embeddings" in n]
    layout = layout_of(model)
    assert [e[0] for e in layout.entries] == names and layout.size == n_adapter == 1090
    assert all(dtype == "float32" for _, _, dtype in layout.entries)
    assert n_adapter / n_full < 0.05, (n_adapter, n_full)  # 1,090 of 22,980 scalars
    everything = aggregated_names(model)
    assert len(everything) == len(model.state_dict()) and layout_of(build_model(
        UserModelSpec(**{**MODEL, "trainable_only": False}), seed=SEED)).size == n_full
    no_head = aggregated_names(lora_code.lora_bert(save_head=False), trainable_only=True)
    assert no_head == [n for n in names if "lora_" in n]  # without modules_to_save the head stays frozen


def test_the_factory_builds_the_same_backbone_from_the_same_seed():
    """Every party seeds torch before the factory: the same seed gives the same frozen backbone bit for bit,
    another seed another one (so agreeing on the seed is what makes the backbones agree)."""
    a, b = _initial_model().state_dict(), _initial_model().state_dict()
    torch.manual_seed(SEED + 1)
    c = lora_code.lora_bert().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    key = "peft.base_model.model.bert.encoder.layer.0.attention.self.query.base_layer.weight"
    assert not torch.equal(a[key], c[key])


def test_the_model_scores_int64_token_ids_and_the_label_rule_holds():
    x, y = lora_code.token_arrays(8, client=0)
    assert x.dtype == np.int64 and x.shape == (8, lora_code.SEQ) and set(y) <= {0, 1}
    assert all((lora_code.MARK in row) == bool(label) for row, label in zip(x, y))
    out = _initial_model()(torch.from_numpy(x))
    assert out.shape == (8, 2) and out.dtype == torch.float32
    ds = lora_code.token_rows(10, client=1)
    assert len(ds) == 10 and ds[0][0].dtype == torch.int64
    assert np.array_equal(ds.targets, [ds[i][1] for i in range(10)])
    assert not np.array_equal(lora_code.token_arrays(8, 0)[0], lora_code.token_arrays(8, 1)[0])


# ------------------------------------------------------------------ 2. bytes on the wire (processes)
@pytest.fixture(scope="module")
def process_run(tmp_path_factory):
    """The job as a server and 3 clients, ``secureflhv run`` processes over gRPC + mutual TLS with secure
    aggregation; each party traces the messages it sent. Returns (tmp folder, job document, launcher output)."""
    from resume_harness import run_job

    tmp = tmp_path_factory.mktemp("lora-processes")
    with pytest.MonkeyPatch.context() as mp:  # the parties import lora_code (the dataset factory) from tests/horizontal
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [CODE, os.environ.get("PYTHONPATH")])))
        mp.setenv("SECUREFLHV_WIRE_TRACE", str(tmp / "trace"))
        job, path = write_grpc_job(tmp, ["unused"] * 3, copy.deepcopy(PARAMS), edit=_use_data_factory)
        out = run_job(path, timeout_s=180)
    return tmp, job, out


def _trace(tmp: Path, party: str) -> list[dict]:
    return [json.loads(line) for line in (tmp / "trace" / f"{party}.jsonl").read_text().splitlines()]


def _wire(tmp: Path, party: str) -> dict:
    return json.loads((tmp / "out" / party / "metrics.json").read_text())["wire"]["peers"]


@pytest.mark.slow
def test_only_adapter_tensors_reach_the_wire_and_the_backbone_stays_frozen(process_run):
    """Each global model the server sends a client (``fl.round`` to train, ``fl.eval`` to evaluate, once per round)
    weighs the adapters' float32 bytes plus their names, far below the model's float32 size; each client's masked
    input (``agg.masked``: one uint64 word per aggregated value) is sized by the adapters too; over the whole job no
    client sent, and the server sent no client, as much as one float32 copy of the model. Then the bundles
    (:func:`_adapters_moved_the_backbone_did_not_and_the_bundle_scores_token_ids`)."""
    tmp, job, out = process_run
    assert "aggregation secagg" in out and "(secagg): 3 survivors" in out and f"round {ROUNDS}/{ROUNDS}" in out
    n_adapter, n_full, adapters = _sizes()
    adapter_f32, full_f32 = 4 * n_adapter, 4 * n_full  # 4,360 and 91,920 bytes
    server_sent = _trace(tmp, "server")
    for client in CLIENTS:
        for tag in ("fl.round", "fl.eval"):
            sizes = {m["round"]: m["bytes"] for m in server_sent if m["to"] == client and m["tag"] == tag}
            models = {r: b for r, b in sizes.items() if r <= ROUNDS}
            assert sorted(models) == list(range(1, ROUNDS + 1)), (client, tag, sizes)
            for r, b in models.items():  # float32 values + ~100 bytes of name and shape per tensor
                assert adapter_f32 <= b < adapter_f32 + 150 * len(adapters) < 3 * adapter_f32, (client, tag, r, b)
                assert b < full_f32 / 10, (client, tag, r, b)
            if tag == "fl.round":
                assert sizes.keys() == {*models, ROUNDS + 1} and sizes[ROUNDS + 1] < 100  # 'stop': no model
            peer = _wire(tmp, "server")[client]["by_tag"][tag]  # the transport's counter agrees with the trace
            assert peer["sent"] == sum(sizes.values()) and peer["messages_sent"] == len(sizes)
            assert _wire(tmp, client)["server"]["by_tag"][tag]["received"] == peer["sent"]
        masked = [m["bytes"] for m in _trace(tmp, client) if m["tag"] == "agg.masked"]
        assert len(masked) == ROUNDS and all(8 * n_adapter <= b < 8 * n_adapter + 64 for b in masked), masked
        assert _wire(tmp, client)["server"]["by_tag"]["agg.masked"]["sent"] == sum(masked)
        assert sum(p["sent"] for p in _wire(tmp, client).values()) < full_f32  # the whole job, every tag
        assert _wire(tmp, "server")[client]["sent"] < full_f32
    # one process run for both checks (a module fixture would run once per xdist worker)
    _adapters_moved_the_backbone_did_not_and_the_bundle_scores_token_ids(process_run)


def test_without_trainable_only_the_whole_model_travels(tmp_path):
    """Contrast (one round, in one process, the same byte accounting as gRPC): with ``trainable_only: false`` the
    global model and the masked inputs carry every tensor of the model, frozen or not."""
    from secureflhv.runtime.algorithms import horizontal_fl as hj
    from secureflhv.transport.certs import generate_certificates

    _, n_full, _ = _sizes()
    doc = job_dict(["unused"] * 3, {**copy.deepcopy(PARAMS), "rounds": 1,
                                    "model": {**MODEL, "trainable_only": False}}, tls=True)
    _use_data_factory(doc)
    cfg = parse_job(doc, tmp_path)
    generate_certificates(tmp_path / "certs", [p.id for p in cfg.parties])
    nets = []

    def transport(net, spec):
        nets.append(net)
        return net.transport(spec.id)

    run_job_threads(cfg, hj.run, transport=transport)
    server = nets[0].wire_stats()["server"]
    for client in CLIENTS:
        tags = server[client]["by_tag"]
        assert tags["fl.eval"]["sent"] >= 4 * n_full and tags["fl.round"]["sent"] >= 4 * n_full
        assert tags["agg.masked"]["received"] >= 8 * n_full  # 183,840 bytes vs 8,720 with trainable_only


# ------------------------------------------------------------------ 3. what training changed, and the bundles
def _adapters_moved_the_backbone_did_not_and_the_bundle_scores_token_ids(process_run):
    """After the process run: every party's bundle holds the global adapters and the initial backbone exactly; the
    adapters moved; load_model scores int64 token ids as predictions.csv and a plain-torch twin do."""
    import pandas as pd
    import secureflhv
    from safetensors.numpy import load_file

    tmp, job, _ = process_run
    initial = {k: v.numpy() for k, v in _initial_model().state_dict().items()}
    _, _, adapters = _sizes()
    states = {p: load_file(str(tmp / "out" / p / "model" / "model.safetensors")) for p in ["server", *CLIENTS]}
    for party, state in states.items():
        assert state.keys() == initial.keys(), party
        for name, value in state.items():
            if name in adapters:  # every party ends with the same (global) adapters
                assert np.array_equal(value, states["server"][name]), (party, name)
            else:
                assert value.dtype == initial[name].dtype and np.array_equal(value, initial[name]), (party, name)
    moved = {n: float(np.abs(states["server"][n] - initial[n]).max()) for n in adapters}
    assert all(d > 0 for d in moved.values()), moved  # every adapter tensor and the head moved
    assert max(d for n, d in moved.items() if ".lora_B." in n) > 1e-3, moved  # B starts at 0: the adapters act now
    with np.load(tmp / "out" / "server" / "global_model.npz") as z:  # the whole state_dict, as the bundle
        assert sorted(z.files) == sorted(initial) and all(np.array_equal(z[n], states["server"][n]) for n in z.files)
    for i, client in enumerate(CLIENTS):
        model = secureflhv.load_model(tmp / "out" / client, ca=tmp / "certs" / "ca.pem")
        pred = pd.read_csv(tmp / "out" / client / "predictions.csv")
        tokens, _ = lora_code.token_arrays(N_ROWS, client=i)
        proba = model.predict_proba(tokens[pred["row"].to_numpy()])
        assert proba.shape == (len(pred), 2)
        np.testing.assert_allclose(proba[:, 1], pred["probability"].to_numpy(), rtol=0, atol=1e-6)
    twin = _initial_model()  # the trained model, rebuilt with plain torch from the bundle's state_dict
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in states["client-2"].items()})
    fresh, labels = lora_code.token_arrays(400, client=99)
    with torch.no_grad():
        expected = torch.softmax(twin(torch.from_numpy(fresh)), 1).numpy()
    np.testing.assert_allclose(model.predict_proba(fresh), expected, rtol=0, atol=1e-6)
    with torch.no_grad():
        before = (_initial_model()(torch.from_numpy(fresh)).argmax(1).numpy() == labels).mean()
    after = (model.predict(fresh) == labels).mean()
    assert after > max(before, 0.55), (before, after)  # chance is 0.5
