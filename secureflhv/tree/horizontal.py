"""Horizontal SecureBoost: clients hold different rows of the same columns; a data-less server grows trees.

Every sum leaves a client only through the aggregation interface
(:mod:`secureflhv.secagg`; ``secagg`` by default: Bonawitz et al. CCS 2017), so the
server sees sums over all clients, never one client's histogram. The protocol (tags ``hsb.*``)::

    clients -> server  hsb.hello: number of features
    binning            global range per feature: public ``feature_ranges`` given to the server, or each
                       client's min/max (hsb.ranges, revealed to the server); then one aggregation of
                       per-cell counts on a public grid of ``sketch_bins`` equal cells, plus the row
                       count and the label sum -> server: quantile cuts (binning.cuts_from_grid_counts)
                       and the base margin -> hsb.cuts to every client
    per tree           clients: g, h from their labels and margins; hsb.bound: a power-of-two bound of
                       their |g|, |h| (revealed); server: p = precision_bits_for(N, max bound)
      per level        server -> hsb.level: splits of the previous level (feature, bin, threshold),
                       nodes to histogram now (the smaller child of each split; the server derives the
                       sibling as parent - child)
                       clients: integer histograms round(g 2^p), round(h 2^p) and counts per node,
                       feature and bin -> one aggregation; server: gains, best split per node (first
                       maximum in (feature, bin) order), min_child_weight, gamma
      end              hsb.level done: leaf weights; clients update their margins
    validation         optional: per round one aggregation of the clients' validation loss sums;
                       the server stops after ``early_stopping_rounds`` rounds without improvement

Exactness: histogram entries are integers below 2^52 sent as x = m / 2^40 with clip 2^12, scale 2^40
and weight 1 (:func:`tree_aggregation_config`), so the fixed-point quantisation of secure aggregation
is exact (no rounding) and the server's sums equal the centralised histograms bit for bit. Every
client must survive every aggregation (threshold = all clients): a missing client's rows would
change the trees, so a drop-out stops the job with an error naming the client.

What each role learns:

* server: the number of features, each client's per-feature min/max (unless ``feature_ranges`` is
  given), the global per-cell grid counts, the total row count and label sum (binary: positives;
  regression: the sum of labels), each client's power-of-two gradient bound, the global
  per-node histograms of g, h and counts (hence the model), the summed validation loss. Not a
  client's histogram, rows or labels (secure aggregation; plain kinds reveal client inputs).
* client: its own data; the cuts, the model (splits, thresholds, leaf weights) and the base margin;
  from the tree also aggregate information about other clients' data (as any shared model does).

Failures: the server and every client are :class:`~secureflhv.transport.role.ProtocolRole` roles; a
failing server tells every client, a failing client tells the server (every client is needed).
"""
from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..data.dataset import check_matrix
from ..proto import tree_pb2
from ..secagg import AggregationConfig, AggregationError, make_client, make_server
from ..transport import ProtocolError, Transport, TransportError, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto
from ..transport.role import ProtocolRole
from .binning import apply_bins, cuts_from_grid_counts, grid, grid_counts
from .model import BoostedModel, Node, Tree, plan_children
from .params import (SecureBoostParams, base_margin_from_sums, bound_log2, check_labels, dequantise, gradients,
                     loss, precision_bits_for, quantise)

log = logging.getLogger("secureflhv.tree.horizontal")

TAG_HELLO, TAG_RANGES, TAG_CUTS = "hsb.hello", "hsb.ranges", "hsb.cuts"
TAG_TREE, TAG_BOUND, TAG_LEVEL = "hsb.tree", "hsb.bound", "hsb.level"
AGG_SCALE_BITS = 40           # aggregation scale 2^40; entries are integers / 2^40
AGG_CLIP = float(2 ** 12)     # |integer| < 2^52  =>  |x| <= 2^12
LABEL_BITS = 20               # regression label sums are aggregated on a 2^-20 grid
LOSS_SCALE = float(2 ** 20)   # validation loss sums are sent divided by this (stays below the clip)
DEPTH_SLOTS = 64


class HorizontalSecureBoostError(RuntimeError):
    """The horizontal training cannot go on (a client or the server failed, dropped or misbehaved)."""


