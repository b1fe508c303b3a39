"""Horizontal SecureBoost with t-of-n secure aggregation: a client that vanishes mid-training is dropped
and the boosting round it was lost in is rebuilt by the others. The model must EQUAL an independent
computation: the centralised twin on every client's rows for the rounds before the drop, continued
(same margins) on the survivors' rows only for the rounds from the drop on. A drop leaving fewer than
t clients stops the job naming the client; a threshold t <= n/2 is refused."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_iris, make_classification

from sb_harness import horizontal_run, two_phase_reference
from secureflhv.transport import InProcessNetwork
from secureflhv.tree.horizontal import (HorizontalSecureBoostClient, HorizontalSecureBoostError,
                                        HorizontalSecureBoostServer, tree_aggregation_config)
from secureflhv.tree.params import SecureBoostParams
from secureflhv.tree.reference import fit_reference

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
    want = two_phase_reference(shards, [0, 1, 3], first_round, model, params)
    assert len(model.trees) == len(want) == params.n_trees * params.trees_per_round
    for i, (tf, tr) in enumerate(zip(model.trees, want)):
        assert tf.structure() == tr.structure(), f"tree {i}"
        assert tf.output == tr.output
        for nid, n in tr.nodes.items():
            if n.leaf:
                assert tf.nodes[nid].value == pytest.approx(n.value, rel=1e-6, abs=1e-12)
            else:
                assert tf.nodes[nid].threshold == n.threshold
    # the trees after the drop differ from the all-rows twin (the survivors' rows alone were used)
    X = np.concatenate([s[0] for s in shards])
    y = np.concatenate([s[1] for s in shards])
    full = fit_reference(X, y, model.cuts, params, base=model.base_margin)
    assert [t.structure() for t in full.trees] != [t.structure() for t in model.trees]
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
