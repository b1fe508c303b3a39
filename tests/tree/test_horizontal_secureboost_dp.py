"""Record-level distributed Skellam DP of horizontal SecureBoost's sums (secureflhv/tree/tree_privacy.py, issue 38).

With seeded noise the pooled vectors are the plaintext sums of what the clients submitted, which differ from their
exact integer statistics by the noise; ε equals the Skellam RDP bound computed here (numpy + dp-accounting) from
sensitivities derived here; a tiny noise gives the non-DP trees; ε = 8 over the job on breast cancer beats the
majority class; a dropout is accounted at the survivors' variance; refusals name the field."""
from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from dp_accounting.rdp import compute_epsilon
from sklearn.datasets import load_breast_cancer, load_iris

from sb_harness import run_threads, vanish_at
from secureflhv.transport import InProcessNetwork
from secureflhv.tree.binning import grid, grid_counts
from secureflhv.tree.horizontal import (HorizontalSecureBoostClient, HorizontalSecureBoostServer,
                                        tree_aggregation_config)
from secureflhv.tree.params import SecureBoostParams
from secureflhv.tree.tree_privacy import TreeDPParams

ORDERS = list(range(2, 64)) + list(range(64, 257, 8)) + [320, 384, 512, 768, 1024]
SCALE = 2.0 ** 40


def _skellam_epsilon(entries, delta) -> float:
    """Agarwal, Kairouz, Liu (NeurIPS 2021) Thm. 3.5 per release (variance v, Δ2, Δ1), summed, then converted."""
    a = np.array(ORDERS, float)
    rdp = sum(a * l2 ** 2 / (2 * v) + np.minimum(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * v ** 2), 3 * l1 / (2 * v))
              for v, l2, l1 in entries)
    return float(compute_epsilon(ORDERS, rdp, delta)[0])


def _data(seed: int = 0):
    X, y = load_breast_cancer(return_X_y=True)
    perm = np.random.default_rng(seed).permutation(len(y))
    X, y = X[perm], y[perm].astype(float)
    ranges = [(float(lo), float(hi)) for lo, hi in zip(X.min(0), X.max(0))]   # public (declared) ranges
    return X[:455], y[:455], X[455:], y[455:], ranges


def _run(parts, params, dp, ranges, *, val=None, kind="plain_quantised", record=False, vanish=None, timeout=30.0,
         stage_timeout=None):
    """Server + clients in threads; ``record``: every client's submitted and the server's unmasked integers."""
    ids = [f"client-{i}" for i in range(len(parts))]
    net = InProcessNetwork("hsb-dp", ["server", *ids], deadline=timeout)
    st = timeout if stage_timeout is None else stage_timeout
    cfg = tree_aggregation_config(kind, seed=7, stage_timeout_s=st, input_timeout_s=st)
    server = HorizontalSecureBoostServer(net.transport("server"), ids, params, aggregation=cfg, feature_ranges=ranges,
                                         dp=dp)
    clients = [HorizontalSecureBoostClient(net.transport(c), "server", ids, X, y, params, aggregation=cfg,
                                           send_ranges=False, dp=dp, X_val=None if val is None else val[i][0],
                                           y_val=None if val is None else val[i][1])
               for i, (c, (X, y)) in enumerate(zip(ids, parts))]
    sent, pooled = {}, {}
    if record:
        agg = server.agg.aggregate

        def aggregate(rnd, *a, **k):
            res = agg(rnd, *a, **k)
            pooled[rnd] = np.rint(res.total * SCALE)
            return res
        server.agg.aggregate = aggregate
        for c in clients:
            def submit(rnd, parts_, vec, w, c=c, real=c.agg.submit):
                sent[c.party_id, rnd] = np.rint(np.asarray(vec) * SCALE)
                return real(rnd, parts_, vec, w)
            c.agg.submit = submit
    for i, (tree, stage) in (vanish or {}).items():
        vanish_at(clients[i], net, tree, stage)
    res, err = run_threads({"server": server.fit, **{c.party_id: c.fit for c in clients}}, timeout=120)
    return dict(model=res.get("server"), server=server, clients=clients, sent=sent, pooled=pooled, errors=err)


def _split_structure(model):
    return [{nid: (n.feature, n.bin, bool(n.default_left)) for nid, n in t.nodes.items() if not n.leaf}
            for t in model.trees]