def tree_aggregation_config(kind: str = "secagg", **overrides) -> AggregationConfig:
    """Aggregation settings under which integer histograms (< 2^52) are summed exactly.

    Threshold: every client (a missing client would silently change the trees).
    """
    cfg = dict(kind=kind, threshold=1.0, clip=AGG_CLIP, precision_bits=AGG_SCALE_BITS, max_weight=1.0)
    cfg.update(overrides)
    return AggregationConfig(**cfg)


def _check_agg(cfg: AggregationConfig) -> AggregationConfig:
    if cfg.kind != "plain" and (cfg.precision_bits != AGG_SCALE_BITS or cfg.clip < AGG_CLIP or cfg.max_weight < 1):
        raise ValueError("aggregation: use tree_aggregation_config(kind) (scale 2^40, clip 2^12, max_weight 1) "
                         "so histogram sums are exact")
    return cfg


_F32_MAX = float(np.finfo(np.float32).max)


def check_ranges(m: tree_pb2.HsbRanges, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate an hsb.ranges payload: ``d`` (lo, hi) pairs, finite in float32 (the grid's dtype), lo <= hi.

    Returns (lo, hi), float64 (d,) each. Raises ProtocolError naming the first bad feature.
    """
    if len(m.lo) != d or len(m.hi) != d:
        raise ProtocolError(f"ranges: {len(m.lo)} lo and {len(m.hi)} hi values, expected {d} features")
    lo, hi = np.array(m.lo, dtype=np.float64), np.array(m.hi, dtype=np.float64)
    bad = ~(np.isfinite(lo) & np.isfinite(hi) & (np.abs(lo) <= _F32_MAX) & (np.abs(hi) <= _F32_MAX) & (lo <= hi))
    if bad.any():
        j = int(np.argmax(bad))
        raise ProtocolError(f"ranges: feature {j} has range [{lo[j]}, {hi[j]}], not a finite float32 interval")
    return lo, hi


@dataclass(frozen=True)
class HistLayout:
    """One node's histogram vector: blocks [g | h | count], each indexed by (feature, bin) in order.

    Attributes:
        n_bins: bins per feature.
        offsets: int64 (d + 1,): where each feature starts inside a block.
    """

    n_bins: list[int]
    offsets: np.ndarray

    @classmethod
    def of(cls, n_bins: list[int]) -> HistLayout:
        return cls(list(n_bins), np.concatenate([[0], np.cumsum(n_bins)]).astype(np.int64))

    @property
    def n_cells(self) -> int:
        """Length of one block: Σ bins."""
        return int(self.offsets[-1])

    @property
    def size(self) -> int:
        """Length of one node's vector: 3 blocks."""
        return 3 * self.n_cells

    def feature(self, j: int) -> slice:
        """Feature ``j``'s bins inside a block."""
        return slice(self.offsets[j], self.offsets[j + 1])


@dataclass
class Binning:
    """What the binning stage agrees on: the cuts per feature, the base margin and the total row count."""

    cuts: list[np.ndarray]
    base_margin: np.ndarray
    n_rows: int


@dataclass
class NodeSums:
    """A node's gradient sum G, hessian sum H and row count (known from its parent's split)."""

    g: float
    h: float
    n_rows: int


@dataclass
class HistSplit:
    """The best split of a node: rows with bin <= ``bin`` of ``feature`` go left; the children's sums."""

    feature: int
    bin: int
    gain: float
    left: NodeSums
    right: NodeSums


# ============================================================================================ server
class HorizontalSecureBoostServer(ProtocolRole):
    """The data-less coordinator: agrees on bins, sums histograms via secure aggregation, grows trees.

    Stages (methods): :meth:`hello`, :meth:`binning`, then per tree :meth:`grow_tree` (one
    aggregation of histograms per level, :meth:`find_split` per node) and per round :meth:`validation`.

    Args:
        transport: the server's transport.
        client_ids: every client (all must take part in every aggregation).
        params: :class:`SecureBoostParams`.
        aggregation: :class:`AggregationConfig` (default ``tree_aggregation_config("secagg")``).
        feature_ranges: optional public (lo, hi) per feature; then no client reveals its min/max.
    """

    protocol = "horizontal SecureBoost"

    def __init__(self, transport: Transport, client_ids: Sequence[str], params, *,
                 aggregation: AggregationConfig | None = None, feature_ranges=None):
        super().__init__(transport)
        self.client_ids = sorted(client_ids)
        if len(self.client_ids) < 2:
            raise ValueError("client_ids: horizontal SecureBoost needs at least two clients")
        self.params = params if isinstance(params, SecureBoostParams) else SecureBoostParams(**params)
        self.agg_config = _check_agg(aggregation or tree_aggregation_config())
        self.agg = make_server(transport, self.agg_config)
        self.feature_ranges = feature_ranges
        self._agg_round = 0
        self.model: BoostedModel | None = None
        self.tree_seconds: list[float] = []

    def _peers(self) -> list[str]:
        return self.client_ids

    def fit(self) -> BoostedModel:
        """Train; returns the model (global feature indices, bins, thresholds; exportable to XGBoost)."""
        return self._guarded(self._fit)

    def _fit(self) -> BoostedModel:
        prm = self.params
        binning = self.binning(self.hello())
        self.cuts, self.n_rows = binning.cuts, binning.n_rows
        self.layout = HistLayout.of([len(c) + 1 for c in binning.cuts])
        model = BoostedModel(prm, binning.base_margin, [], binning.cuts)
        self.model = model
        seq = 0
        for r in range(prm.n_trees):
            for k in range(prm.trees_per_round):
                model.trees.append(self.grow_tree(seq, k))
                seq += 1
            if self.validation(r):
                break
        self._send_all(TAG_TREE, tree_pb2.HsbLevel(tree=seq, stop=True, keep_trees=len(model.trees)), seq + 1, "stop")
        return model

    # ------------------------------------------------------------------------------ stages
    def hello(self) -> int:
        """Every client's number of features; returns it (HorizontalSecureBoostError if they disagree)."""
        hello = self._recv_all(TAG_HELLO, 0, parse_message(tree_pb2.SbHello), "hello")
        dims = {int(m.n_features) for m in hello.values()}
        if len(dims) != 1:
            raise HorizontalSecureBoostError(f"clients disagree on the number of features: "
                                             f"{ {c: m.n_features for c, m in hello.items()} }")
        return dims.pop()

    def binning(self, d: int) -> Binning:
        """Global ranges, one aggregation of grid counts + row count + label sum -> cuts and base margin."""
        prm = self.params
        lo, hi = self._ranges(d)
        self._send_all(TAG_RANGES, tree_pb2.HsbRanges(lo=lo.tolist(), hi=hi.tolist()), 1, "ranges")
        grids = [grid(lo[j], hi[j], prm.sketch_bins) for j in range(d)]
        sizes = [len(gr) + 1 for gr in grids]
        tot = self._aggregate(sum(sizes) + 2, "bin counts") * 2.0 ** AGG_SCALE_BITS
        offs = np.concatenate([[0], np.cumsum(sizes)])
        cuts = [cuts_from_grid_counts(tot[offs[j]:offs[j + 1]], grids[j], prm.max_bin) for j in range(d)]
        n_total = int(round(tot[-2]))
        label_sum = tot[-1] * 2.0 ** -LABEL_BITS if prm.objective == "regression" else tot[-1]
        bm = base_margin_from_sums(label_sum, n_total, prm)
        cmsg = tree_pb2.HsbCuts(cuts=[tensor_to_proto(c, "<f8") for c in cuts], base_margin=bm.tolist(),
                                n_rows=n_total)
        self._send_all(TAG_CUTS, cmsg, 1, "cuts")
        return Binning(cuts, bm, n_total)

    def grow_tree(self, seq: int, k: int) -> Tree:
        """Tree ``seq`` for output ``k``: the clients' gradient bounds fix the precision, then :meth:`_grow`."""
        ts = time.perf_counter()
        self._send_all(TAG_TREE, tree_pb2.HsbLevel(tree=seq), seq + 1, f"tree {seq}")
        bounds = self._recv_all(TAG_BOUND, seq + 1, parse_message(tree_pb2.HsbBound), f"tree {seq} bound")
        e = max(int(b.log2_bound) for b in bounds.values())
        p = precision_bits_for(self.n_rows, e)
        tree = self._grow(seq, p, e)
        tree.output = k
        self.tree_seconds.append(time.perf_counter() - ts)
        log.info("%s: tree %d in %.2fs", self.party_id, seq + 1, self.tree_seconds[-1])
        return tree

    def validation(self, r: int) -> bool:
        """One aggregation of [loss sum / 2^20, n_val] (zeros from a client without validation rows);
        returns whether early stopping ends the training after round ``r``."""
        v = self._aggregate(2, f"validation loss of round {r}") * 2.0 ** AGG_SCALE_BITS
        n_val = int(round(v[1]))
        if not n_val:
            return False
        s = v[0] * LOSS_SCALE / 2.0 ** AGG_SCALE_BITS
        return self.model.record_validation(r, math.sqrt(s / n_val) if self.params.objective == "regression"
                                            else s / n_val)

    def find_split(self, hist: np.ndarray, g: float, h: float, n_rows: int, p: int) -> HistSplit | None:
        """Best split of a node from its integer histogram (first maximum gain in (feature, bin) order).

        The gain of a split is that of Chen & Guestrin 2016 (XGBoost, eq. 7) without gamma
        (``_split_node`` compares it with gamma):
        ``0.5 * (GL^2 / (HL + lambda) + GR^2 / (HR + lambda) - G^2 / (H + lambda))``.

        Args:
            hist: float64 (3 * layout.n_cells,), integer-valued: ``[g | h | count]``, each part by
                (feature, bin) in layout order; g, h are the gradients scaled by ``2^p``.
            g, h: the node's (dequantised) gradient and hessian sums.
            n_rows: the node's row count.
            p: the precision of the integer gradients.

        Returns:
            The best :class:`HistSplit`, or None: no split keeps rows on both sides and
            ``min_child_weight`` in each child.
        """
        lam, mcw, lay = self.params.reg_lambda, self.params.min_child_weight, self.layout
        F = lay.n_cells
        g_all, h_all, c_all = hist[:F], hist[F:2 * F], hist[2 * F:]
        best_gain, best = -np.inf, None
        for j in range(len(lay.n_bins)):
            sl = lay.feature(j)
            cnt = c_all[sl]
            cum_c = np.cumsum(cnt)[:-1]
            GL = dequantise(np.cumsum(g_all[sl])[:-1], p)
            HL = dequantise(np.cumsum(h_all[sl])[:-1], p)
            GR, HR = g - GL, h - HL
            gain = 0.5 * (GL * GL / (HL + lam) + GR * GR / (HR + lam) - g * g / (h + lam))
            ok = (cnt[:-1] > 0) & (cum_c < n_rows) & (HL >= mcw) & (HR >= mcw)
            if not ok.any():
                continue
            gain = np.where(ok, gain, -np.inf)
            b = int(np.argmax(gain))
            if gain[b] > best_gain:
                best_gain = float(gain[b])
                gl, hl, n_left = float(GL[b]), float(HL[b]), int(cum_c[b])
                best = HistSplit(j, b, best_gain, NodeSums(gl, hl, n_left),
                                 NodeSums(g - gl, h - hl, n_rows - n_left))
        return best

    # ------------------------------------------------------------------------------ tree growing
    def _grow(self, seq: int, p: int, e: int) -> Tree:
        """Level by level: tell the clients the last splits and the nodes to histogram, aggregate, split."""
        prm = self.params
        tree = Tree()
        sums: dict[int, NodeSums] = {}   # known from the parent's split
        counts = {0: self.n_rows}
        hists: dict[int, np.ndarray] = {}
        level, splits = [0], []
        for depth in range(prm.max_depth + 1):
            split_now = [nid for nid in level if depth < prm.max_depth and counts[nid] >= 2]
            for nid in level:
                if nid not in split_now:
                    s = sums[nid]
                    tree.nodes[nid] = Node(nid, value=self._leaf_value(s.g, s.h), sum_hess=s.h, n_rows=s.n_rows)
            plan = plan_children(split_now, counts) if split_now else []
            msg = self._level_message(tree, seq, depth, p, e, plan, splits, done=not split_now)
            self._send_all(TAG_LEVEL, msg, seq * DEPTH_SLOTS + depth + 1, f"tree {seq} depth {depth}")
            if msg.done:
                return tree
            new = self._level_histograms(seq, depth, list(msg.build), plan, hists)
            splits, level = [], []
            for nid in split_now:
                best = self._split_node(tree, nid, new[nid], counts[nid], p)
                if best is None:
                    continue
                node = tree.nodes[nid]
                splits.append(dict(node=nid, feature=best.feature, bin=best.bin, threshold=node.threshold))
                counts[node.left], counts[node.right] = best.left.n_rows, best.right.n_rows
                sums[node.left], sums[node.right] = best.left, best.right
                level += [node.left, node.right]
            hists = {nid: new[nid] for nid in split_now}
        raise AssertionError("unreachable: the last level has no node to split")

    def _level_message(self, tree: Tree, seq: int, depth: int, p: int, e: int, plan, splits: list[dict], *,
                       done: bool) -> tree_pb2.HsbLevel:
        """hsb.level: the previous level's splits, the nodes to histogram now; when done, the leaves."""
        msg = tree_pb2.HsbLevel(tree=seq, depth=depth, build=[nid for nid, derived in plan if not derived],
                                precision_bits=p, log2_bound=e, done=done)
        for s in splits:
            msg.splits.add(**s)
        if done:
            for nid, node in sorted(tree.nodes.items()):
                if node.leaf:
                    msg.leaves.add(node=nid, value=node.value)
        return msg

    def _level_histograms(self, seq: int, depth: int, build: list[int], plan, parents: dict[int, np.ndarray]):
        """Integer histograms of this level's nodes: ``build`` aggregated, the others parent - sibling."""
        size = self.layout.size
        built = self._aggregate(size * len(build), f"histograms of tree {seq} depth {depth}")
        built = np.rint(built * 2.0 ** AGG_SCALE_BITS).reshape(len(build), size)
        new = {nid: built[i] for i, nid in enumerate(build)}
        for nid, derived in plan:
            if derived:
                sib = nid + 1 if nid % 2 == 1 else nid - 1
                new[nid] = parents[(nid - 1) // 2] - new[sib]
        return new

    def _split_node(self, tree: Tree, nid: int, hist: np.ndarray, n_rows: int, p: int) -> HistSplit | None:
        """Add node ``nid``: split on the best candidate when its gain exceeds gamma (returned), else a leaf."""
        sl, F = self.layout.feature(0), self.layout.n_cells
        g = float(dequantise(hist[:F][sl].sum(), p))
        h = float(dequantise(hist[F:2 * F][sl].sum(), p))
        node = Node(nid, sum_hess=h, n_rows=n_rows)
        tree.nodes[nid] = node
        best = self.find_split(hist, g, h, n_rows, p)
        if best is not None and best.gain - self.params.gamma > 0:
            node.leaf, node.feature, node.bin, node.gain = False, best.feature, best.bin, best.gain
            node.threshold = float(self.cuts[best.feature][best.bin])
            return best
        node.value = self._leaf_value(g, h)
        return None

    def _leaf_value(self, g: float, h: float) -> float:
        return -self.params.learning_rate * g / (h + self.params.reg_lambda)

    # ------------------------------------------------------------------------------ messaging
    def _ranges(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) per feature: the public ``feature_ranges``, or the min/max over the clients' hsb.ranges."""
        if self.feature_ranges is not None:
            lo, hi = (np.asarray(v, dtype=np.float64) for v in zip(*self.feature_ranges))
            if len(lo) != d:
                raise ValueError(f"feature_ranges: {len(lo)} ranges for {d} features")
            return lo, hi

        check = functools.partial(check_ranges, d=d)
        los, his = zip(*self._recv_all(TAG_RANGES, 1, parse_message(tree_pb2.HsbRanges, check), "ranges").values())
        return np.min(los, axis=0), np.max(his, axis=0)

    def _aggregate(self, dim: int, what: str) -> np.ndarray:
        self._agg_round += 1
        try:
            res = self.agg.aggregate(self._agg_round, self.client_ids, dim)
        except (AggregationError, TransportError) as exc:
            raise HorizontalSecureBoostError(f"aggregation of {what} failed: {exc}") from exc
        if res.dropped:
            raise HorizontalSecureBoostError(f"aggregation of {what}: client(s) {res.dropped} dropped out")
        return res.total

    def _recv_all(self, tag: str, rnd: int, parse, what: str) -> dict:
        out = {}
        for c in self.client_ids:
            try:
                out[c] = self.t.recv(c, tag, round=rnd, parse=parse)
            except TransportError as exc:
                raise HorizontalSecureBoostError(f"client {c!r} failed or went silent ({what}): {exc}") from exc
        return out

    def _send_all(self, tag: str, msg, rnd: int, what: str) -> None:
        for c in self.client_ids:
            try:
                self.t.send(c, tag, msg, round=rnd)
            except TransportError as exc:
                raise HorizontalSecureBoostError(f"client {c!r} unreachable ({what}): {exc}") from exc


# ============================================================================================ client
class HorizontalSecureBoostClient(ProtocolRole):
    """A data holder: computes local gradients and histograms, sends them only through aggregation.

    Stages (methods): :meth:`hello`, :meth:`binning`, then per tree :meth:`grow_tree` (one histogram
    vector per level) and per round :meth:`validation`.

    Args:
        transport: this client's transport.
        server_id: the server's party id.
        client_ids: every client of the job (the aggregation participants).
        X: float (n_i, d) this client's rows; y: its labels (n_i,).
        params: :class:`SecureBoostParams` (same at every party).
        X_val, y_val: optional local validation rows (their loss sum is aggregated per round).
        aggregation: :class:`AggregationConfig` (default ``tree_aggregation_config("secagg")``).
        send_ranges: send this client's per-feature min/max to the server (False when the server has
            public ``feature_ranges``).
    """

    protocol = "horizontal SecureBoost"

    def __init__(self, transport: Transport, server_id: str, client_ids: Sequence[str], X, y, params, *,
                 X_val=None, y_val=None, aggregation: AggregationConfig | None = None, send_ranges: bool = True):
        super().__init__(transport)
        self.server_id = server_id
        self.client_ids = sorted(client_ids)
        self.params = params if isinstance(params, SecureBoostParams) else SecureBoostParams(**params)
        self.X = check_matrix(X, "X")
        self.y = check_labels(y, self.params)
        if len(self.y) != len(self.X):
            raise ValueError(f"y: {len(self.y)} labels for {len(self.X)} rows")
        self.X_val = None if X_val is None else check_matrix(X_val, "X_val")
        self.y_val = None if y_val is None else check_labels(y_val, self.params)
        self.agg = make_client(transport, server_id, _check_agg(aggregation or tree_aggregation_config()))
        self.send_ranges = send_ranges
        self._agg_round = 0
        self.model: BoostedModel | None = None

    def _peers(self) -> list[str]:
        return [self.server_id]

    def fit(self) -> BoostedModel:
        """Train with the server; returns the shared model (same as the server's)."""
        return self._guarded(self._fit)

    def _fit(self) -> BoostedModel:
        prm = self.params
        self.hello()
        binning = self.binning()
        self.n_total = binning.n_rows
        self.layout = HistLayout.of([len(c) + 1 for c in binning.cuts])
        model = BoostedModel(prm, binning.base_margin, [], binning.cuts)
        self.model = model
        bins = apply_bins(self.X, binning.cuts)
        margin = np.tile(binning.base_margin, (len(bins), 1)).astype(np.float64)
        vbins = None if self.X_val is None else apply_bins(self.X_val, binning.cuts)
        vmargin = None if vbins is None else np.tile(binning.base_margin, (len(vbins), 1)).astype(np.float64)
        seq = 0
        for _ in range(prm.n_trees):
            g, h = gradients(margin, self.y, prm)
            for k in range(prm.trees_per_round):
                start = self._recv(TAG_TREE, seq + 1, parse_message(tree_pb2.HsbLevel))
                if start.stop:
                    return self._keep(start)
                tree = self.grow_tree(seq, k, bins, g[:, k], h[:, k])
                model.trees.append(tree)
                margin[:, k] += tree.predict_bins(bins)
                if vbins is not None:
                    vmargin[:, k] += tree.predict_bins(vbins)
                seq += 1
            self.validation(vbins, vmargin)
        start = self._recv(TAG_TREE, seq + 1, parse_message(tree_pb2.HsbLevel))
        if not start.stop:
            raise HorizontalSecureBoostError("server wants more trees than params.n_trees")
        return self._keep(start)

    # ------------------------------------------------------------------------------ stages
    def hello(self) -> None:
        """hsb.hello: the number of features; hsb.ranges: this client's min/max (unless ranges are public)."""
        self.t.send(self.server_id, TAG_HELLO, tree_pb2.SbHello(n_features=self.X.shape[1]))
        if self.send_ranges:
            self.t.send(self.server_id, TAG_RANGES, tree_pb2.HsbRanges(lo=self.X.min(axis=0).tolist(),
                                                                        hi=self.X.max(axis=0).tolist()), round=1)

    def binning(self) -> Binning:
        """Global ranges in; grid counts + row count + label sum into one aggregation; cuts and base margin out."""
        prm, (n, d) = self.params, self.X.shape

        lo, hi = self._recv(TAG_RANGES, 1, parse_message(tree_pb2.HsbRanges, functools.partial(check_ranges, d=d)))
        counts = [grid_counts(self.X[:, j], grid(lo[j], hi[j], prm.sketch_bins)) for j in range(d)]
        label = np.sum(quantise(self.y, LABEL_BITS)) if prm.objective == "regression" else np.sum(self.y)
        self._submit(np.concatenate(counts + [[n, label]]) * 2.0 ** -AGG_SCALE_BITS)
        return self._recv(TAG_CUTS, 1, parse_message(tree_pb2.HsbCuts, lambda m: self._check_cuts(m, d)))

    def grow_tree(self, seq: int, k: int, bins: np.ndarray, g: np.ndarray, h: np.ndarray) -> Tree:
        """Tree ``seq`` for output ``k``: send the bound of |g|, |h|, then one histogram vector per level."""
        self.t.send(self.server_id, TAG_BOUND, tree_pb2.HsbBound(log2_bound=bound_log2(g, h)), round=seq + 1)
        tree = self._grow(seq, bins, g, h)
        tree.output = k
        return tree

    def validation(self, vbins: np.ndarray | None, vmargin: np.ndarray | None) -> None:
        """Submit [validation loss sum / 2^20, n_val] (zeros without validation rows) for early stopping."""
        if vbins is None or not len(vbins):
            self._submit(np.zeros(2))
            return
        if self.params.objective == "regression":
            s = float(np.sum((vmargin[:, 0] - self.y_val) ** 2))
        else:
            s = loss(vmargin, self.y_val, self.params) * len(vbins)
        self._submit(np.array([s / LOSS_SCALE, len(vbins)]) * 2.0 ** -AGG_SCALE_BITS)

    # ------------------------------------------------------------------------------ tree growing
    def _grow(self, seq: int, bins: np.ndarray, g: np.ndarray, h: np.ndarray) -> Tree:
        """Level by level: apply the server's splits to this client's rows, submit the requested histograms."""
        tree = Tree()
        rows_of = {0: np.arange(len(bins))}
        p = None
        for depth in range(self.params.max_depth + 1):
            msg = self._recv(TAG_LEVEL, seq * DEPTH_SLOTS + depth + 1, parse_message(
                tree_pb2.HsbLevel, lambda m: self._check_level(m, seq, depth, rows_of)))
            if p is None:
                p = int(msg.precision_bits)
                if p != precision_bits_for(self.n_total, int(msg.log2_bound)) or int(msg.log2_bound) < bound_log2(g, h):
                    raise HorizontalSecureBoostError(f"server announced precision {p} / bound 2^{msg.log2_bound} "
                                                     "inconsistent with this client's gradients")
                gq, hq = quantise(g, p), quantise(h, p)
            for s in msg.splits:
                nid = int(s.node)
                rows = rows_of[nid]
                left = bins[rows, s.feature] <= s.bin
                tree.nodes[nid] = Node(nid, leaf=False, feature=int(s.feature), bin=int(s.bin),
                                       threshold=float(s.threshold))
                rows_of[2 * nid + 1], rows_of[2 * nid + 2] = rows[left], rows[~left]
            if msg.done:
                for lf in msg.leaves:
                    tree.nodes[int(lf.node)] = Node(int(lf.node), value=float(lf.value))
                return tree
            self._submit(self._histograms(msg.build, rows_of, bins, gq, hq).ravel() * 2.0 ** -AGG_SCALE_BITS)
        raise HorizontalSecureBoostError("server sent more levels than max_depth")

    def _histograms(self, build, rows_of: dict, bins: np.ndarray, gq: np.ndarray, hq: np.ndarray) -> np.ndarray:
        """(len(build), layout.size): per node [g | h | count] by (feature, bin), integer gradients gq, hq."""
        lay = self.layout
        F = lay.n_cells
        vec = np.zeros((len(build), lay.size))
        for i, nid in enumerate(build):
            rows = rows_of.get(int(nid), np.zeros(0, dtype=np.int64))
            g_rows, h_rows = gq[rows].astype(np.float64), hq[rows].astype(np.float64)
            for j, nb in enumerate(lay.n_bins):
                b = bins[rows, j]
                sl = lay.feature(j)
                vec[i, sl] = np.bincount(b, g_rows, nb)
                vec[i, F:][sl] = np.bincount(b, h_rows, nb)
                vec[i, 2 * F:][sl] = np.bincount(b, minlength=nb)
        return vec

    # ------------------------------------------------------------------------------ messaging
    def _check_cuts(self, m: tree_pb2.HsbCuts, d: int) -> Binning:
        prm = self.params
        if len(m.cuts) != d or len(m.base_margin) != (prm.n_classes if prm.objective == "multiclass" else 1):
            raise ProtocolError("cuts: wrong number of features or outputs")
        if any(len(c.shape) != 1 for c in m.cuts):
            raise ProtocolError("cuts: expected 1-D float64 tensors")
        cuts = [tensor_from_proto(c, what=f"cuts[{j}]", dtype="<f8") for j, c in enumerate(m.cuts)]
        if any(np.any(np.diff(c) <= 0) for c in cuts) or any(len(c) >= prm.max_bin for c in cuts):
            raise ProtocolError("cuts: not increasing or more than max_bin - 1 per feature")
        return Binning(cuts, np.array(m.base_margin), int(m.n_rows))

    def _check_level(self, m: tree_pb2.HsbLevel, seq: int, depth: int, rows_of: dict):
        n_bins = self.layout.n_bins
        if m.tree != seq or m.depth != depth:
            raise ProtocolError(f"level message for tree {m.tree} depth {m.depth}, expected {seq}/{depth}")
        for s in m.splits:
            if int(s.node) not in rows_of or not 0 <= s.feature < len(n_bins) or not 0 <= s.bin < n_bins[s.feature] - 1:
                raise ProtocolError(f"split of node {s.node} on feature {s.feature} bin {s.bin} is invalid")
        return m

    def _keep(self, stop: tree_pb2.HsbLevel) -> BoostedModel:
        """The model cut to the server's ``keep_trees`` (early stopping keeps the best round)."""
        self.model.trees = self.model.trees[:stop.keep_trees]
        return self.model

    def _submit(self, vector: np.ndarray) -> None:
        self._agg_round += 1
        self.agg.submit(self._agg_round, self.client_ids, vector, 1.0)

    def _recv(self, tag: str, rnd: int, parse):
        try:
            return self.t.recv(self.server_id, tag, round=rnd, parse=parse)
        except TransportError as exc:
            raise HorizontalSecureBoostError(f"server {self.server_id!r} failed or went silent "
                                             f"(waiting for {tag!r}): {exc}") from exc

    def predict(self, X) -> np.ndarray:
        """Local prediction with the shared model (no communication)."""
        if self.model is None:
            raise RuntimeError("predict before fit")
        return self.model.predict(X)
