"""Horizontal SecureBoost with t-of-n secure aggregation: a client that vanishes mid-training is dropped
and the boosting round it was lost in is rebuilt by the others. The model must EQUAL an independent
computation: the independent numpy twin (tests/tree/numpy_gbdt.py, its own cuts and base margin) on every
client's rows for the rounds before the drop, continued (same margins) on the survivors' rows only for the
rounds from the drop on. A drop leaving fewer than
t clients stops the job naming the client; a threshold t <= n/2 is refused."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_iris, make_classification

import numpy_gbdt as twin
from sb_harness import assert_trees_equal_twin, horizontal_nodes, horizontal_run, pooled_grid_cuts, two_phase_twin
from secureflhv.transport import InProcessNetwork
from secureflhv.tree.horizontal import (HorizontalSecureBoostClient, HorizontalSecureBoostError,
                                        HorizontalSecureBoostServer, tree_aggregation_config)
from secureflhv.tree.params import SecureBoostParams

PARAMS = SecureBoostParams(n_trees=4, max_depth=3, max_bin=16, sketch_bins=256, learning_rate=0.3)
FAST = dict(kind="secagg", deadline=10.0, stage_timeout=2.0)


def _shards(objective: str, n: int):
    if objective == "multiclass":
        X, y = load_iris(return_X_y=True)
    else:
        X, y = make_classification(800, 6, n_informative=4, random_state=5)
    idx = np.random.default_rng(2).permutation(len(y))
    return [(X[i], y[i]) for i in np.array_split(idx, n)]


@pytest.mark.parametrize("objective,tree,stage", [("binary", 2, "histograms"), ("multiclass", 4, "histograms"),
                                                  ("binary", 1, "validation")])
def test_vanished_client_is_dropped_and_the_model_equals_the_two_phase_twin(objective, tree, stage):
    params = PARAMS if objective == "binary" else PARAMS.model_copy(
        update={"objective": "multiclass", "n_classes": 3, "n_trees": 3})
    shards = _shards(objective, 4)
    run = horizontal_run(shards, params, vanish={2: (tree, stage)}, **FAST)
    assert set(run["errors"]) == {"client-2"}, run["errors"]          # only the victim failed
    server, model = run["server"], run["server_model"]
    assert server.active == ["client-0", "client-1", "client-3"]
    first_round = tree // params.trees_per_round                       # the round the drop happened in
    where = f"tree {tree}" if stage == "histograms" else f"validation loss of round {first_round}"
    assert list(server.dropped) == ["client-2"] and where in server.dropped["client-2"], server.dropped
    want = two_phase_twin(shards, [0, 1, 3], first_round, params)
    assert len(model.trees) == params.n_trees * params.trees_per_round
    for got, cuts in zip(model.cuts, want.cuts, strict=True):
        np.testing.assert_array_equal(got, cuts)
    np.testing.assert_allclose(model.base_margin, want.base, rtol=1e-12, atol=0)
    fed = [(t.output, horizontal_nodes(t)) for t in model.trees]
    assert_trees_equal_twin(fed, want)
    # the trees after the drop differ from the all-rows twin (the survivors' rows alone were used)
    X = np.concatenate([s[0] for s in shards])
    y = np.concatenate([s[1] for s in shards])
    full = twin.fit(X, y, pooled_grid_cuts(X, params), twin.Config.of(params))
    splits = lambda nodes: sorted((nid, n) for nid, n in nodes.items() if n[0] == "split")  # noqa: E731
    assert [splits(t.nodes) for t in full.trees] != [splits(n) for _, n in fed]
    for i in (0, 1, 3):   # every survivor ends with the server's model
        cm = run["client_models"][i]
        assert [t.structure() for t in cm.trees] == [t.structure() for t in model.trees]
        np.testing.assert_array_equal(cm.predict(X), model.predict(X))


def test_drop_leaving_fewer_than_t_stops_the_job_naming_the_client():
    shards = _shards("binary", 3)
    run = horizontal_run(shards, PARAMS, threshold=3, vanish={1: (1, "histograms")}, **FAST)
    err = run["errors"].get("server")
    assert isinstance(err, HorizontalSecureBoostError), run["errors"]
    assert "client-1" in str(err) and "tree 1" in str(err), err
    assert {"client-0", "client-2"} <= set(run["errors"])    # told by the server, they stopped too
    assert run["server_model"] is None


@pytest.mark.parametrize("threshold", [2, 0.5, 1])
def test_threshold_of_at_most_half_the_clients_is_refused(threshold):
    ids = [f"client-{i}" for i in range(4)]
    net = InProcessNetwork("hsb-t", ["server", *ids], deadline=1.0)
    X, y = _shards("binary", 4)[0]
    # refused by the config itself (1, 0.5: t > n/2), or for n=4 with one tolerated colluder (2: 1 < 2t − 4)
    why = r"t > n/2|threshold must be >= 2|it must be in \[3, 4\]"
    with pytest.raises(ValueError, match=why):
        HorizontalSecureBoostServer(net.transport("server"), ids, PARAMS,
                                    aggregation=tree_aggregation_config("secagg", threshold=threshold))
    with pytest.raises(ValueError, match=why):
        HorizontalSecureBoostClient(net.transport("client-0"), "server", ids, X, y, PARAMS,
                                    aggregation=tree_aggregation_config("secagg", threshold=threshold))


@pytest.mark.parametrize("threshold,ok", [(2, False), (0.5, False), (3, True), (None, True)])
def test_job_params_threshold_is_checked_against_the_clients(tmp_path, threshold, ok):
    import yaml

    from secureflhv.runtime.job.load import JobConfigError, load_job_params

    parties = [{"id": "server", "role": "server", "address": "127.0.0.1:5100", "cert": "c", "key": "k"}]
    parties += [{"id": f"c{i}", "role": "host", "address": f"127.0.0.1:{5101 + i}", "cert": "c", "key": "k",
                 "data": {"path": f"c{i}.csv", "label_column": "y"}} for i in range(4)]
    params = {"n_trees": 2} if threshold is None else {"n_trees": 2, "threshold": threshold}
    doc = {"job": {"id": "j", "algorithm": "secureboost_horizontal"}, "security": {"ca": "ca.pem"},
           "parties": parties, "params": params}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    if ok:
        assert load_job_params(path)[1].threshold == threshold
    else:
        with pytest.raises(JobConfigError, match=r"params\.threshold: .*(t > n/2|must be in \[3, 4\])"):
            load_job_params(path)
