"""Record-level DP of federated preprocessing (fedstats/stats_privacy.py, issue 38): with seeded noise the pooled
vectors are the plaintext sums of what the clients submitted, which differ from their exact statistics by the
noise; ε equals the Skellam RDP bound computed here from sensitivities derived here; the statistics stay within a
few noise std of the exact pooled ones; small, very noisy sums stay valid (clamps); no public ranges is refused."""
from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from dp_accounting.rdp import compute_epsilon

import secagg_harness
from secureflhv.fedstats.preprocessing import (FederatedStatsClient, FederatedStatsError, FederatedStatsServer,
                                               stats_aggregation_config)
from secureflhv.fedstats.statistics import StatsSpec, round_a_vector
from secureflhv.params.sum_privacy import SumDPParams
from secureflhv.transport.inprocess import InProcessNetwork

ORDERS = list(range(2, 64)) + list(range(64, 257, 8)) + [320, 384, 512, 768, 1024]
RANGES = ((-10.0, 10.0), (0.0, 50.0), (-5.0, 5.0))
NAMES = ("a", "b", "c", "colour")
VOCAB = {"colour": ("red", "green", "blue")}


def _tables(rows: int, n: int = 3, seed: int = 0):
    """n clients' tables: 3 numeric columns (shifted per client, ~2% missing) and one categorical."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        X = np.column_stack([rng.normal(1 + i, 2, rows), rng.gamma(2, 5 + i, rows), rng.uniform(-5, 5, rows),
                             rng.choice(3, rows, p=[0.5, 0.3, 0.2]).astype(float)])
        X[:, 0][rng.random(rows) < 0.02] = np.nan
        out.append(X)
    return out


def _run(tables, dp: SumDPParams, ranges=RANGES):
    ids = [f"client{i}" for i in range(len(tables))]
    net = InProcessNetwork("job-fpp-dp", ["server", *ids], deadline=20, cert_dir=secagg_harness.CERT_DIR)
    cfg = stats_aggregation_config("secagg", seed=3, stage_timeout_s=10, input_timeout_s=10)
    spec = StatsSpec(NAMES, VOCAB, ranges)
    out, errors, sent, pooled = {}, {}, {}, {}
    server = FederatedStatsServer(net.transport("server"), ids, cfg, ranges=ranges, timeout_s=4, dp=dp)
    agg = server.agg.aggregate

    def aggregate(round_id, *a, **k):  # what the server unmasked, in the statistics' integers
        res = agg(round_id, *a, **k)
        pooled[round_id] = np.rint(res.total * 2.0 ** 40)
        return res
    server.agg.aggregate = aggregate
    roles = {"server": server.run}
    for c, X in zip(ids, tables):
        client = FederatedStatsClient(net.transport(c), "server", ids, spec, cfg, dp=dp)
        submit = client.agg.submit

        def record(round_id, parts, vec, w, c=c, submit=submit):
            sent[c, round_id] = np.rint(np.asarray(vec) * 2.0 ** 40)
            return submit(round_id, parts, vec, w)
        client.agg.submit = record
        roles[c] = lambda client=client, X=X: client.run(X)

    def go(name, fn):
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001
            errors[name] = exc
    threads = [threading.Thread(target=go, args=kv) for kv in roles.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    return out, sent, pooled, spec


def _skellam_epsilon(entries, delta) -> float:
    a = np.array(ORDERS, float)
    rdp = sum(a * l2 ** 2 / (2 * v) + np.minimum(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * v ** 2), 3 * l1 / (2 * v))
              for v, l2, l1 in entries)
    return float(compute_epsilon(ORDERS, rdp, delta)[0])


@pytest.fixture(scope="module")
def large_run():
    tables = _tables(40_000)
    return tables, _run(tables, SumDPParams(target_epsilon=1.0, delta=1e-6, noise_seed=7))


def test_pooled_vectors_are_the_sums_of_the_noised_inputs(large_run):
    tables, (out, sent, pooled, spec) = large_run
    for r in (1, 2):
        assert np.array_equal(pooled[r], sum(sent[f"client{i}", r] for i in range(3)))
    for i, X in enumerate(tables):  # each client's input is its exact statistics plus noise
        noise = sent[f"client{i}", 1] - round_a_vector(X, spec)
        assert np.count_nonzero(noise) > spec.dim_a // 2
    # clipped counts are not released: exactly 0 in every input
    assert all(not sent[f"client{i}", 2][2::3].any() for i in range(3))
    assert out["server"].to_dict() == out["client0"].to_dict() == out["client2"].to_dict()


def test_epsilon_is_the_skellam_bound_of_the_three_releases(large_run):
    _, (out, _, _, spec) = large_run
    rec = out["server"].privacy
    z, b = rec["noise_multiplier"], out["server"].bits
    # 3 clients, max_colluders 1 (the default): t = 3, each client adds (z Δ2)^2 / (t - c) = / 2; all 3 survive,
    # the honest ones carry (3 - 1) / 2 of (z Δ2)^2: accounted at exactly (z Δ2)^2 (the sum holds 3/2 of it)
    assert [r["variance_accounted"] for r in rec["releases"]] == pytest.approx([r["variance"] for r in rec["releases"]])
    l2 = [math.sqrt(1 + 4), 2.0 ** b * math.sqrt(3), 4.0 ** b * math.sqrt(3)]
    l1 = [5.0, 3 * 2.0 ** b, 3 * 4.0 ** b]
    want = _skellam_epsilon([((z * d2) ** 2, d2, d1) for d2, d1 in zip(l2, l1)], 1e-6)
    assert rec["epsilon"] == pytest.approx(want, rel=1e-12)
    # calibrated at b = 4 to ε = 1: at b > 4 the bound's discreteness term is smaller, so what was spent is less
    assert rec["epsilon"] < rec["planned_epsilon"] <= 1.0
    assert rec["planned_epsilon"] == pytest.approx(
        _skellam_epsilon([((z * d2) ** 2, d2, d1) for d2, d1 in
                          zip([math.sqrt(5), 16 * math.sqrt(3), 256 * math.sqrt(3)], [5.0, 48.0, 768.0])], 1e-6),
        rel=1e-12)
    assert 1.0 * (1 - 1e-4) < rec["planned_epsilon"]


def test_statistics_are_within_a_few_noise_std_of_the_exact_ones(large_run):
    tables, (out, _, _, _) = large_run
    st, X = out["server"], np.vstack(tables)
    z, b = st.privacy["noise_multiplier"], st.bits
    assert b == 8   # z ~ 7.9 and 3 columns: the Poisson cap keeps b at 8 (quantisation step (hi - lo) / 2^9)
    mean, var = st.mean_var()
    for j, (lo, hi) in enumerate(RANGES):
        v = np.clip(X[~np.isnan(X[:, j]), j], lo, hi)
        n, step = len(v), (hi - lo) / 2.0 ** (b + 1)
        sd1 = step * math.sqrt(1.5) * z * 2.0 ** b * math.sqrt(3) / n          # noise of sum q, value units / n
        sd2 = step ** 2 * math.sqrt(1.5) * z * 4.0 ** b * math.sqrt(3) / n     # noise of sum q^2
        sdn = math.sqrt(1.5) * z * math.sqrt(5) / n                             # relative noise of the count
        tol_m = 5 * sd1 + 5 * sdn * (hi - lo) / 2 + step / 2
        assert abs(mean[j] - v.mean()) <= tol_m
        tol_v = 5 * sd2 + 10 * sd1 * (hi - lo) / 2 + 5 * sdn * ((hi - lo) / 2) ** 2 + step * (hi - lo) / 2 + step ** 2
        assert abs(var[j] - v.var()) <= tol_v
        # the tolerance means something (the variance's is mostly the worst-case quantisation bound at b = 8)
        assert tol_m < 0.02 * v.std() and tol_v < 0.2 * v.var()
    assert abs(st.counts.n_rows - len(X)) <= 5 * math.sqrt(1.5) * z * math.sqrt(5)
    assert st.counts.category_counts["colour"].argmax() == 0


def test_tiny_noisy_sums_stay_valid():
    """9 rows and a large noise: counts may come out negative or below a client's own; every value stays valid."""
    out, *_ = _run(_tables(3, seed=2), SumDPParams(noise_multiplier=50.0, noise_seed=1))
    for st in out.values():
        mean, var = st.mean_var()
        assert st.counts.n_rows >= 1 and all(v >= 0 for v in st.counts.present.values())
        assert np.all(var >= 0) and np.all(var <= (np.diff(RANGES, axis=1)[:, 0] / 2) ** 2)
        assert np.all(mean >= [r[0] for r in RANGES]) and np.all(mean <= [r[1] for r in RANGES])
        pre = st.preprocessor(missing_indicator=True)
        assert np.isfinite(pre.transform(_tables(3, seed=2)[0])).all()


