"""Export a model whose splits are all known (horizontal SecureBoost, or the centralised twin) to
XGBoost's JSON model format, so ``xgboost.Booster(model_file=...)`` (or ``load_model``) can serve it.

Format: XGBoost's JSON schema (``doc/model.schema`` of xgboost >= 2; checked against xgboost 3.2):
``learner.gradient_booster.model.trees[i]`` holds arrays indexed by a node id 0..N-1 in breadth-first
order: ``left_children``/``right_children`` (-1 for leaves), ``parents`` (root: 2147483647),
``split_indices`` (feature), ``split_conditions`` (threshold; leaf value for leaves, learning rate
included), ``default_left`` (1: a missing value goes left; our splits' default directions, learnt as
XGBoost's sparsity-aware algorithm does), ``base_weights``, ``loss_changes``, ``sum_hessian``. A row
goes left when ``x < split_condition``, the rule of :mod:`secureflhv.tree.binning` (float32
comparisons on both sides), and a NaN goes the default way, so the exported model predicts as ours on
data with missing values. The threshold -inf of a split "only missing values left" is written as
-FLT_MAX (exact: no float32 is below it); +inf ("every present value left") as FLT_MAX, which differs
from ours only for a value equal to FLT_MAX. ``base_score`` is the base margin
mapped through the objective's link (binary: sigmoid; regression/multiclass: identity).

A vertical model cannot be exported: its host splits are private to the hosts by design.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .model import BoostedModel, Tree

_OBJECTIVES = {
    "binary": {"name": "binary:logistic", "reg_loss_param": {"scale_pos_weight": "1"}},
    "regression": {"name": "reg:squarederror", "reg_loss_param": {"scale_pos_weight": "1"}},
}


_FLT_MAX = float(np.finfo(np.float32).max)


def _f(x: float) -> float:
    return float(np.float32(np.clip(x, -_FLT_MAX, _FLT_MAX)))


def _tree_json(tree: Tree, tid: int, n_features: int) -> dict:
    order, queue = [], [0]
    while queue:                       # breadth-first renumbering: xgboost wants ids 0..N-1
        nid = queue.pop(0)
        order.append(nid)
        node = tree.nodes[nid]
        if not node.leaf:
            queue += [node.left, node.right]
    new = {nid: i for i, nid in enumerate(order)}
    N = len(order)
    left, right, parents = [-1] * N, [-1] * N, [2147483647] * N
    split_idx, cond, base_w, loss_ch, hess = [0] * N, [0.0] * N, [0.0] * N, [0.0] * N, [0.0] * N
    default_left = [0] * N
    for nid in order:
        i, node = new[nid], tree.nodes[nid]
        hess[i] = _f(node.sum_hess)
        if node.leaf:
            cond[i] = base_w[i] = _f(node.value)
        else:
            if node.feature < 0 or math.isnan(node.threshold):
                raise ValueError(f"node {nid} has no (feature, threshold): vertical models cannot be exported")
            left[i], right[i] = new[node.left], new[node.right]
            parents[new[node.left]] = parents[new[node.right]] = i
            split_idx[i], cond[i], loss_ch[i] = int(node.feature), _f(node.threshold), _f(node.gain)
            default_left[i] = int(bool(node.default_left))
    return {"base_weights": base_w, "categories": [], "categories_nodes": [], "categories_segments": [],
            "categories_sizes": [], "default_left": default_left, "id": tid, "left_children": left,
            "loss_changes": loss_ch, "parents": parents, "right_children": right, "split_conditions": cond,
            "split_indices": split_idx, "split_type": [0] * N, "sum_hessian": hess,
            "tree_param": {"num_deleted": "0", "num_feature": str(n_features), "num_nodes": str(N),
                           "size_leaf_vector": "1"}}


def to_xgboost_json(model: BoostedModel, n_features: int | None = None) -> dict:
    """The XGBoost JSON document (a dict) of ``model``; raises ValueError for vertical models."""
    prm = model.params
    d = n_features if n_features is not None else (len(model.cuts) if model.cuts is not None else None)
    if d is None:
        raise ValueError("n_features: unknown (the model has no cuts)")
    K = prm.trees_per_round
    bm = np.asarray(model.base_margin, dtype=np.float64)
    if prm.objective == "binary":
        base = [1.0 / (1.0 + math.exp(-bm[0]))]
        objective = _OBJECTIVES["binary"]
    elif prm.objective == "regression":
        base = [bm[0]]
        objective = _OBJECTIVES["regression"]
    else:
        base = bm.tolist()
        objective = {"name": "multi:softprob", "softmax_multiclass_param": {"num_class": str(prm.n_classes)}}
    n_rounds = len(model.trees) // K
    trees = [_tree_json(t, i, d) for i, t in enumerate(model.trees)]
    return {
        "learner": {
            "attributes": {},
            "feature_names": [],
            "feature_types": [],
            "gradient_booster": {
                "model": {
                    "cats": {"enc": [], "feature_segments": [], "sorted_idx": []},
                    "gbtree_model_param": {"num_parallel_tree": "1", "num_trees": str(len(trees))},
                    "iteration_indptr": [K * r for r in range(n_rounds + 1)],
                    "tree_info": [t.output for t in model.trees],
                    "trees": trees,
                },
                "name": "gbtree",
            },
            "learner_model_param": {"base_score": "[" + ",".join(repr(float(b)) for b in base) + "]",
                                    "boost_from_average": "1",
                                    "num_class": str(prm.n_classes) if prm.objective == "multiclass" else "0",
                                    "num_feature": str(d), "num_target": "1"},
            "objective": objective,
        },
        "version": [3, 2, 0],
    }


def save_xgboost_json(model: BoostedModel, path, n_features: int | None = None) -> Path:
    """Write :func:`to_xgboost_json` to ``path`` (use a ``.json`` suffix so XGBoost reads it as JSON)."""
    path = Path(path)
    path.write_text(json.dumps(to_xgboost_json(model, n_features)), encoding="utf-8")
    return path
