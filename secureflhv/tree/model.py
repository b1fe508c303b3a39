"""Tree and boosted-model containers shared by the centralised twin and the federated roles.

Nodes are numbered heap-style: root 0, children of i are 2i + 1 (left) and 2i + 2 (right).
A split sends a row left when its bin is <= ``bin`` (equivalently ``x < threshold`` in float32); a
missing value (NaN) goes left exactly when the split's ``default_left`` is true (XGBoost's sparsity-aware
default direction, Chen & Guestrin 2016, Alg. 3; see :mod:`secureflhv.tree.binning`). ``bin`` ranges
over -1 (no present value left: threshold -inf) .. len(cuts) (every present value left: +inf).

In a vertical model the guest's copy of a host-owned split has ``owner`` = the host id and
``record`` = the host's private lookup-table id; ``feature``/``bin``/``threshold`` are then unknown
(-1 / NaN) at the guest and live only in that host's table (:attr:`SecureBoostHost.records`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..transport.lifecycle import EarlyStopping
from .params import SecureBoostParams, transform


def sibling(nid: int) -> int:
    """The other child of node ``nid``'s parent (children of k are 2k + 1 and 2k + 2; nid > 0)."""
    return nid + 1 if nid % 2 == 1 else nid - 1


def plan_children(split_now: list[int], n_rows: dict[int, int]) -> list[tuple[int, bool]]:
    """Histogram subtraction plan of one level: (node, derived) in build order.

    Of two siblings the one with fewer rows (then the lower id) is built from its rows; the other, if it
    is to be split, is derived as parent - sibling. A node to split whose smaller sibling is a leaf
    still gets that sibling built (send nothing for it) so that it can be derived (horizontal SecureBoost
    subtracts histograms; the vertical guest needs only the sibling's rows, so its hosts skip it).
    """
    todo = set(split_now)
    direct, derived = set(), set()
    for nid in split_now:
        if nid == 0:
            direct.add(0)
            continue
        sib = sibling(nid)
        small = min((n_rows[nid], nid), (n_rows[sib], sib))[1]
        if nid == small:
            direct.add(nid)
        else:
            derived.add(nid)
            direct.add(sib)
    assert todo <= direct | derived
    return [(n, False) for n in sorted(direct)] + [(n, True) for n in sorted(derived)]


@dataclass
class Node:
    """One node of a tree in heap order (children of node i are 2i + 1 and 2i + 2): a leaf's ``value``, or a
    split on ``feature`` at ``bin`` / ``threshold`` with its default direction for missing values.
    """
    id: int
    leaf: bool = True
    value: float = 0.0            # leaf weight, learning rate included
    feature: int = -1             # feature index (the owner's local index in vertical models)
    bin: int = -1
    threshold: float = math.nan
    default_left: bool = False    # where a missing value goes
    owner: str = ""               # vertical: party holding the split
    record: int = -1              # vertical: host lookup-table id
    gain: float = 0.0
    sum_hess: float = 0.0
    n_rows: int = 0

    @property
    def left(self) -> int:
        """Id of the left child."""
        return 2 * self.id + 1

    @property
    def right(self) -> int:
        """Id of the right child."""
        return 2 * self.id + 2


@dataclass
class Tree:
    """One regression tree; ``output`` is the class it adds to (0 unless multiclass)."""

    nodes: dict[int, Node] = field(default_factory=dict)
    output: int = 0

    def leaves(self) -> list[Node]:
        """The leaf nodes."""
        return [n for n in self.nodes.values() if n.leaf]

    def depth(self) -> int:
        """The depth of the deepest node (root: 0)."""
        return max(int(math.log2(i + 1)) for i in self.nodes)

    def predict_bins(self, bins: np.ndarray) -> np.ndarray:
        """Leaf values (n,) for binned rows (n, d) (features indexed as in this tree; a missing value
        holds :func:`~secureflhv.tree.binning.missing_bin` of the dtype)."""
        from .binning import missing_bin

        missing = bins == missing_bin(bins.dtype)
        bins = bins.astype(np.int64)
        out = np.zeros(bins.shape[0])
        pos = np.zeros(bins.shape[0], dtype=np.int64)
        for _ in range(len(self.nodes)):
            done = True
            for nid in np.unique(pos):
                node = self.nodes[int(nid)]
                if node.leaf:
                    continue
                done = False
                at = pos == nid
                miss = missing[at, node.feature]
                left = np.where(miss, node.default_left, bins[at, node.feature] <= node.bin)
                pos[np.flatnonzero(at)] = np.where(left, node.left, node.right)
            if done:
                break
        for nid in np.unique(pos):
            out[pos == nid] = self.nodes[int(nid)].value
        return out

    def structure(self) -> list[tuple]:
        """Comparable summary: (id, leaf, feature, bin, default_left) per node, sorted by id."""
        return [(n.id, n.leaf, n.feature, n.bin, bool(not n.leaf and n.default_left))
                for _, n in sorted(self.nodes.items())]