def test_tiny_noise_gives_the_plain_trees():
    X, y, _, _, ranges = _data()
    parts = [(X[i::3], y[i::3]) for i in range(3)]
    params = SecureBoostParams(n_trees=3, max_depth=3, max_bin=8, sketch_bins=256)
    plain = _run(parts, params, None, ranges)
    tiny = _run(parts, params, TreeDPParams(noise_multiplier=1e-6, validation=False, noise_seed=1), ranges)
    assert not plain["errors"] and not tiny["errors"]
    a, b = _split_structure(tiny["model"]), _split_structure(plain["model"])
    # the same nodes split and the same training rows reach each leaf; a split may differ only where two
    # candidates tie exactly in the plain run (same partition, same gain: the noise breaks the tie)
    assert [sorted(t) for t in a] == [sorted(t) for t in b]
    assert [[n.leaf for _, n in sorted(t.nodes.items())] for t in tiny["model"].trees] == \
        [[n.leaf for _, n in sorted(t.nodes.items())] for t in plain["model"].trees]
    assert sum(ta[n] != tb[n] for ta, tb in zip(a, b) for n in ta) <= 1 < sum(len(t) for t in a) // 5
    assert np.allclose(tiny["model"].predict(X), plain["model"].predict(X), atol=1e-4)
    assert tiny["server"].privacy["precision_bits"] == 20   # the cap: tiny noise never meets the sampler's limit


@pytest.fixture(scope="module")
def seeded_run():
    X, y, Xv, yv, ranges = _data(1)
    parts = [(X[i::3], y[i::3]) for i in range(3)]
    val = [(Xv[i::3], yv[i::3]) for i in range(3)]
    params = SecureBoostParams(n_trees=2, max_depth=2, max_bin=6, sketch_bins=32, min_child_weight=2.0)
    dp = TreeDPParams(target_epsilon=4.0, delta=1e-6, noise_seed=3)
    run = _run(parts, params, dp, ranges, val=val, record=True, kind="secagg")
    assert not run["errors"], run["errors"]
    return run, parts, ranges, params


def test_pooled_vectors_are_the_sums_of_the_noised_inputs(seeded_run):
    run, parts, ranges, params = seeded_run
    sent, pooled = run["sent"], run["pooled"]
    assert sorted(pooled) == list(range(1, len(pooled) + 1))
    for r, total in pooled.items():
        assert np.array_equal(total, sum(sent[f"client-{i}", r] for i in range(3)))
    # round 1 is the binning: each input is the client's exact grid counts, missing counts, rows, labels + noise
    for i, (X, y) in enumerate(parts):
        exact = np.concatenate([grid_counts(X[:, j], grid(lo, hi, params.sketch_bins)) for j, (lo, hi)
                                in enumerate(ranges)] + [np.zeros(X.shape[1]), [len(y), y.sum()]])
        noise = sent[f"client-{i}", 1] - exact
        assert np.count_nonzero(noise) > len(exact) // 2 and abs(noise.mean()) < 5 * noise.std() / math.sqrt(len(exact))
    # every client's noise is its own (seeded per client and round): two clients' shares differ
    assert not np.array_equal(sent["client-0", 2] - sent["client-1", 2], np.zeros_like(sent["client-0", 2]))
    assert run["model"].val_losses and all(0 <= v <= 8 for v in run["model"].val_losses)


def test_epsilon_is_the_skellam_bound_of_every_release(seeded_run):
    run, parts, ranges, params = seeded_run
    rec, pooled = run["server"].privacy, run["pooled"]
    z, p, d = rec["noise_multiplier"], rec["precision_bits"], len(ranges)
    assert rec["h_bits"] == p + 2 and rec["count_scale"] == 2 ** p   # binary: |g| <= 1, h <= 1/4
    # sensitivities derived here: binning d + 1 ones and a 0/1 label; a level: per virtual column (V = d, no
    # missing values) one g <= 2^p, one h <= 2^-2 2^(p+2), one count 2^p; validation [2^8 l/L, 2^8]
    levels = [r for r, v in pooled.items() if r > 1 and len(v) > 2]
    vals = [r for r, v in pooled.items() if len(v) == 2]
    assert len(levels) + len(vals) + 1 == len(pooled) and len(vals) == params.n_trees
    sens = [(math.sqrt(d + 2), d + 2.0)] + [(math.sqrt(3 * d) * 2 ** p, 3 * d * 2.0 ** p)] * len(levels) + \
        [(256 * math.sqrt(2), 512.0)] * len(vals)
    # 3 clients, max_colluders 1: t = 3, each adds (z Δ2)^2 / 2; 3 survivors carry (3 - 1) / 2 of it: exactly
    want = _skellam_epsilon([((z * l2) ** 2, l2, l1) for l2, l1 in sens], 1e-6)
    assert rec["epsilon"] == pytest.approx(want, rel=1e-6, abs=1e-6)
    assert rec["epsilon"] <= rec["planned_epsilon"] <= 4.0 and rec["planned_epsilon"] > 4.0 * (1 - 1e-4)
    assert rec["releases"] == {"binning": 1, "histograms": len(levels), "validation": len(vals)}
    assert run["clients"][0].privacy["epsilon"] == pytest.approx(rec["epsilon"], rel=1e-9)
    hist = run["server"].privacy_history
    assert [h["round"] for h in hist] == [1, 2] and hist[0]["epsilon"] < hist[1]["epsilon"] == rec["epsilon"]


