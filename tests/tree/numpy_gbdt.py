"""An independent centralised twin of SecureBoost: histogram gradient boosting in plain numpy.

Written for the tests from the documented rules (docs/secureboost.md; Chen & Guestrin, KDD 2016), sharing
no code with :mod:`secureflhv.tree` (no binning, gradient, split or model code of the library):

* cuts, computed here from the pooled rows:

  - :func:`quantile_cuts` (vertical: each party's exact quantiles): the present values in float32,
    sorted; with at most ``max_bin`` distinct values every distinct value but the smallest is a cut;
    else the values at the sorted positions floor(k n / max_bin), k = 1 .. max_bin - 1, without
    repeats and without the smallest value;
  - :func:`grid_cuts` (horizontal): ``cells`` equal cells over the pooled [min, max] (boundaries
    float32(lo + (hi - lo) i / cells)); a value's cell is the number of boundaries <= it; cut k is the
    upper boundary of the first cell where the cumulative count reaches k N / max_bin (N present values);
    with at most ``max_bin`` non-empty cells, the upper boundary of every non-empty cell but the last;
    never a boundary at or after the last non-empty cell.

* a feature with cuts c_0 < ... < c_{k-1} has value bins 0..k (bin = number of cuts <= x, float32);
  a split (feature, bin b, default_left) sends a present value left when its bin <= b (x < c_b), a
  missing one (NaN) by default_left;
* base margin from the labels: logit of the mean (clipped to [1e-6, 1 - 1e-6]) for binary, the mean
  for regression, zeros for multiclass;
* g, h of binary:logistic, multi:softprob (h = 2 p (1 - p), XGBoost's factor) and reg:squarederror,
  in float64 (no fixed-point grid);
* depth-wise growth to ``max_depth``; per node and feature the histogram of g, h and counts per bin
  (missing rows in their own bucket); candidates in the order (feature, missing right before missing
  left, bin) — missing right: value bins 0..b left; missing left: the missing rows and value bins
  0..b left, b = -1 .. k; a candidate needs rows on both sides and H_L, H_R >= min_child_weight;
  gain = 1/2 [G_L^2/(H_L+l) + G_R^2/(H_R+l) - G^2/(H+l)]; split when the best gain - gamma > 0;
  leaf weight -eta G / (H + l);
* tie-break: the first candidate in that order whose gain is the maximum up to float64 rounding
  (1e-9 relative to the larger of the gain and the node's G^2/(H+l)): the federated roles sum integers exactly, so candidates with the same rows on the
  left (or the same sums) tie exactly there, while float sums of the same rows in another order may
  differ in the last bits here. Gains closer than that but not equal would be a real near-tie that the
  federation's fixed-point gradients (2^-24) may order differently: the tests pick data without them.
* validation loss per round (logloss, multiclass logloss, RMSE); early stopping after
  ``early_stopping_rounds`` rounds without a decrease of more than ``min_delta``; the model keeps the
  rounds up to the best.

Vectorised: one ``np.bincount`` per level builds every node's histograms of every feature.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TIE_RTOL = 1e-9


# ------------------------------------------------------------------------------------------ cuts
def quantile_cuts(x, max_bin: int) -> np.ndarray:
    """Exact-quantile cuts of one column (float64 holding float32 values)."""
    v = np.asarray(x, dtype=np.float64).astype(np.float32)
    v = np.sort(v[~np.isnan(v)])
    if v.size == 0:
        return np.zeros(0)
    distinct = sorted(set(v.tolist()))
    if len(distinct) <= max_bin:
        return np.array(distinct[1:], dtype=np.float64)
    picked = {float(v[(k * v.size) // max_bin]) for k in range(1, max_bin)}
    return np.array(sorted(c for c in picked if c > v[0]), dtype=np.float64)


def grid_cuts(x, lo: float, hi: float, cells: int, max_bin: int) -> np.ndarray:
    """Horizontal cuts of one pooled column on ``cells`` equal cells over [lo, hi]."""
    i = np.arange(1, cells, dtype=np.float64)
    bounds = np.array(sorted(set((lo + (hi - lo) * i / cells).astype(np.float32).tolist())), dtype=np.float32)
    v = np.asarray(x, dtype=np.float64).astype(np.float32)
    v = v[~np.isnan(v)]
    cell = (v[:, None] >= bounds[None, :]).sum(axis=1)
    counts = np.bincount(cell, minlength=bounds.size + 1)
    filled = np.nonzero(counts)[0]
    if v.size == 0 or filled.size <= 1:
        return np.zeros(0)
    if filled.size <= max_bin:
        chosen = filled[:-1]
    else:
        running = np.cumsum(counts)
        chosen = [int(np.nonzero(running >= k * v.size / max_bin)[0][0]) for k in range(1, max_bin)]
        chosen = [c for c in chosen if c < filled[-1]]
    return np.array(sorted(set(bounds[chosen].tolist())), dtype=np.float64)


def bin_matrix(X, cuts) -> tuple[np.ndarray, np.ndarray]:
    """(bins int64 (n, d): number of cuts <= x in float32, missing mask (n, d))."""
    X32 = np.asarray(X, dtype=np.float64).astype(np.float32)
    miss = np.isnan(X32)
    bins = np.zeros(X32.shape, dtype=np.int64)
    for j, c in enumerate(cuts):
        c32 = np.asarray(c, dtype=np.float32)
        bins[:, j] = (X32[:, j, None] >= c32[None, :]).sum(axis=1)
    return bins, miss


def threshold(cuts, b: int) -> float:
    """The threshold of "value bin <= b": cuts[b], +inf for b = len(cuts), -inf for b = -1."""
    if b == -1:
        return float("-inf")
    return float("inf") if b == len(cuts) else float(cuts[b])


# ------------------------------------------------------------------------------------ objectives
@dataclass(frozen=True)
class Config:
    """The hyperparameters the twin uses (XGBoost's names)."""

    objective: str = "binary"
    n_classes: int = 2
    n_trees: int = 3
    max_depth: int = 3
    learning_rate: float = 0.3
    reg_lambda: float = 1.0
    gamma: float = 0.0
    min_child_weight: float = 1.0
    early_stopping_rounds: int | None = None
    min_delta: float = 0.0

    @classmethod
    def of(cls, params) -> "Config":
        """The twin's settings from any object with these attribute names (e.g. SecureBoostParams)."""
        return cls(**{k: getattr(params, k) for k in cls.__dataclass_fields__})

    @property
    def outputs(self) -> int:
        return self.n_classes if self.objective == "multiclass" else 1


def base_margin(y, cfg: Config) -> np.ndarray:
    """The initial margin from the labels."""
    if cfg.objective == "multiclass":
        return np.zeros(cfg.n_classes)
    mean = float(np.mean(np.asarray(y, dtype=np.float64)))
    if cfg.objective == "regression":
        return np.array([mean])
    p = float(np.clip(mean, 1e-6, 1 - 1e-6))
    return np.array([np.log(p) - np.log1p(-p)])


def _probs(margin: np.ndarray) -> np.ndarray:
    e = np.exp(margin - margin.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def grad_hess(margin: np.ndarray, y: np.ndarray, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """g, h (n, outputs) at the margins (n, outputs)."""
    if cfg.objective == "regression":
        return margin - y[:, None], np.ones_like(margin)
    if cfg.objective == "binary":
        p = 1.0 / (1.0 + np.exp(-margin))
        return p - y[:, None], np.maximum(p * (1.0 - p), 1e-16)
    p = _probs(margin)
    target = (y[:, None] == np.arange(cfg.n_classes)[None, :]).astype(np.float64)
    return p - target, np.maximum(2.0 * p * (1.0 - p), 1e-16)


def val_loss(margin: np.ndarray, y: np.ndarray, cfg: Config) -> float:
    """Logloss / multiclass logloss / RMSE."""
    if cfg.objective == "regression":
        return float(np.sqrt(np.mean((margin[:, 0] - y) ** 2)))
    if cfg.objective == "binary":
        p = np.clip(1.0 / (1.0 + np.exp(-margin[:, 0])), 1e-15, 1 - 1e-15)
        return float(-np.mean(np.where(y == 1, np.log(p), np.log(1 - p))))
    p = np.clip(_probs(margin), 1e-15, 1.0)
    return float(-np.mean(np.log(p[np.arange(len(y)), y.astype(np.int64)])))


# ------------------------------------------------------------------------------------------ trees
@dataclass
class TwinTree:
    """Heap-ordered nodes: id -> ("leaf", value) or ("split", feature, bin, threshold, default_left)."""

    nodes: dict = field(default_factory=dict)
    output: int = 0
    rows: dict = field(default_factory=dict)    # id -> number of training rows at the node

    def leaf_of(self, X) -> np.ndarray:
        """The leaf id of every row of X (raw values; float32 comparison, NaN by default_left)."""
        X32 = np.asarray(X, dtype=np.float64).astype(np.float32)
        at = np.zeros(len(X32), dtype=np.int64)
        splits = {i for i, n in self.nodes.items() if n[0] == "split"}
        for _ in range(64):
            moving = np.isin(at, list(splits))
            if not moving.any():
                return at
            for nid in np.unique(at[moving]):
                _, j, _, thr, dl = self.nodes[nid]
                here = at == nid
                x = X32[here, j]
                with np.errstate(invalid="ignore"):
                    left = np.where(np.isnan(x), dl, x < np.float32(thr))
                at[here] = np.where(left, 2 * nid + 1, 2 * nid + 2)
        raise AssertionError("tree deeper than 64")

    def predict(self, X) -> np.ndarray:
        """Leaf values of the rows of X."""
        return np.array([self.nodes[i][1] for i in self.leaf_of(X)], dtype=np.float64)


def _gains(hist: np.ndarray, nb: np.ndarray, cfg: Config) -> tuple[np.ndarray, tuple]:
    """Gains (d, 2, K + 1) of every candidate of one node from its histograms (3, d, K + 1): g, h, count
    per value bin 0..K-1 and the missing bucket at K. Axis 1: missing right / left; axis 2: b + 1."""
    lam, mcw = cfg.reg_lambda, cfg.min_child_weight
    d, K = hist.shape[1], hist.shape[2] - 1
    val, miss = hist[:, :, :K], hist[:, :, K]
    cum = np.concatenate([np.zeros((3, d, 1)), np.cumsum(val, axis=2)], axis=2)   # [.., b + 1]: bins <= b
    left = np.stack([cum, cum + miss[:, :, None]], axis=2)                         # (3, d, 2, K + 1)
    G, H, N = hist[0, 0].sum(), hist[1, 0].sum(), hist[2, 0].sum()
    GL, HL, NL = left
    GR, HR, NR = G - GL, H - HL, N - NL
    b = np.arange(-1, K)[None, None, :]
    ok = (NL > 0) & (NR > 0) & (HL >= mcw) & (HR >= mcw) & (b <= nb[:, None, None] - 1)
    ok[:, 0, 0] = False                                        # missing right needs b >= 0
    gain = 0.5 * (GL * GL / (HL + lam) + GR * GR / (HR + lam) - G * G / (H + lam))
    return np.where(ok, gain, -np.inf), (G, H)


def _best(gain: np.ndarray, scale: float):
    """(feature, default_left, bin, gain) of the first maximum up to rounding, or None. ``scale``: the size
    of the terms the gains are differences of (rounding is relative to it, not to a small gain)."""
    flat = gain.ravel()
    top = flat.max()
    if not np.isfinite(top):
        return None
    i = int(np.nonzero(flat >= top - TIE_RTOL * max(abs(top), scale, 1e-300))[0][0])
    j, dl, b1 = np.unravel_index(i, gain.shape)
    return int(j), bool(dl), int(b1) - 1, float(flat[i])


def grow_tree(bins, miss, g, h, cuts, cfg: Config) -> tuple[TwinTree, np.ndarray]:
    """One depth-wise tree; returns it and every row's leaf value."""
    n, d = bins.shape
    nb = np.array([len(c) + 1 for c in cuts])
    K = int(nb.max())
    slot = np.where(miss, K, bins)                                  # missing rows: bucket K
    tree, node = TwinTree(), np.zeros(n, dtype=np.int64)
    values = np.zeros(n)
    frontier = [0]
    for depth in range(cfg.max_depth + 1):
        if not frontier:
            break
        local = np.full(2 ** (depth + 1), -1, dtype=np.int64)
        local[frontier] = np.arange(len(frontier))
        pos = local[node]
        rows = pos >= 0
        key = ((pos[rows, None] * d + np.arange(d)[None, :]) * (K + 1) + slot[rows]).ravel()
        size = len(frontier) * d * (K + 1)
        hist = np.stack([np.bincount(key, weights=np.repeat(w[rows], d), minlength=size)
                         for w in (g, h, np.ones(n))]).reshape(3, len(frontier), d, K + 1)
        nxt = []
        for nid in frontier:
            gain, (G, H) = _gains(hist[:, local[nid]], nb, cfg)
            best = _best(gain, G * G / (H + cfg.reg_lambda)) if depth < cfg.max_depth else None
            here = node == nid
            tree.rows[nid] = int(here.sum())
            if best is None or best[3] - cfg.gamma <= 0:
                tree.nodes[nid] = ("leaf", -cfg.learning_rate * G / (H + cfg.reg_lambda))
                values[here] = tree.nodes[nid][1]
                continue
            j, dl, b, _ = best
            tree.nodes[nid] = ("split", j, b, threshold(cuts[j], b), dl)
            go_left = np.where(miss[:, j], dl, bins[:, j] <= b)
            node[here & go_left], node[here & ~go_left] = 2 * nid + 1, 2 * nid + 2
            nxt += [2 * nid + 1, 2 * nid + 2]
        frontier = nxt
    return tree, values


@dataclass
class TwinModel:
    """The trained twin: cuts, base margin, trees (round r, class k at r * outputs + k), losses."""

    cfg: Config
    cuts: list
    base: np.ndarray
    trees: list = field(default_factory=list)
    val_losses: list = field(default_factory=list)
    best_round: int | None = None

    def predict_margin(self, X) -> np.ndarray:
        """Margins (n, outputs) of raw rows X."""
        m = np.tile(self.base, (len(X), 1)).astype(np.float64)
        for t in self.trees:
            m[:, t.output] += t.predict(X)
        return m


def fit(X, y, cuts, cfg: Config, *, X_val=None, y_val=None, init_margin=None, base=None) -> TwinModel:
    """Train the twin on pooled rows X (n, d) with the given cuts (from :func:`quantile_cuts` or
    :func:`grid_cuts`). ``init_margin``: margins (n, outputs) to continue boosting from (default: the
    base margin); ``base``: the model's base margin (default: from y)."""
    y = np.asarray(y, dtype=np.float64)
    bins, miss = bin_matrix(X, cuts)
    model = TwinModel(cfg, [np.asarray(c) for c in cuts], base_margin(y, cfg) if base is None else np.asarray(base))
    margin = (np.tile(model.base, (len(y), 1)) if init_margin is None
              else np.array(init_margin, dtype=np.float64).reshape(len(y), cfg.outputs))
    vmargin = None if X_val is None else np.tile(model.base, (len(X_val), 1))
    best, since = np.inf, 0
    for r in range(cfg.n_trees):
        g, h = grad_hess(margin, y, cfg)
        for k in range(cfg.outputs):
            tree, values = grow_tree(bins, miss, g[:, k], h[:, k], model.cuts, cfg)
            tree.output = k
            model.trees.append(tree)
            margin[:, k] += values
            if vmargin is not None:
                vmargin[:, k] += tree.predict(X_val)
        if vmargin is None:
            continue
        loss = val_loss(vmargin, np.asarray(y_val, dtype=np.float64), cfg)
        model.val_losses.append(loss)
        if loss < best - cfg.min_delta:
            best, since, model.best_round = loss, 0, r
        else:
            since += 1
        if cfg.early_stopping_rounds and since >= cfg.early_stopping_rounds:
            model.trees = model.trees[:(model.best_round + 1) * cfg.outputs]
            break
    return model
