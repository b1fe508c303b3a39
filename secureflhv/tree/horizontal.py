"""Horizontal SecureBoost: clients hold different rows of the same columns; a data-less server grows trees.

Every sum leaves a client only through the aggregation interface
(:mod:`secureflhv.horizontal.aggregation`; ``secagg`` by default: Bonawitz et al. CCS 2017), so the
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
"""
from __future__ import annotations

import logging
import math
import time
from typing import Sequence

import numpy as np

from ..horizontal.aggregation import AggregationConfig, AggregationError, make_client, make_server
from ..proto import messages_pb2, tree_pb2
from ..transport import ProtocolError, Transport, TransportError, parse_message
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


def _tensor(a) -> messages_pb2.Tensor:
    a = np.ascontiguousarray(a, dtype="<f8")
    return messages_pb2.Tensor(dtype="<f8", shape=list(a.shape), data=a.tobytes())


def _from_tensor(t: messages_pb2.Tensor, what: str) -> np.ndarray:
    if t.dtype != "<f8" or len(t.shape) != 1 or len(t.data) != 8 * int(t.shape[0]):
        raise ProtocolError(f"{what}: expected a 1-D float64 tensor")
    a = np.frombuffer(t.data, dtype="<f8").copy()
    if not np.all(np.isfinite(a)):
        raise ProtocolError(f"{what}: non-finite values")
    return a


def _hist_layout(n_bins: list[int]) -> tuple[int, np.ndarray]:
    """Size of one node's histogram vector [g | h | count] and the offset of each feature in a block."""
    off = np.concatenate([[0], np.cumsum(n_bins)]).astype(np.int64)
    return 3 * int(off[-1]), off


