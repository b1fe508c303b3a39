"""Secure aggregation == plain_quantised exactly, for every dropout pattern that leaves >= t clients;
t-1 survivors -> AggregationError naming the stage (Bonawitz et al. CCS 2017, Fig. 4-5)."""
import numpy as np
import pytest

from secureflhv.secagg import AggregationError
from secureflhv.secagg.bonawitz import STAGE_NAMES

from secagg_harness import config, expected_quantised, make_inputs, run_round

N, D = 6, 300  # t = ceil(2*6/3) = 4


def check_exact(res, cfg, ids, survivors, xs, ws, round_id=1):
    assert not isinstance(res, Exception), res
    total, weight, clipped = expected_quantised(cfg, round_id, ids, survivors, xs, ws)
    assert res.survivors == sorted(survivors)
    assert np.array_equal(res.total, total)
    assert res.weight == weight and res.n_clipped == clipped
    plain = sum(ws[c] * np.clip(xs[c], -cfg.clip, cfg.clip) for c in survivors)
    assert np.max(np.abs(res.total - plain)) <= len(survivors) / cfg.scale  # stochastic rounding: < 1 ulp each
    assert res.k_bits == cfg.quant_params(len(ids), D).k_bits and res.clip == cfg.clip and res.scale == cfg.scale


def test_no_dropout_equals_plain_quantised_run():
    ids, xs, ws = make_inputs(N, D)
    cfg = config()
    res, errors, *_ = run_round(cfg, ids, xs, ws)
    assert not errors
    check_exact(res, cfg, ids, ids, xs, ws)
    # and the actual plain_quantised aggregator over the wire gives the very same numbers
    pq, errors, *_ = run_round(config(kind="plain_quantised"), ids, xs, ws)
    assert not errors and np.array_equal(pq.total, res.total) and pq.weight == res.weight


@pytest.mark.parametrize("stage", [0, 1, 2, 3, 4])
def test_one_client_lost_at_each_stage(stage):
    ids, xs, ws = make_inputs(N, D, seed=stage)
    cfg = config(consistency_check=True)
    lost = ids[2]
    res, errors, clients, *_ = run_round(cfg, ids, xs, ws, vanish={lost: stage})
    # a client lost after sending its masked input (stage >= 3) stays in the sum: its self mask is
    # reconstructed from the others' b-shares
    survivors = [c for c in ids if c != lost] if stage <= 2 else ids
    check_exact(res, cfg, ids, survivors, xs, ws)
    if stage <= 2:
        assert res.dropped == [lost] and res.dropped_at == {lost: STAGE_NAMES[stage]}
    assert set(errors) == {lost}


def test_several_lost_at_different_stages_without_consistency_check():
    ids, xs, ws = make_inputs(7, D, seed=3)  # t = 5
    cfg = config(threshold=4, consistency_check=False, max_colluders=0)
    res, errors, *_ = run_round(cfg, ids, xs, ws, vanish={ids[0]: 1, ids[3]: 2, ids[6]: 4})
    check_exact(res, cfg, ids, [c for c in ids if c not in (ids[0], ids[3])], xs, ws)


def test_exactly_t_left():
    ids, xs, ws = make_inputs(N, D, seed=4)
    cfg = config()  # t = 4
    res, errors, *_ = run_round(cfg, ids, xs, ws, vanish={ids[1]: 2, ids[4]: 2})
    check_exact(res, cfg, ids, [c for c in ids if c not in (ids[1], ids[4])], xs, ws)


@pytest.mark.parametrize("stage", [0, 2])
def test_t_minus_1_left_fails_naming_the_stage(stage):
    ids, xs, ws = make_inputs(N, D, seed=5)
    cfg = config()
    lost = ids[:3]  # 3 remain, t = 4
    res, errors, *_ = run_round(cfg, ids, xs, ws, vanish={c: stage for c in lost})
    assert isinstance(res, AggregationError)
    msg = str(res)
    assert STAGE_NAMES[stage] in msg and "t=4" in msg and all(c in msg for c in lost)
    # the remaining clients were told (abort), they do not hang until their deadline
    assert all("aborted" in str(errors[c]) for c in ids[3:])


def test_fraction_threshold_and_float_config():
    ids, xs, ws = make_inputs(5, 50, seed=6)
    cfg = config(threshold=0.6, clip=0.5, precision_bits=10, max_colluders=0)  # t = 3
    res, errors, *_ = run_round(cfg, ids, xs, ws, vanish={ids[0]: 0, ids[1]: 2})
    check_exact(res, cfg, ids, ids[2:], xs, ws)
    assert res.n_clipped > 0
