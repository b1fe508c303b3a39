"""The centralised twin: plaintext histogram GBDT on pooled data, written straightforwardly.

It is the yardstick of the invariance tests (Zhu et al., "Federated learning on non-IID data: a
survey", sec. 4.1.2 / 4.2.2: histogram trees do not depend on who holds which rows or columns), so it
shares no code path with the federated roles: it loops over nodes and features with ``np.bincount``.
It uses the same objectives, fixed-point grid of g and h (:mod:`secureflhv.tree.params`), candidate
rule and tie-break as the federated protocols document:

* missing values (NaN) as XGBoost's sparsity-aware algorithm (Chen & Guestrin 2016, Alg. 3): for each
  feature both default directions are tried explicitly — missing rows right (``default_left`` false)
  with value bins b = 0 .. k going left, then missing rows left (``default_left`` true) with value
  bins b = -1 .. k (b = -1: only the missing rows left). Without missing rows in a node the second
  enumeration repeats partitions of the first, so (ties going to the first) it never wins, as in
  XGBoost where it is not run at all;
* candidates of a node: (feature j, default_left d, value bin b) with at least one of the node's rows
  in the last left bin (value bin b, or for b = -1 the missing rows) and at least one row right of
  the split (so no two candidates of one enumeration induce the same partition);
* the best candidate is the first maximum in the order (feature, d = false before true, b), features
  in the global column order (vertical: guest columns, then host 1, host 2, ...);
* a node splits when gain - gamma > 0 and both children have hessian sum >= min_child_weight;
* validation loss per round; with ``early_stopping_rounds`` the model keeps the rounds up to the best.
"""
from __future__ import annotations

import numpy as np

from .binning import apply_bins, missing_bin, threshold_of
from .model import BoostedModel, Node, Tree
from .params import (SecureBoostParams, base_margin, bound_log2, check_labels, dequantise, gradients, loss,
                     precision_bits_for, quantise)


def build_tree(bins: np.ndarray, gq: np.ndarray, hq: np.ndarray, p: int, params: SecureBoostParams,
               n_bins: list[int], cuts: list[np.ndarray] | None = None) -> Tree:
    """One depth-wise tree from quantised g, h (int64 (n,)) at fraction bits p."""
    lam, lr = params.reg_lambda, params.learning_rate
    tree = Tree()
    missing = missing_bin(bins.dtype)
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
                    for dl, b, gain in _feature_gains(bins[rows, j], gq[rows], hq[rows], p, G, H, params,
                                                      n_bins[j]):
                        if gain > best_gain:
                            best_gain, best = gain, (j, b, dl)
            if best is not None and best_gain - params.gamma > 0:
                j, b, dl = best
                node.leaf, node.feature, node.bin, node.gain, node.default_left = False, j, b, best_gain, dl
                if cuts is not None:
                    node.threshold = threshold_of(cuts[j], b)
                col = bins[rows, j]
                left = np.where(col == missing, dl, col.astype(np.int64) <= b)
                next_level[node.left], next_level[node.right] = rows[left], rows[~left]
            else:
                node.value = -lr * G / (H + lam)
        level = next_level
        if not level:
            break
    return tree


def _feature_gains(col, gq, hq, p, G, H, params, nb):
    """Best candidate of one feature at one node per default direction: [(default_left, bin, gain)].

    col: the node's bins of the feature (missing = the dtype's missing bin); nb value bins.
    """
    lam, mcw = params.reg_lambda, params.min_child_weight
    miss = col == missing_bin(col.dtype)
    v = col[~miss].astype(np.int64)
    cnt = np.bincount(v, minlength=nb)
    cum_c = np.cumsum(cnt)
    cum_g = np.cumsum(np.bincount(v, weights=gq[~miss].astype(np.float64), minlength=nb))
    cum_h = np.cumsum(np.bincount(v, weights=hq[~miss].astype(np.float64), minlength=nb))
    m_c, m_g, m_h = int(miss.sum()), float(gq[miss].sum()), float(hq[miss].sum())
    out = []
    for dl in (False, True):
        if not dl:   # missing right: left = value bins 0..b, b = 0..nb-1
            bs, has, left_c, gl, hl = np.arange(nb), cnt > 0, cum_c, cum_g, cum_h
        else:        # missing left: left = missing + value bins 0..b, b = -1..nb-1
            bs = np.arange(-1, nb)
            has = np.concatenate([[m_c > 0], cnt > 0])
            left_c = m_c + np.concatenate([[0], cum_c])
            gl, hl = m_g + np.concatenate([[0.0], cum_g]), m_h + np.concatenate([[0.0], cum_h])
        GL, HL = dequantise(gl, p), dequantise(hl, p)
        GR, HR = G - GL, H - HL
        gain = 0.5 * (GL * GL / (HL + lam) + GR * GR / (HR + lam) - G * G / (H + lam))
        ok = has & (left_c < len(col)) & (HL >= mcw) & (HR >= mcw)
        if ok.any():
            gain = np.where(ok, gain, -np.inf)
            i = int(np.argmax(gain))
            out.append((dl, int(bs[i]), float(gain[i])))
    return out


def fit_reference(X, y, cuts: list[np.ndarray], params: SecureBoostParams, *, X_val=None, y_val=None,
                  base: np.ndarray | None = None, init_margin: np.ndarray | None = None,
                  precision_rows: int | None = None) -> BoostedModel:
    """Train the centralised histogram GBDT.

    Args:
        X: float (n, d) pooled features (vertical: guest columns then each host's, in host order);
            NaN = missing (infinities raise ValueError).
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
    bins = apply_bins(X, cuts, allow_nan=True)
    n_bins = [len(c) + 1 for c in cuts]
    bm = base_margin(y, params) if base is None else np.asarray(base, dtype=np.float64)
    model = BoostedModel(params, bm, [], [np.asarray(c) for c in cuts])
    margin = (np.tile(bm, (len(y), 1)).astype(np.float64) if init_margin is None
              else np.array(init_margin, dtype=np.float64).reshape(len(y), len(bm)))
    n_p = len(y) if precision_rows is None else int(precision_rows)
    val = X_val is not None
    if val:
        y_val = check_labels(y_val, params)
        vbins = apply_bins(X_val, cuts, allow_nan=True)
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
            if vl < best - params.min_delta:
                best, since, model.best_round = vl, 0, r
            else:
                since += 1
            if params.early_stopping_rounds and since >= params.early_stopping_rounds:
                model.trees = model.trees[:(model.best_round + 1) * params.trees_per_round]
                break
    return model
