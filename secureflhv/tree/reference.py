"""The centralised twin: plaintext histogram GBDT on pooled data, written straightforwardly.

It is the yardstick of the invariance tests (Zhu et al., "Federated learning on non-IID data: a
survey", sec. 4.1.2 / 4.2.2: histogram trees do not depend on who holds which rows or columns), so it
shares no code path with the federated roles: it loops over nodes and features with ``np.bincount``.
It uses the same objectives, fixed-point grid of g and h (:mod:`secureflhv.tree.params`), candidate
rule and tie-break as the federated protocols document:

* candidates of a node: feature j, bin b with at least one of the node's rows in bin b and at least
  one row right of it (so no two candidates of one feature induce the same partition);
* the best candidate is the first maximum in the order (feature, bin), features in the global
  column order (vertical: guest columns, then host 1, host 2, ...);
* a node splits when gain - gamma > 0 and both children have hessian sum >= min_child_weight;
* validation loss per round; with ``early_stopping_rounds`` the model keeps the rounds up to the best.
"""
from __future__ import annotations

import numpy as np

from .binning import apply_bins
from .model import BoostedModel, Node, Tree
from .params import (SecureBoostParams, base_margin, bound_log2, check_labels, dequantise, gradients, loss,
                     precision_bits_for, quantise)


def build_tree(bins: np.ndarray, gq: np.ndarray, hq: np.ndarray, p: int, params: SecureBoostParams,
               n_bins: list[int], cuts: list[np.ndarray] | None = None) -> Tree:
    """One depth-wise tree from quantised g, h (int64 (n,)) at fraction bits p."""
    lam, lr, mcw = params.reg_lambda, params.learning_rate, params.min_child_weight
    tree = Tree()
    level = {0: np.arange(bins.shape[0])}
    for depth in range(params.max_depth + 1):
        next_level = {}
        for nid in sorted(level):
            rows = level[nid]
            G = float(dequantise(gq[rows].sum(), p))
            H = float(dequantise(hq[rows].sum(), p))
            node = Node(nid, sum_hess=H, n_rows=len(rows))
            tree.nodes[nid] = node
            best_gain, best = -np.inf, None
            if depth < params.max_depth and len(rows) >= 2:
                for j in range(bins.shape[1]):
                    b_j = bins[rows, j]
                    cnt = np.bincount(b_j, minlength=n_bins[j])
                    hg = np.bincount(b_j, weights=gq[rows].astype(np.float64), minlength=n_bins[j])
                    hh = np.bincount(b_j, weights=hq[rows].astype(np.float64), minlength=n_bins[j])
                    cum_c = np.cumsum(cnt)[:-1]
                    GL = dequantise(np.cumsum(hg)[:-1], p)
                    HL = dequantise(np.cumsum(hh)[:-1], p)
                    GR, HR = G - GL, H - HL
                    gain = 0.5 * (GL * GL / (HL + lam) + GR * GR / (HR + lam) - G * G / (H + lam))
                    ok = (cnt[:-1] > 0) & (cum_c < len(rows)) & (HL >= mcw) & (HR >= mcw)
                    if not ok.any():
                        continue
                    gain = np.where(ok, gain, -np.inf)
                    b = int(np.argmax(gain))
                    if gain[b] > best_gain:
                        best_gain, best = float(gain[b]), (j, b)
            if best is not None and best_gain - params.gamma > 0:
                j, b = best
                node.leaf, node.feature, node.bin, node.gain = False, j, b, best_gain
                if cuts is not None:
                    node.threshold = float(cuts[j][b])
                left = bins[rows, j] <= b
                next_level[node.left], next_level[node.right] = rows[left], rows[~left]
            else:
                node.value = -lr * G / (H + lam)
        level = next_level
        if not level:
            break
    return tree


def fit_reference(X, y, cuts: list[np.ndarray], params: SecureBoostParams, *, X_val=None, y_val=None,
                  base: np.ndarray | None = None, init_margin: np.ndarray | None = None,
                  precision_rows: int | None = None) -> BoostedModel:
    """Train the centralised histogram GBDT.

    Args:
        X: float (n, d) pooled features (vertical: guest columns then each host's, in host order).
        y: labels (n,). cuts: per feature (:mod:`secureflhv.tree.binning`).
        X_val, y_val: optional validation set (losses recorded; early stopping if configured).
        base: initial margin (default: :func:`secureflhv.tree.params.base_margin` of y).
        init_margin: float (n, outputs) margins of the rows before the first tree (default: ``base``
            for every row): continues a boosting run, e.g. on the survivors' rows after a horizontal
            client dropped out (the model's ``base_margin`` stays ``base``; no validation then).
        precision_rows: the row count the fixed-point precision p is sized for (default n; horizontal
            SecureBoost keeps the binning's row count after a dropout).
    Returns: a :class:`BoostedModel` with ``cuts`` set.
    """
    y = check_labels(y, params)
    bins = apply_bins(X, cuts)
    n_bins = [len(c) + 1 for c in cuts]
    bm = base_margin(y, params) if base is None else np.asarray(base, dtype=np.float64)
    model = BoostedModel(params, bm, [], [np.asarray(c) for c in cuts])
    margin = (np.tile(bm, (len(y), 1)).astype(np.float64) if init_margin is None
              else np.array(init_margin, dtype=np.float64).reshape(len(y), len(bm)))
    n_p = len(y) if precision_rows is None else int(precision_rows)
    val = X_val is not None
    if val:
        y_val = check_labels(y_val, params)
        vbins = apply_bins(X_val, cuts)
        vmargin = np.tile(bm, (len(y_val), 1)).astype(np.float64)
    best, since = np.inf, 0
    for r in range(params.n_trees):
        g, h = gradients(margin, y, params)
        for k in range(params.trees_per_round):
            p = precision_bits_for(n_p, bound_log2(g[:, k], h[:, k]))
            tree = build_tree(bins, quantise(g[:, k], p), quantise(h[:, k], p), p, params, n_bins, cuts)
            tree.output = k
            model.trees.append(tree)
            margin[:, k] += tree.predict_bins(bins)
            if val:
                vmargin[:, k] += tree.predict_bins(vbins)
        if val:
            vl = loss(vmargin, y_val, params)
            model.val_losses.append(vl)
            if vl < best:
                best, since, model.best_round = vl, 0, r
            else:
                since += 1
            if params.early_stopping_rounds and since >= params.early_stopping_rounds:
                model.trees = model.trees[:(model.best_round + 1) * params.trees_per_round]
                break
    return model
