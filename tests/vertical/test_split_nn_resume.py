"""Split NN resume: in process from every epoch's checkpoint, and after a crash with guest and host
processes over gRPC with mutual TLS (slow).

In the process test a is SIGKILLed after it checkpointed an epoch; the guest stops with an error naming it within its
deadline; ``secureflhv run JOB --resume`` continues after the last epoch both parties checkpointed and
the finished model equals an uninterrupted run's to 1e-6 (the interactive weights W_h = V_h + E_h: the
shares themselves carry fresh secret noise in every run).
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from secureflhv.data import load_sklearn
from secureflhv.runtime.job.demo import write_vertical_nn_job
from secureflhv.vertical.split_nn import SplitNNConfig
from snn_harness import make_roles, run_roles, toy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from resume_harness import kill_after, resumed_steps, run_job  # noqa: E402
from lifecycle_helpers import recorder  # noqa: E402

PARAMS = {"epochs": 4, "batch_size": 32, "host_bottom": [4, 2], "guest_bottom": [3], "interactive_units": 2,
          "key_bits": 512, "learning_rate": 0.05, "optimizer": "adam", "test_fraction": 0.25, "split_seed": 3,
          "seed": 1, "init_seed": 2}
KILL_AFTER = 2  # epochs the host finishes before it is killed


def _job(tmp: Path) -> Path:
    ds = load_sklearn("breast_cancer")
    rows = np.random.default_rng(0).permutation(len(ds.y))[:140]
    small = dataclasses.replace(ds, X=ds.X[rows], y=ds.y[rows], ids=None if ds.ids is None else ds.ids[rows])
    return write_vertical_nn_job(tmp, None, None, PARAMS, dataset=small, n_hosts=1, scheme="random", seed=2,
                                 deadline_s=10, insecure_test_keys=True, job_id="snn-resume")


def _model(out_dir: Path) -> dict:
    guest = load_file(out_dir / "guest" / "model" / "state.safetensors")
    host = load_file(out_dir / "host-1" / "model" / "state.safetensors")
    model = {k: v for k, v in guest.items() if not k.startswith("interactive.V.")}
    model["W_h"] = guest["interactive.V.host-1"] + host["interactive.E"]
    model.update({f"host.{k}": v for k, v in host.items() if k.startswith("bottom.")})
    model["loss"] = np.array(json.loads((out_dir / "guest" / "metrics.json").read_text())["history"]["loss"])
    return model


SMALL = SplitNNConfig(key_bits=512, insecure_test_key=True, host_bottom=[4, 2], guest_bottom=[3],
                      interactive_units=2, top_hidden=[3], epochs=3, batch_size=12, optimizer="adam",
                      learning_rate=0.05, seed=5, init_seed=2)


def _train(Xg, y, Xhs, resume=None, cfg=SMALL):
    """Fit guest + hosts in process; returns (guest, hosts, {party: {epochs done: (arrays, state)}}, guest result)."""
    saved = {p: {} for p in ["guest", *(f"host-{i}" for i in range(1, len(Xhs) + 1))]}  # make_roles' ids
    _, guest, hosts = make_roles(Xg, y, Xhs, cfg, callbacks={p: [recorder(s)] for p, s in saved.items()},
                                 resume=resume)
    results, errors = run_roles(guest, hosts)
    assert not errors, errors
    return guest, hosts, saved, results["guest"]


def _weights(guest, hosts) -> dict:
    out = {k: v for k, v in guest.state_arrays().items() if not k.startswith("interactive.V.")}
    for h in hosts:
        out[f"W_h.{h.party_id}"] = guest.V[h.party_id] + h.E
        out.update({f"{h.party_id}.{k}": v for k, v in h.state_arrays().items() if k.startswith("bottom.")})
    return out


def test_resume_from_every_epoch_equals_uninterrupted():
    cfg = SMALL  # Adam: its moments and step count are part of the state
    X, y = toy(n=24, d=6, seed=1)
    Xg, Xhs = X[:, :2], [X[:, 2:4], X[:, 4:]]
    guest, hosts, saved, res = _train(Xg, y, Xhs, cfg=cfg)
    assert sorted(saved["guest"]) == [1, 2, 3] and sorted(saved["host-2"]) == [1, 2, 3]
    assert any(k.startswith("opt.") and k.endswith("exp_avg_sq") for k in saved["host-1"][1][0])
    reference = _weights(guest, hosts)
    for k in (1, 2):
        g2, h2, _, res2 = _train(Xg, y, Xhs, resume={p: s[k] for p, s in saved.items()}, cfg=cfg)
        np.testing.assert_allclose(res2.batch_losses, res.batch_losses, rtol=0, atol=1e-9)
        assert len(res2.epoch_seconds) == 3
        resumed = _weights(g2, h2)
        for name, v in reference.items():
            np.testing.assert_allclose(resumed[name], v, rtol=0, atol=1e-9, err_msg=f"{name} after epoch {k}")


def test_foreign_checkpoint_is_rejected():
    X, y = toy(n=24, d=6, seed=1)
    Xg, Xhs = X[:, :3], [X[:, 3:]]
    _, _, saved, _ = _train(Xg, y, Xhs)
    arrays, state = saved["host-1"][2]
    cases = {"not a split NN checkpoint": (arrays, {"rounds_done": 2}),              # another family's state
             "not a split NN checkpoint of": (arrays, {"epochs_done": 9}),           # beyond the job's epochs
             "mis-shaped array 'interactive.E'": ({**arrays, "interactive.E": np.zeros((3, 3))}, state),
             "optimiser entry": ({**arrays, "opt.0.exp_avg": np.zeros(7)}, state)}
    for match, bad in cases.items():
        _, _, hosts = make_roles(Xg, y, Xhs, SMALL, resume={"host-1": bad})
        with pytest.raises(ValueError, match=match):
            hosts[0]._restored_epochs(torch.optim.Adam(hosts[0].bottom.parameters()), ("seconds",))
    _, guest, _ = make_roles(Xg, y, Xhs, SMALL, resume={"guest": (arrays, state)})  # a host's checkpoint at the guest
    with pytest.raises(ValueError, match="not a split NN checkpoint"):
        guest._restored_epochs(None, ("losses", "batch_losses", "seconds"))


@pytest.mark.slow
def test_killed_host_then_resume_equals_uninterrupted_run(tmp_path):
    import secureflhv

    ref_job = _job(tmp_path / "ref")
    secureflhv.simulate(secureflhv.Job.from_yaml(ref_job))  # uninterrupted, in one process: the same model exactly
    reference = _model(ref_job.parent / "out")
    assert len(reference["loss"]) == PARAMS["epochs"]

    job = _job(tmp_path / "crash")
    killed = kill_after(job, ("guest", "host-1"), "host-1", f"epoch {KILL_AFTER}/")
    assert "host-1" in killed.last_lines()["guest"], killed.outputs["guest"][-2000:]  # names the dead host
    held = sorted(p.name for p in (job.parent / "out" / "host-1" / "checkpoints").iterdir()
                  if p.name.startswith("step-"))
    assert held and held[-1] == f"step-{KILL_AFTER:08d}"

    out = run_job(job, "--resume")
    assert resumed_steps(out) == {KILL_AFTER}, out[-3000:]
    resumed = _model(job.parent / "out")
    assert resumed.keys() == reference.keys()
    for key in reference:
        np.testing.assert_allclose(resumed[key], reference[key], rtol=0, atol=1e-6, err_msg=key)
