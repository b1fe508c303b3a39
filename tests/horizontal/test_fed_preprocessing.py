"""Federated preprocessing (fedstats/preprocessing.py, fedstats/statistics.py): the statistics summed by secure
aggregation equal the pooled-data values — counts exactly, means and variances within the stated
fixed-point bound — and the server's transcript holds no client's own statistics."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import secagg_harness
from secureflhv.fedstats.statistics import (BUCKETS_PER_OCTAVE, EXP_MIN, N_MAG, StatsError, StatsSpec,
                                            bucket_bounds, magnitude_bucket, round_a_vector, round_b_vector,
                                            decode_round_a)
from secureflhv.data.loaders import load_penguins
from secureflhv.data.tabular import Preprocessor
from secureflhv.fedstats.preprocessing import (FederatedStatsClient, FederatedStatsError,
                                               FederatedStatsServer, stats_aggregation_config)
from secureflhv.transport.inprocess import InProcessNetwork

GAMMA = 2 ** (1 / BUCKETS_PER_OCTAVE)


def penguin_shards(n: int = 3):
    """Penguins split by island-sorted rows (non-IID: each client sees mostly one island)."""
    ds = load_penguins()
    order = np.argsort(np.nan_to_num(ds.X[:, 0], nan=9), kind="stable")
    parts = np.array_split(order, n)
    return ds, [ds.X[p] for p in parts]


def spec_of(ds, **kw) -> StatsSpec:
    return StatsSpec(tuple(ds.feature_names), {k: tuple(v) for k, v in ds.categories.items()}, **kw)


def run(shards, spec, *, kind="secagg", specs=None, recording=False, absent=(), agg_kw=None):
    ids = [f"client{i}" for i in range(len(shards))]
    net = InProcessNetwork("job-fpp", ["server", *ids], deadline=20, cert_dir=secagg_harness.CERT_DIR)
    cfg = stats_aggregation_config(kind, seed=3, stage_timeout_s=10, input_timeout_s=10, **(agg_kw or {}))
    st = secagg_harness.RecordingTransport(net, "server") if recording else net.transport("server")
    out, errors = {}, {}

    def go(name, fn):
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001
            errors[name] = exc

    threads = [threading.Thread(target=go, args=("server", lambda: FederatedStatsServer(
        st, ids, cfg, ranges=spec.ranges, moments=spec.moments, timeout_s=4).run()))]
    for i, c in enumerate(ids):
        if c in absent:
            continue
        s = (specs or {}).get(c, spec)
        threads.append(threading.Thread(target=go, args=(c, lambda c=c, s=s, X=shards[i]: FederatedStatsClient(
            net.transport(c), "server", ids, s, cfg).run(X))))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "federated statistics hung"
    return out, errors, st


@pytest.fixture(scope="module")
def penguins_run():
    ds, shards = penguin_shards()
    out, errors, st = run(shards, spec_of(ds), recording=True)
    assert not errors, errors
    return ds, shards, out, st


def test_counts_and_vocabularies_equal_pooled_exactly(penguins_run):
    ds, shards, out, _ = penguins_run
    X = np.vstack(shards)
    res = out["server"]
    assert res.counts.n_rows == len(X) == 344
    for j, name in enumerate(ds.feature_names):
        col = X[:, j]
        assert res.counts.missing[name] == int(np.isnan(col).sum())
        assert res.counts.present[name] == int((~np.isnan(col)).sum())
        if name in ds.categories:
            want = np.bincount(col[~np.isnan(col)].astype(int), minlength=len(ds.categories[name]))
            assert res.counts.category_counts[name].tolist() == want.tolist()
    # every client got the same statistics as the server
    for c in ("client0", "client1", "client2"):
        assert out[c].to_dict() == res.to_dict()


def test_mean_variance_and_preprocessor_within_stated_error(penguins_run):
    ds, shards, out, _ = penguins_run
    X = np.vstack(shards)
    res = out["client1"]
    mean, var = res.mean_var()
    em, ev = res.error_bounds()
    cols = [ds.feature_names.index(n) for n in res.spec.numeric]
    pooled_mean, pooled_var = np.nanmean(X[:, cols], axis=0), np.nanvar(X[:, cols], axis=0)
    assert np.all(np.abs(mean - pooled_mean) <= em)
    assert np.all(np.abs(var - pooled_var) <= ev)
    assert np.all(em < 1e-4 * np.abs(pooled_mean)) and np.all(ev < 1e-4 * pooled_var)   # the bound is tight
    fed = res.preprocessor(standardize=True, missing_indicator=True)
    ref = Preprocessor.fit(X, ds.feature_names, ds.categories, standardize=True, missing_indicator=True)
    assert fed.output_names == ref.output_names
    np.testing.assert_array_equal(fed.mode, ref.mode)            # most frequent category: exact
    np.testing.assert_array_equal(fed.indicator, ref.indicator)
    np.testing.assert_allclose(fed.transform(X), ref.transform(X), rtol=0, atol=1e-5)
    # the same Preprocessor survives its JSON round trip (the model bundle)
    np.testing.assert_array_equal(Preprocessor.from_dict(fed.to_dict()).transform(X), fed.transform(X))


def test_range_sketch_contains_pooled_range_within_a_bucket(penguins_run):
    ds, shards, out, _ = penguins_run
    X = np.vstack(shards)
    res = out["server"]
    for i, name in enumerate(res.spec.numeric):
        col = X[:, ds.feature_names.index(name)]
        lo, hi = np.nanmin(col), np.nanmax(col)
        assert res.counts.lo[i] <= lo and hi <= res.counts.hi[i]
        assert lo - res.counts.lo[i] <= (GAMMA - 1) * abs(lo) + 2.0 ** EXP_MIN
        assert res.counts.hi[i] - hi <= (GAMMA - 1) * abs(hi) + 2.0 ** EXP_MIN


def test_server_transcript_holds_only_sums(penguins_run):
    ds, shards, out, st = penguins_run
    tags = {tag for _, tag, _ in st.received}
    assert tags <= {"fpp.hello", "agg.advertise", "agg.share", "agg.masked", "agg.sign", "agg.unmask"}, tags
    transcript = b"".join(p for _, _, p in st.received)
    assert not any(_client_words_in(transcript, ds, X, out["server"]) for X in shards)


def test_plain_quantised_transcript_does_show_client_statistics():
    ds, shards = penguin_shards()
    out, errors, st = run(shards, spec_of(ds), kind="plain_quantised", recording=True)
    assert not errors
    transcript = b"".join(p for _, _, p in st.received)
    assert all(_client_words_in(transcript, ds, X, out["server"]) for X in shards)   # the detector works


def _client_words_in(transcript: bytes, ds, X, res) -> bool:
    """Whether a client's round-B words (sum q, sum q^2 per column), or a 16-word window of its round-A
    counts, appear in ``transcript`` (as uint64 words of the quantised encoding)."""
    spec = spec_of(ds)
    cfg = stats_aggregation_config()

    def words(v):  # residues mod 2^k, as the quantised encoding sends them
        return v.astype(np.int64).view(np.uint64) & np.uint64((1 << cfg.quant_params(3, len(v)).k_bits) - 1)
    b = words(round_b_vector(X, spec, res.counts))
    a = round_a_vector(X, spec)
    nz = int(np.flatnonzero(a[1:])[len(ds.categories) + 4]) + 1
    window = words(a)[nz:nz + 16]
    return b.tobytes() in transcript or window.tobytes() in transcript


def test_public_ranges_skip_the_sketch_and_count_clipped_values():
    ds, shards = penguin_shards()
    spec = spec_of(ds, ranges=((30, 60), (13, 22), (170, 200), (2500, 6500)))  # flipper up to 231: clipped
    out, errors, _ = run(shards, spec)
    assert not errors
    res = out["server"]
    assert res.counts.magnitude is None and spec.dim_a == 1 + 4 * 2 + (1 + 3) + (1 + 2)
    X = np.vstack(shards)
    flipper = X[:, ds.feature_names.index("flipper_length_mm")]
    assert res.moments[2, 2] == int(np.sum((flipper < 170) | (flipper > 200)))
    mean, _ = res.mean_var()
    bill = X[:, ds.feature_names.index("bill_length_mm")]
    assert abs(mean[0] - np.nanmean(bill)) <= res.error_bounds()[0][0]


def test_clients_with_different_vocabularies_are_named():
    ds, shards = penguin_shards()
    odd = StatsSpec(tuple(ds.feature_names), {"island": ("Biscoe", "Dream", "Torgersen", "Other"),
                                              "sex": ("female", "male")})
    out, errors, _ = run(shards, spec_of(ds), specs={"client2": odd})
    assert isinstance(errors.get("server"), FederatedStatsError)
    assert "client2" in str(errors["server"]) and "data.schema" in str(errors["server"])


def test_an_absent_client_is_left_out_and_the_others_get_their_sums():
    ds, shards = penguin_shards()
    # two of three remain: the explicit two-client opt-in (each learns the other's statistics)
    out, errors, _ = run(shards, spec_of(ds), absent=("client2",), agg_kw=dict(min_clients=2, max_colluders=0))
    assert not errors, errors
    res = out["server"]
    assert res.participants == ["client0", "client1"] == out["client0"].participants
    assert res.counts.n_rows == len(shards[0]) + len(shards[1])
    mean, _ = res.mean_var()
    pooled = np.nanmean(np.vstack(shards[:2])[:, 1])
    assert abs(mean[0] - pooled) <= res.error_bounds()[0][0]


def test_all_missing_column_is_a_clear_error():
    ds, shards = penguin_shards()
    shards = [s.copy() for s in shards]
    for s in shards:
        s[:, 1] = np.nan
    out, errors, _ = run(shards, spec_of(ds))
    assert not errors
    with pytest.raises(StatsError, match="bill_length_mm.*missing in every training row"):
        out["client0"].preprocessor()


def test_magnitude_buckets_contain_their_values():
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.normal(0, 1, 2000) * 10.0 ** rng.integers(-9, 11, 2000), [0.0, -0.0, 1.0, -1.0, 2.0,
                        2.0 ** 0.125, 2.0 ** -24, -(2.0 ** -24), 2.0 ** 39.99, 1e-30]])
    s = magnitude_bucket(v)
    assert s.min() >= -N_MAG and s.max() <= N_MAG
    for x, k in zip(v, s):
        lo, hi = bucket_bounds(int(k))
        assert lo <= x <= hi and (k == 0 or hi / lo <= GAMMA * (1 + 1e-12) if lo > 0 else True)
    with pytest.raises(StatsError, match="declare public ranges"):
        magnitude_bucket(np.array([2.0 ** 41]))


def test_round_a_rejects_bad_codes_and_decode_rejects_bad_totals():
    ds, shards = penguin_shards()
    spec = spec_of(ds)
    X = shards[0].copy()
    X[3, 0] = 7.0
    with pytest.raises(StatsError, match="'island'.*outside 0..2"):
        round_a_vector(X, spec)
    good = round_a_vector(shards[0], spec).astype(np.float64)
    for bad in (good[:-1], np.where(np.arange(len(good)) == 3, 0.5, good), -good):
        with pytest.raises(StatsError):
            decode_round_a(bad, spec)