def test_moderate_privacy_beats_the_majority_class():
    """ε = 8 (δ = 1e-5) over the job: 3 trees of depth 3, 4 bins; mean test accuracy over 8 noise seeds.
    Measured: mean 0.85, min 0.78 (majority 0.59); 20 seeds: mean 0.79, one seed at 0.33."""
    X, y, Xt, yt, ranges = _data()
    parts = [(X[i::3], y[i::3]) for i in range(3)]
    params = SecureBoostParams(n_trees=3, max_depth=3, max_bin=4, sketch_bins=64, min_child_weight=5.0)
    accs = []
    for seed in range(8):
        run = _run(parts, params, TreeDPParams(target_epsilon=8.0, validation=False, noise_seed=seed), ranges)
        assert not run["errors"] and run["server"].privacy["epsilon"] <= 8.0
        accs.append(float(((run["model"].predict(Xt) > 0.5) == yt).mean()))
    majority = max(yt.mean(), 1 - yt.mean())
    assert np.mean(accs) >= majority + 0.15 and np.median(accs) >= majority + 0.15, accs


def test_multiclass_runs_with_its_bounds():
    X, y = load_iris(return_X_y=True)
    perm = np.random.default_rng(0).permutation(len(y))
    X, y = X[perm], y[perm].astype(float)
    ranges = [(float(lo), float(hi)) for lo, hi in zip(X.min(0), X.max(0))]
    params = SecureBoostParams(objective="multiclass", n_classes=3, n_trees=2, max_depth=2, max_bin=4,
                               sketch_bins=32)
    run = _run([(X[i::3], y[i::3]) for i in range(3)], params,
               TreeDPParams(noise_multiplier=0.5, validation=False, noise_seed=2), ranges)
    assert not run["errors"], run["errors"]
    rec = run["server"].privacy
    assert rec["h_bits"] == rec["precision_bits"] + 1 and rec["hessian_bound"] == 0.5   # h_k <= 1/2
    assert rec["releases"]["histograms"] <= 2 * 3 * 2 and rec["sensitivities"]["binning"]["l1_sensitivity"] == 5
    assert ((run["model"].predict(X).argmax(1)) == y).mean() > 0.5


def test_a_dropout_is_accounted_at_its_survivors():
    """4 clients (t = 3, c = 1: each adds mu / 2); client 3 dies at tree 1's histograms: releases with 4 survivors
    carry 3 mu / 2, the ones after the drop mu (the rebuilt round's too; the discarded sums count)."""
    X, y, _, _, ranges = _data()
    params = SecureBoostParams(n_trees=2, max_depth=2, max_bin=4, sketch_bins=32)
    run = _run([(X[i::4], y[i::4]) for i in range(4)], params,
               TreeDPParams(noise_multiplier=3.0, validation=False, noise_seed=4), ranges,
               vanish={3: (1, "histograms")}, stage_timeout=2.0)
    assert set(run["errors"]) == {"client-3"}
    srv = run["server"]
    assert srv.dropped and srv.active == ["client-0", "client-1", "client-2"]
    ratios = [v / srv.tdp.plan.variance(r) for r, v in srv.acc.entries]
    first = ratios.index(1.0)
    assert ratios[:first] == [1.5] * first and set(ratios[first:]) == {1.0} and first >= 2
    entries = [(v, r.l2_sensitivity, r.l1_sensitivity) for r, v in srv.acc.entries]
    assert srv.privacy["epsilon"] == pytest.approx(_skellam_epsilon(entries, 1e-5), rel=1e-6)


@pytest.mark.parametrize("change, field", [
    (dict(objective="regression"), "params.objective"), (dict(reg_lambda=0.0), "params.reg_lambda")])
def test_refused_parameters_name_their_field(change, field):
    ids = ["client-0", "client-1", "client-2"]
    net = InProcessNetwork("hsb-dp-bad", ["server", *ids], deadline=5)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        HorizontalSecureBoostServer(net.transport("server"), ids, SecureBoostParams(**change),
                                    feature_ranges=[(0.0, 1.0)] * 2, dp=TreeDPParams(noise_multiplier=1.0))
    with pytest.raises(ValueError, match=r"params\.feature_ranges"):
        HorizontalSecureBoostClient(net.transport("client-0"), "server", ids, np.zeros((4, 2)), np.zeros(4),
                                    SecureBoostParams(), dp=TreeDPParams(noise_multiplier=1.0))
    with pytest.raises(ValueError, match=r"params\.aggregation"):
        HorizontalSecureBoostServer(net.transport("server"), ids, SecureBoostParams(),
                                    aggregation=tree_aggregation_config("plain"), feature_ranges=[(0.0, 1.0)] * 2,
                                    dp=TreeDPParams(noise_multiplier=1.0))
    with pytest.raises(ValueError, match=r"params\.dp: resuming"):
        HorizontalSecureBoostServer(net.transport("server"), ids, SecureBoostParams(), feature_ranges=[(0.0, 1.0)],
                                    dp=TreeDPParams(noise_multiplier=1.0), resume=({}, {}))