# ============================================================================================ server
class HorizontalSecureBoostServer:
    """The data-less coordinator: agrees on bins, sums histograms via secure aggregation, grows trees.

    Args:
        transport: the server's transport.
        client_ids: every client (all must take part in every aggregation).
        params: :class:`SecureBoostParams`.
        aggregation: :class:`AggregationConfig` (default ``tree_aggregation_config("secagg")``).
        feature_ranges: optional public (lo, hi) per feature; then no client reveals its min/max.
    """

    def __init__(self, transport: Transport, client_ids: Sequence[str], params, *,
                 aggregation: AggregationConfig | None = None, feature_ranges=None):
        self.t = transport
        self.party_id = transport.party_id
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

    def fit(self) -> BoostedModel:
        """Train; returns the model (global feature indices, bins, thresholds; exportable to XGBoost)."""
        try:
            return self._fit()
        except BaseException as exc:
            log.error("%s: horizontal SecureBoost failed: %s", self.party_id, exc)
            self.t.abort(f"{self.party_id}: {type(exc).__name__}: {exc}", self.client_ids)
            raise

    def _fit(self) -> BoostedModel:
        prm = self.params
        hello = self._recv_all(TAG_HELLO, 0, parse_message(tree_pb2.SbHello), "hello")
        dims = {int(m.n_features) for m in hello.values()}
        if len(dims) != 1:
            raise HorizontalSecureBoostError(f"clients disagree on the number of features: "
                                             f"{ {c: m.n_features for c, m in hello.items()} }")
        d = dims.pop()
        # ---- binning
        if self.feature_ranges is not None:
            lo, hi = (np.asarray(v, dtype=np.float64) for v in zip(*self.feature_ranges))
            if len(lo) != d:
                raise ValueError(f"feature_ranges: {len(lo)} ranges for {d} features")
        else:
            def vr(m: tree_pb2.HsbRanges):
                if len(m.lo) != d or len(m.hi) != d or not np.all(np.isfinite(list(m.lo) + list(m.hi))):
                    raise ProtocolError(f"ranges: expected {d} finite (lo, hi)")
                return np.array(m.lo), np.array(m.hi)
            rng = self._recv_all(TAG_RANGES, 1, parse_message(tree_pb2.HsbRanges, vr), "ranges")
            lo = np.min([v[0] for v in rng.values()], axis=0)
            hi = np.max([v[1] for v in rng.values()], axis=0)
        self._send_all(TAG_RANGES, tree_pb2.HsbRanges(lo=lo.tolist(), hi=hi.tolist()), 1, "ranges")
        G = prm.sketch_bins
        grids = [grid(lo[j], hi[j], G) for j in range(d)]
        sizes = [len(gr) + 1 for gr in grids]
        tot = self._aggregate(sum(sizes) + 2, "bin counts") * 2.0 ** AGG_SCALE_BITS
        offs = np.concatenate([[0], np.cumsum(sizes)])
        cuts = [cuts_from_grid_counts(tot[offs[j]:offs[j + 1]], grids[j], prm.max_bin) for j in range(d)]
        n_total = int(round(tot[-2]))
        label_sum = tot[-1] * 2.0 ** -LABEL_BITS if prm.objective == "regression" else tot[-1]
        bm = base_margin_from_sums(label_sum, n_total, prm)
        self.n_rows = n_total
        cmsg = tree_pb2.HsbCuts(cuts=[_tensor(c) for c in cuts], base_margin=bm.tolist(), n_rows=n_total)
        self._send_all(TAG_CUTS, cmsg, 1, "cuts")
        n_bins = [len(c) + 1 for c in cuts]
        model = BoostedModel(prm, bm, [], cuts)
        self.model = model
        seq = 0
        validating = None
        for r in range(prm.n_trees):
            for k in range(prm.trees_per_round):
                ts = time.perf_counter()
                self._send_all(TAG_TREE, tree_pb2.HsbLevel(tree=seq), seq + 1, f"tree {seq}")
                bounds = self._recv_all(TAG_BOUND, seq + 1, parse_message(tree_pb2.HsbBound), f"tree {seq} bound")
                e = max(int(b.log2_bound) for b in bounds.values())
                p = precision_bits_for(n_total, e)
                tree = self._grow(seq, p, e, n_bins, cuts)
                tree.output = k
                model.trees.append(tree)
                seq += 1
                self.tree_seconds.append(time.perf_counter() - ts)
                log.info("%s: tree %d in %.2fs", self.party_id, seq, self.tree_seconds[-1])
            # validation loss (every client sends [loss sum / 2^20, n_val]; zeros if it has none)
            v = self._aggregate(2, f"validation loss of round {r}") * 2.0 ** AGG_SCALE_BITS
            n_val = int(round(v[1]))
            if validating is None:
                validating = n_val > 0
            if n_val:
                s = v[0] * LOSS_SCALE / 2.0 ** AGG_SCALE_BITS
                if model.record_validation(r, math.sqrt(s / n_val) if prm.objective == "regression" else s / n_val):
                    break
        self._send_all(TAG_TREE, tree_pb2.HsbLevel(tree=seq, stop=True, keep_trees=len(model.trees)), seq + 1, "stop")
        return model

    def _grow(self, seq: int, p: int, e: int, n_bins: list[int], cuts) -> Tree:
        prm = self.params
        lam, lr, mcw = prm.reg_lambda, prm.learning_rate, prm.min_child_weight
        size, off = _hist_layout(n_bins)
        F = int(off[-1])
        tree = Tree()
        hists: dict[int, np.ndarray] = {}
        sums: dict[int, tuple[float, float, int]] = {}   # node -> (G, H, rows), known from the parent's split
        counts = {0: self.n_rows}
        level, splits = [0], []
        for depth in range(prm.max_depth + 1):
            rnd = seq * DEPTH_SLOTS + depth + 1
            split_now = [nid for nid in level if depth < prm.max_depth and counts[nid] >= 2]
            for nid in level:
                if nid not in split_now:
                    G, H, c = sums[nid]
                    tree.nodes[nid] = Node(nid, value=-lr * G / (H + lam), sum_hess=H, n_rows=c)
            plan = plan_children(split_now, counts) if split_now else []
            msg = tree_pb2.HsbLevel(tree=seq, depth=depth, build=[nid for nid, derived in plan if not derived],
                                    precision_bits=p, log2_bound=e, done=not split_now)
            for s in splits:
                msg.splits.add(**s)
            if msg.done:
                for nid, node in sorted(tree.nodes.items()):
                    if node.leaf:
                        msg.leaves.add(node=nid, value=node.value)
            self._send_all(TAG_LEVEL, msg, rnd, f"tree {seq} depth {depth}")
            if msg.done:
                return tree
            built = self._aggregate(size * len(msg.build), f"histograms of tree {seq} depth {depth}")
            built = np.rint(built * 2.0 ** AGG_SCALE_BITS).reshape(len(msg.build), size)
            new = {nid: built[i] for i, nid in enumerate(msg.build)}
            for nid, derived in plan:
                if derived:
                    sib = nid + 1 if nid % 2 == 1 else nid - 1
                    new[nid] = hists[(nid - 1) // 2] - new[sib]
            splits, next_level = [], []
            for nid in split_now:
                hv = new[nid]
                g_all, h_all, c_all = hv[:F], hv[F:2 * F], hv[2 * F:]
                G = float(dequantise(g_all[off[0]:off[1]].sum(), p))
                H = float(dequantise(h_all[off[0]:off[1]].sum(), p))
                node = Node(nid, sum_hess=H, n_rows=counts[nid])
                tree.nodes[nid] = node
                best_gain, best = -np.inf, None
                for j in range(len(n_bins)):
                    sl = slice(off[j], off[j + 1])
                    cnt = c_all[sl]
                    cum_c = np.cumsum(cnt)[:-1]
                    GL = dequantise(np.cumsum(g_all[sl])[:-1], p)
                    HL = dequantise(np.cumsum(h_all[sl])[:-1], p)
                    GR, HR = G - GL, H - HL
                    gain = 0.5 * (GL * GL / (HL + lam) + GR * GR / (HR + lam) - G * G / (H + lam))
                    ok = (cnt[:-1] > 0) & (cum_c < node.n_rows) & (HL >= mcw) & (HR >= mcw)
                    if not ok.any():
                        continue
                    gain = np.where(ok, gain, -np.inf)
                    b = int(np.argmax(gain))
                    if gain[b] > best_gain:
                        best_gain, best = float(gain[b]), (j, b, float(GL[b]), float(HL[b]), int(cum_c[b]))
                if best is not None and best_gain - prm.gamma > 0:
                    j, b, gl, hl, n_left = best
                    node.leaf, node.feature, node.bin, node.gain = False, j, b, best_gain
                    node.threshold = float(cuts[j][b])
                    splits.append(dict(node=nid, feature=j, bin=b, threshold=node.threshold))
                    counts[node.left], counts[node.right] = n_left, node.n_rows - n_left
                    sums[node.left], sums[node.right] = (gl, hl, n_left), (G - gl, H - hl, node.n_rows - n_left)
                    next_level += [node.left, node.right]
                else:
                    node.value = -lr * G / (H + lam)
            hists = {nid: new[nid] for nid in split_now}
            level = next_level
        raise AssertionError("unreachable: the last level has no node to split")


# ============================================================================================ client
class HorizontalSecureBoostClient:
    """A data holder: computes local gradients and histograms, sends them only through aggregation.

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

    def __init__(self, transport: Transport, server_id: str, client_ids: Sequence[str], X, y, params, *,
                 X_val=None, y_val=None, aggregation: AggregationConfig | None = None, send_ranges: bool = True):
        self.t = transport
        self.party_id = transport.party_id
        self.server_id = server_id
        self.client_ids = sorted(client_ids)
        self.params = params if isinstance(params, SecureBoostParams) else SecureBoostParams(**params)
        self.X = np.asarray(X, dtype=np.float64)
        if self.X.ndim != 2 or not np.all(np.isfinite(self.X)):
            raise ValueError("X: expected a finite (rows, features) array")
        self.y = check_labels(y, self.params)
        if len(self.y) != len(self.X):
            raise ValueError(f"y: {len(self.y)} labels for {len(self.X)} rows")
        self.X_val = None if X_val is None else np.asarray(X_val, dtype=np.float64)
        self.y_val = None if y_val is None else check_labels(y_val, self.params)
        self.agg = make_client(transport, server_id, _check_agg(aggregation or tree_aggregation_config()))
        self.send_ranges = send_ranges
        self._agg_round = 0
        self.model: BoostedModel | None = None

    def _submit(self, vector: np.ndarray) -> None:
        self._agg_round += 1
        self.agg.submit(self._agg_round, self.client_ids, vector, 1.0)

    def _recv(self, tag: str, rnd: int, parse):
        try:
            return self.t.recv(self.server_id, tag, round=rnd, parse=parse)
        except TransportError as exc:
            raise HorizontalSecureBoostError(f"server {self.server_id!r} failed or went silent "
                                             f"(waiting for {tag!r}): {exc}") from exc

    def fit(self) -> BoostedModel:
        """Train with the server; returns the shared model (same as the server's)."""
        try:
            return self._fit()
        except BaseException as exc:
            log.error("%s: horizontal SecureBoost failed: %s", self.party_id, exc)
            self.t.abort(f"{self.party_id}: {type(exc).__name__}: {exc}", [self.server_id])
            raise

    def _fit(self) -> BoostedModel:
        prm, t = self.params, self.t
        n, d = self.X.shape
        t.send(self.server_id, TAG_HELLO, tree_pb2.SbHello(n_features=d))
        if self.send_ranges:
            t.send(self.server_id, TAG_RANGES, tree_pb2.HsbRanges(lo=self.X.min(axis=0).tolist(),
                                                                   hi=self.X.max(axis=0).tolist()), round=1)

        def vr(m: tree_pb2.HsbRanges):
            if len(m.lo) != d or len(m.hi) != d:
                raise ProtocolError(f"ranges: expected {d} features")
            return np.array(m.lo), np.array(m.hi)

        lo, hi = self._recv(TAG_RANGES, 1, parse_message(tree_pb2.HsbRanges, vr))
        counts = [grid_counts(self.X[:, j], grid(lo[j], hi[j], prm.sketch_bins)) for j in range(d)]
        label = np.sum(quantise(self.y, LABEL_BITS)) if prm.objective == "regression" else np.sum(self.y)
        self._submit(np.concatenate(counts + [[n, label]]) * 2.0 ** -AGG_SCALE_BITS)

        def vc(m: tree_pb2.HsbCuts):
            if len(m.cuts) != d or len(m.base_margin) != (prm.n_classes if prm.objective == "multiclass" else 1):
                raise ProtocolError("cuts: wrong number of features or outputs")
            cuts = [_from_tensor(c, f"cuts[{j}]") for j, c in enumerate(m.cuts)]
            if any(np.any(np.diff(c) <= 0) for c in cuts) or any(len(c) >= prm.max_bin for c in cuts):
                raise ProtocolError("cuts: not increasing or more than max_bin - 1 per feature")
            return cuts, np.array(m.base_margin), int(m.n_rows)

        cuts, bm, n_total = self._recv(TAG_CUTS, 1, parse_message(tree_pb2.HsbCuts, vc))
        self.cuts, self.n_total = cuts, n_total
        bins = apply_bins(self.X, cuts)
        n_bins = [len(c) + 1 for c in cuts]
        size, off = _hist_layout(n_bins)
        model = BoostedModel(prm, bm, [], cuts)
        self.model = model
        margin = np.tile(bm, (n, 1)).astype(np.float64)
        vbins = None if self.X_val is None else apply_bins(self.X_val, cuts)
        vmargin = None if vbins is None else np.tile(bm, (len(vbins), 1)).astype(np.float64)
        seq = 0
        for r in range(prm.n_trees):
            g, h = gradients(margin, self.y, prm)
            for k in range(prm.trees_per_round):
                start = self._recv(TAG_TREE, seq + 1, parse_message(tree_pb2.HsbLevel))
                if start.stop:
                    model.trees = model.trees[:start.keep_trees]
                    return model
                t.send(self.server_id, TAG_BOUND, tree_pb2.HsbBound(log2_bound=bound_log2(g[:, k], h[:, k])),
                       round=seq + 1)
                tree = self._grow(seq, bins, g[:, k], h[:, k], n_bins, size, off, n_total)
                tree.output = k
                model.trees.append(tree)
                margin[:, k] += tree.predict_bins(bins)
                if vbins is not None:
                    vmargin[:, k] += tree.predict_bins(vbins)
                seq += 1
            if vbins is not None and len(vbins):
                if prm.objective == "regression":
                    s = float(np.sum((vmargin[:, 0] - self.y_val) ** 2))
                else:
                    s = loss(vmargin, self.y_val, prm) * len(vbins)
                self._submit(np.array([s / LOSS_SCALE, len(vbins)]) * 2.0 ** -AGG_SCALE_BITS)
            else:
                self._submit(np.zeros(2))
        start = self._recv(TAG_TREE, seq + 1, parse_message(tree_pb2.HsbLevel))
        if not start.stop:
            raise HorizontalSecureBoostError("server wants more trees than params.n_trees")
        model.trees = model.trees[:start.keep_trees]
        return model

    def _grow(self, seq, bins, g, h, n_bins, size, off, n_total) -> Tree:
        F = int(off[-1])
        tree = Tree()
        rows_of = {0: np.arange(len(bins))}
        p = None
        for depth in range(self.params.max_depth + 1):
            rnd = seq * DEPTH_SLOTS + depth + 1
            msg = self._recv(TAG_LEVEL, rnd, parse_message(tree_pb2.HsbLevel, lambda m: self._check_level(m, seq, depth,
                                                                                                         rows_of, n_bins)))
            if p is None:
                p = int(msg.precision_bits)
                if p != precision_bits_for(n_total, int(msg.log2_bound)) or int(msg.log2_bound) < bound_log2(g, h):
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
            vec = np.zeros((len(msg.build), size))
            for i, nid in enumerate(msg.build):
                rows = rows_of.get(int(nid), np.zeros(0, dtype=np.int64))
                for j in range(len(n_bins)):
                    b = bins[rows, j]
                    sl = slice(off[j], off[j + 1])
                    vec[i, sl] = np.bincount(b, gq[rows].astype(np.float64), n_bins[j])
                    vec[i, F:][sl] = np.bincount(b, hq[rows].astype(np.float64), n_bins[j])
                    vec[i, 2 * F:][sl] = np.bincount(b, minlength=n_bins[j])
            self._submit(vec.ravel() * 2.0 ** -AGG_SCALE_BITS)
        raise HorizontalSecureBoostError("server sent more levels than max_depth")

    def _check_level(self, m: tree_pb2.HsbLevel, seq: int, depth: int, rows_of: dict, n_bins: list[int]):
        if m.tree != seq or m.depth != depth:
            raise ProtocolError(f"level message for tree {m.tree} depth {m.depth}, expected {seq}/{depth}")
        for s in m.splits:
            if int(s.node) not in rows_of or not 0 <= s.feature < len(n_bins) or not 0 <= s.bin < n_bins[s.feature] - 1:
                raise ProtocolError(f"split of node {s.node} on feature {s.feature} bin {s.bin} is invalid")
        return m

    def predict(self, X) -> np.ndarray:
        """Local prediction with the shared model (no communication)."""
        if self.model is None:
            raise RuntimeError("predict before fit")
        return self.model.predict(X)