@dataclass
class BoostedModel:
    """Base margin plus trees in boosting order (round r, class k at index r * trees_per_round + k)."""

    params: SecureBoostParams
    base_margin: np.ndarray
    trees: list[Tree] = field(default_factory=list)
    cuts: list[np.ndarray] | None = None   # when every feature is known (centralised / horizontal)
    val_losses: list[float] = field(default_factory=list)
    best_round: int | None = None

    def record_validation(self, round_index: int, loss: float) -> bool:
        """Add boosting round ``round_index``'s validation loss (called every round, in order).

        Returns True when early stopping fires (:class:`~secureflhv.transport.lifecycle.EarlyStopping`
        with patience ``params.early_stopping_rounds``
        and ``params.min_delta``, replayed over :attr:`val_losses`): no improvement
        for that many rounds; the trees after the best round are then dropped.
        """
        stopping = EarlyStopping(self.params.early_stopping_rounds, self.params.min_delta, metric="val_loss")
        stop = stopping.replay(self.val_losses).update(loss)
        self.val_losses.append(loss)
        self.best_round = stopping.best_index
        if stop:
            self.trees = self.trees[:(self.best_round + 1) * self.params.trees_per_round]
        return stop

    def predict_margin_bins(self, bins: np.ndarray) -> np.ndarray:
        """Margins float64 (n, outputs) of binned rows ``bins`` (n, d): base margin plus every tree's leaf value."""
        m = np.tile(self.base_margin, (bins.shape[0], 1)).astype(np.float64)
        for t in self.trees:
            m[:, t.output] += t.predict_bins(bins)
        return m

    def predict_margin(self, X) -> np.ndarray:
        """Margins float64 (n, outputs) of raw rows ``X`` (n, d), binned by the model's cuts; ValueError for a
        vertical model (no cuts: its prediction is federated).
        """
        from .binning import apply_bins

        if self.cuts is None:
            raise ValueError("this model has no cuts (vertical model): use the federated prediction")
        return self.predict_margin_bins(apply_bins(X, self.cuts, allow_nan=True))

    def predict(self, X) -> np.ndarray:
        """P(y=1) (n,), class probabilities (n, K) or values (n,); X float (n, d), NaN = missing."""
        return transform(self.predict_margin(X), self.params)


def json_number(v: float) -> float | str:
    """v, or "inf" / "-inf" (strict JSON has no infinities; thresholds of missing-value splits do)."""
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def model_to_dict(model: BoostedModel) -> dict:
    """JSON-friendly form of a model (host splits appear as owner + record id only; infinite
    thresholds as "inf" / "-inf")."""
    return {
        "params": model.params.model_dump(mode="json"),
        "base_margin": [float(v) for v in model.base_margin],
        "cuts": None if model.cuts is None else [[float(v) for v in c] for c in model.cuts],
        "val_losses": list(model.val_losses),
        "best_round": model.best_round,
        "trees": [{"output": t.output,
                   "nodes": [{k: json_number(v) if isinstance(v, float) else v for k, v in vars(n).items()
                              if not (isinstance(v, float) and math.isnan(v))}
                             for _, n in sorted(t.nodes.items())]} for t in model.trees],
    }


_NODE_FIELDS = set(Node.__dataclass_fields__)


def model_from_dict(doc: dict) -> BoostedModel:
    """Inverse of :func:`model_to_dict` (e.g. a saved bundle's ``model.json``); the same predictions.

    Raises ValueError (pydantic's ValidationError for the params) naming a malformed part.
    """
    try:
        params = SecureBoostParams(**doc["params"])
        trees = []
        for ti, t in enumerate(doc["trees"]):
            nodes = {}
            for n in t["nodes"]:
                unknown = set(n) - _NODE_FIELDS
                if unknown:
                    raise ValueError(f"trees[{ti}]: unknown node fields {sorted(unknown)}")
                # infinite thresholds are written as "inf" / "-inf" (json_number)
                nodes[int(n["id"])] = Node(**{k: float(v) if k == "threshold" else v for k, v in n.items()})
            trees.append(Tree(nodes, int(t["output"])))
        cuts = None if doc.get("cuts") is None else [np.asarray(c, dtype=np.float64) for c in doc["cuts"]]
        return BoostedModel(params, np.asarray(doc["base_margin"], dtype=np.float64), trees, cuts,
                            list(doc.get("val_losses") or []), doc.get("best_round"))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a saved SecureBoost model: {exc!r}") from None