@pytest.mark.parametrize("params, words", [
    ({"aggregation": "plain", "feature_ranges": [[0, 1]] * 3}, r"params\.aggregation: params\.dp needs secagg"),
    ({}, r"params\.feature_ranges: params\.dp needs public"),
    ({"objective": "regression", "feature_ranges": [[0, 1]] * 3}, r"params\.objective: regression"),
    ({"feature_ranges": [[0, 1]] * 3, "dp": {"target_epsilon": 1e-9}}, r"params\.dp: noise multiplier .* lower params\.dp\.noise_multiplier")])
def test_a_job_with_dp_that_cannot_hold_is_refused(tmp_path, params, words):
    from secureflhv.runtime.job.job_file import JobConfigError
    from secureflhv.runtime.job.load import load_job_params

    parties = [{"id": "server", "role": "server", "address": "127.0.0.1:5100", "cert": "c", "key": "k"}]
    parties += [{"id": f"c{i}", "role": "host", "address": f"127.0.0.1:{5101 + i}", "cert": "c", "key": "k",
                 "data": {"path": f"c{i}.csv", "label_column": "y"}} for i in range(3)]
    doc = {"job": {"id": "j", "algorithm": "secureboost_horizontal"}, "security": {"ca": "ca.pem"},
           "parties": parties, "params": {"n_trees": 2, "dp": {"noise_multiplier": 1.0}, **params}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(JobConfigError, match=words):
        load_job_params(path)
    ok = dict(doc, params={"n_trees": 2, "feature_ranges": [[0, 1]] * 3, "validation_fraction": 0.2,
                           "dp": {"target_epsilon": 2.0}})
    path.write_text(yaml.safe_dump(ok))
    assert load_job_params(path)[1].dp.target_epsilon == 2.0


def test_a_job_records_its_epsilon_in_metrics_and_bundles(tmp_path):
    """``algorithm: secureboost_horizontal`` with ``params.dp`` in process (secure aggregation, TLS certificates):
    the server's metrics.json has the record and ε after each round, every bundle's extra.privacy a record."""
    import json
    import sys
    from pathlib import Path

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "horizontal"))
    from fl_harness import job_dict, run_job_threads

    from secureflhv.runtime.algorithms import secureboost_horizontal as hsb
    from secureflhv.runtime.job.load import parse_job
    from secureflhv.transport.certs import generate_certificates

    X, y, _, _, ranges = _data(2)
    paths = []
    for i in range(3):
        df = pd.DataFrame(X[i::3, :8], columns=[f"f{j}" for j in range(8)]).assign(y=y[i::3].astype(int))
        df.insert(0, "id", [f"r{i}-{k}" for k in range(len(df))])
        paths.append(tmp_path / f"c{i}.csv")
        df.to_csv(paths[-1], index=False)
    params = {"n_trees": 2, "max_depth": 2, "max_bin": 4, "sketch_bins": 32, "validation_fraction": 0.2,
              "feature_ranges": [list(r) for r in ranges[:8]],
              "dp": {"target_epsilon": 6.0, "delta": 1e-5, "noise_seed": 9}}
    doc = job_dict(paths, params, algorithm="secureboost_horizontal", job_id="hsb-dp", tls=True)
    out = tmp_path / "run"
    out.mkdir()
    cfg = parse_job(doc, out)
    generate_certificates(cfg.resolve(cfg.security.ca).parent, [p.id for p in cfg.parties])
    run_job_threads(cfg, hsb.run)
    metrics = json.loads((out / "out" / "server" / "metrics.json").read_text())
    rec = metrics["privacy"]
    assert rec["unit"] == "record" and rec["delta"] == 1e-5 and 0 < rec["epsilon"] <= 6.0
    assert rec["releases"]["validation"] == len(metrics["rounds"]) == 2      # validation_fraction > 0
    assert metrics["rounds"][-1]["privacy"]["epsilon"] == rec["epsilon"]
    for party in ("server", "client-1"):
        extra = json.loads((out / "out" / party / "model" / "manifest.json").read_text())["extra"]
        assert extra["privacy"]["epsilon"] == pytest.approx(rec["epsilon"], rel=1e-9)