def test_dp_without_public_ranges_is_refused():
    ids = ["client0", "client1"]
    net = InProcessNetwork("job-fpp-dp2", ["server", *ids], deadline=5, cert_dir=secagg_harness.CERT_DIR)
    with pytest.raises(FederatedStatsError, match="public ranges.*extreme values"):
        FederatedStatsClient(net.transport("client0"), "server", ids, StatsSpec(NAMES, VOCAB),
                             stats_aggregation_config(), dp=SumDPParams(noise_multiplier=1.0))


def test_a_horizontal_job_with_private_preprocessing_records_its_epsilon(tmp_path):
    """params.preprocessing.dp in a job (in process, secure aggregation): it trains, every bundle carries the
    statistics' (ε, δ) record, and without public ranges or under plain aggregation the job is refused."""
    import copy
    import json

    from fl_harness import job_dict, partitioned_blobs, run_in_process

    from secureflhv.runtime.job.job_file import JobConfigError
    from secureflhv.runtime.job.load import parse_job

    shards = partitioned_blobs(tmp_path / "data", "iid", {}, n_clients=3, n_rows=600)
    dp = {"noise_multiplier": 2.0, "delta": 1e-4, "noise_seed": 5}
    params = {"strategy": "fedavg", "model": {"name": "mlp", "n_features": 6, "n_classes": 4, "hidden": [8]},
              "rounds": 1, "learning_rate": 0.1, "seed": 1, "aggregation": {"kind": "secagg", "seed": 3},
              "preprocessing": {"ranges": [[-10.0, 10.0]] * 6, "dp": dp}}
    doc = job_dict(shards, params, tls=True)
    out = tmp_path / "run"
    out.mkdir()
    run_in_process(parse_job(copy.deepcopy(doc), out))
    for party in ("server", "client-1"):
        stats = json.loads((out / "out" / party / "model" / "manifest.json").read_text())["preprocessing"]
        privacy = stats["federated_statistics"]["privacy"]
        assert privacy["unit"] == "record" and 0 < privacy["epsilon"] < float("inf") and privacy["delta"] == 1e-4
    for change, words in (({"ranges": None}, "public ranges"), ({}, "needs aggregation.kind secagg")):
        bad = copy.deepcopy(doc)
        bad["params"]["preprocessing"].update(change)
        if not change:
            bad["params"]["aggregation"]["kind"] = "plain"
        with pytest.raises(JobConfigError, match=words):
            parse_job(bad, tmp_path)
