"""Horizontal SecureBoost: clients hold different rows of the same columns; a data-less server grows trees.

Every sum leaves a client only through the aggregation interface
(:mod:`secureflhv.secagg`; ``secagg`` by default: Bonawitz et al. CCS 2017), so the
server sees sums over all clients, never one client's histogram. The protocol (tags ``hsb.*``)::

    clients -> server  hsb.hello: number of features
    binning            global range per feature: public ``feature_ranges`` given to the server, or each
                       client's min/max (hsb.ranges, revealed to the server); then one aggregation of
                       per-cell counts on a public grid of ``sketch_bins`` equal cells, the missing-value
                       (NaN) count per feature, the row count and the label sum -> server: quantile cuts
                       (binning.cuts_from_grid_counts) of the present values, the base margin and which
                       features have missing values -> hsb.cuts to every client
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

Missing values (Chen & Guestrin 2016, Alg. 3): a feature with missing values at some client becomes two
virtual columns (:class:`~secureflhv.tree.binning.Binner`: missing bucket last / first), so the clients'
histograms carry the missing bucket and the server's first-maximum search tries both default directions
(order: feature, missing right before left, bin); hsb.level's splits carry ``default_left``. Ranges are
each client's nanmin/nanmax (both NaN for a column it has no value in).

Exactness: histogram entries are integers below 2^52 sent as x = m / 2^40 with clip 2^12, scale 2^40
and weight 1 (:func:`tree_aggregation_config`), so the fixed-point quantisation of secure aggregation
is exact (no rounding) and the server's sums equal the centralised histograms bit for bit.

Dropout (t of n): t is the aggregation threshold (a count or a fraction of the n clients, default the
smallest t with n_C < 2t − n for the job's ``max_colluders``; :func:`job_threshold`), fixed for the whole
job; the job's clients are the only participants a client accepts. No sum ever
mixes client sets: the server fixes the participant set ``active`` per boosting round (its trees and
its validation aggregation), and every aggregation of the round must return exactly that set as
survivors. A client lost in round r (not among an aggregation's survivors, silent at hsb.bound, or
unreachable) is dropped for the rest of the training; the server discards round r's trees and sends
the others, where they wait next (hsb.level or hsb.tree), an HsbLevel ``restart`` naming the first
tree of round r and the remaining ``clients``; server and clients rebuild round r from the margins it
started with, over the survivors' rows only. Fewer than max(t, 2) remaining, or an aggregation that
fails outright (AggregationError), ends the job with :class:`HorizontalSecureBoostError` naming who
dropped where. A drop during binning leaves the cuts, base margin and row count of the binning's
survivors (the first tree then starts with a restart). Those three are never recomputed: the cuts and
the base margin stay as binning computed them, and the binning's row count (an upper bound of the
active rows) keeps sizing the precision p; the root's row count is read off its histogram. Validation
losses before and after a drop are per-row means over different validation rows (early stopping
compares them as such). Envelope rounds of hsb.tree/hsb.bound/hsb.level use a tree *slot* that counts
every tree attempt and restart, so rebuilt trees never reuse a consumed round. A failing client tells
nobody (an abort would stop the server's whole job): the server counts it as dropped at its next
deadline; a dropped client that is still alive gets the restart without its name and stops with
:class:`ClientDroppedOut`.

What each role learns:

* server: the number of features, each client's per-feature min/max (unless ``feature_ranges`` is
  given; including whether a client has no value at all in a column), the global per-cell grid counts
  and per-feature missing-value counts, the total row count and label sum (binary: positives;
  regression: the sum of labels), each client's power-of-two gradient bound, the global
  per-node histograms of g, h and counts (hence the model), the summed validation loss, who
  survived each aggregation. Not a client's histogram, rows or labels (secure aggregation; plain
  kinds reveal client inputs). After a drop the sums are over the remaining clients; a rebuilt
  round's histograms are of new trees (the discarded round's are never subtracted from them), and
  the binning sums are not repeated.
* client: its own data; the cuts, the model (splits, thresholds, leaf weights) and the base margin;
  from the tree also aggregate information about other clients' data (as any shared model does);
  which clients dropped out.

Differential privacy (``dp``: :class:`~secureflhv.tree.tree_privacy.TreeDPParams`; record-level, one row of
one client): every client adds its Skellam share to each integer vector it submits (binning, each level's
histograms, each round's validation sums), so every party sees only noised sums (sensitivities, plan and
accounting: :mod:`secureflhv.tree.tree_privacy`). Changes under DP: public ``feature_ranges`` are required; p is
the job's public precision, h is quantised at q bits and counts weigh S each (balanced noise), hsb.bound carries
the public bound and the server ignores the clients' word; the server post-processes (grid and missing counts
clamped at 0, a feature has missing values when its count passes 4 noise std, row count >= 1, label sum in
[0, rows]; a node's G, H and count are the means over its virtual columns, H and HL clamped into [0, H],
min_child_weight on the noised H decides the candidates, not counts; validation: the clipped mean loss); it
accounts every aggregation, a discarded round's too, at its survivors (``privacy``, ``privacy_history``);
each client keeps its own bound (``privacy``). A resumed run is refused.

Checkpoints (the constructor's ``callbacks`` run after each round, ``resume=(arrays, state)`` continues
after one; :mod:`secureflhv.transport.lifecycle`, wired by :mod:`secureflhv.runtime.store.resume`): the
server saves the model after each boosting
round (trees, base margin, cuts, validation losses, best round: :func:`~.model.model_to_dict`) and its
tree times; a client saves the same model and its margins at the start of the next round (``margin``,
``vmargin``), when the server's first hsb.tree of that round confirms the round was kept with this
client in it. A resumed session runs hello and binning again (deterministic: the same cuts, which are
checked against the saved ones) and continues after the agreed round; its trees equal the
uninterrupted run's exactly (every histogram sum is exact). A resumed job starts with every client
active (they all took part in the step agreement).

Failures: the server and every client are :class:`~secureflhv.transport.role.ProtocolRole` roles; a
failing server tells every active client, a failing client tells nobody (it is a dropout, see above).
"""
from __future__ import annotations

import functools
import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..data.dataset import check_matrix
from ..proto import tree_pb2
from ..secagg import AggregationConfig, AggregationError, make_client, make_server
from ..transport import ProtocolError, Transport, TransportError, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto
from ..transport.lifecycle import Callback, Checkpoint, Lifecycle
from ..transport.collectives import broadcast, gather
from ..transport.role import ProtocolRole
from .binning import Binner, apply_bins, cuts_from_grid_counts, grid, grid_counts, missing_bin
from .model import BoostedModel, Node, Tree, model_from_dict, model_to_dict, plan_children, sibling
from .params import (SecureBoostParams, base_margin_from_sums, bound_log2, check_labels, dequantise,
                     gradients, loss, precision_bits_for, quantise)
from .rounds import level_round
from .split import beats_gamma, candidate_gains, leaf_weight
from .tree_privacy import TreeDP, TreeDPParams

log = logging.getLogger("secureflhv.tree.horizontal")

TAG_HELLO, TAG_RANGES, TAG_CUTS = "hsb.hello", "hsb.ranges", "hsb.cuts"
TAG_TREE, TAG_BOUND, TAG_LEVEL = "hsb.tree", "hsb.bound", "hsb.level"
AGG_SCALE_BITS = 40           # aggregation scale 2^40; entries are integers / 2^40
AGG_CLIP = float(2 ** 12)     # |integer| < 2^52  =>  |x| <= 2^12
LABEL_BITS = 20               # regression label sums are aggregated on a 2^-20 grid
LOSS_SCALE = float(2 ** 20)   # validation loss sums are sent divided by this (stays below the clip)


class HorizontalSecureBoostError(RuntimeError):
    """The horizontal training cannot go on (the server failed, fewer than t clients remain, a peer misbehaved)."""


class ClientDroppedOut(HorizontalSecureBoostError):
    """This client is no longer in the training (the server dropped it); it stops without telling anyone."""


class _Dropped(Exception):
    """Server-internal: clients were lost during the current boosting round; the round is rebuilt.

    ``lost``: client -> where it was lost; ``tag``/``rnd``: the message the remaining clients wait for
    (``rnd`` None: the next tree start, tag ``hsb.tree``).
    """

    def __init__(self, lost: dict[str, str], tag: str, rnd: int | None):
        super().__init__(f"lost {sorted(lost)}")
        self.lost, self.tag, self.rnd = dict(lost), tag, rnd


class _Restart(Exception):
    """Client-internal: the server's hsb restart message (a client dropped out; rebuild a round)."""

    def __init__(self, msg: tree_pb2.HsbLevel):
        super().__init__(f"restart at tree {msg.tree}")
        self.msg = msg


class _Resumable(Lifecycle):
    """Checkpoint state of server and client (see Checkpoints in the module docstring)."""

    family = "horizontal SecureBoost"

    def _round_done(self, done: int, arrays, model: BoostedModel, stopping: bool = False) -> bool:
        """Run the callbacks after round ``done`` (``arrays``: a function returning the role's arrays);
        a round that stops the training is not checkpointed. True: stop."""
        return self._after_step(done, lambda _step: (arrays(), {"model": model_to_dict(model)}), stopping=stopping,
                                save_when_stopping=False)

    def _restored_model(self, model: BoostedModel, arrays_needed: Sequence[str]) -> tuple[int, dict]:
        """Put ``resume``'s trees and validation record into ``model`` (fresh from binning); returns
        (rounds done, arrays) ((0, {}) without one). ValueError when the checkpoint is not a horizontal
        SecureBoost checkpoint of this configuration, or its cuts / base margin differ from binning's."""
        done, arrays, state = self._restored(self.params.n_trees, arrays_needed,
                                             lambda done, arrays, state: isinstance(state.get("model"), dict))
        if not done:
            return 0, {}
        saved = model_from_dict(state["model"])
        same_cuts = saved.cuts is not None and len(saved.cuts) == len(model.cuts) and \
            all(np.array_equal(a, b) for a, b in zip(saved.cuts, model.cuts))
        if not same_cuts or not np.array_equal(saved.base_margin, model.base_margin) or \
                len(saved.trees) != done * self.params.trees_per_round or saved.params != self.params:
            raise ValueError("checkpoint: its model does not continue this job (other cuts, base margin, "
                             "parameters or number of trees)")
        model.trees, model.val_losses, model.best_round = saved.trees, saved.val_losses, saved.best_round
        return done, arrays


def tree_aggregation_config(kind: str = "secagg", **overrides) -> AggregationConfig:
    """Aggregation settings under which integer histograms (< 2^52) are summed exactly.

    Threshold: ``threshold`` override (a count or a fraction of the job's clients) or the
    aggregation default (from ``max_colluders``); the roles fix it to one absolute t for the whole job
    (:func:`job_threshold`).
    """
    cfg = dict(kind=kind, clip=AGG_CLIP, precision_bits=AGG_SCALE_BITS, max_weight=1.0)
    cfg.update(overrides)
    return AggregationConfig(**cfg)


def job_threshold(cfg: AggregationConfig, client_ids: Sequence[str]) -> AggregationConfig:
    """``cfg`` with its threshold fixed to the absolute t of a job with ``client_ids``, and those as the job's
    clients (a participant list naming anyone else is refused: :func:`~secureflhv.secagg.exchange.check_round`).

    t is ``cfg.resolve_threshold(n)`` (default: the smallest t with n_C < 2t − n for n_C =
    ``cfg.max_colluders``); it stays the same when clients drop out (so n_C < 2t − n' holds for every
    n' <= n still running), and the job goes on while at least t remain. The server and every client
    derive the same t from the same config and client list (secagg's Shamir threshold).

    Raises:
        AggregationConfigError: too few clients for ``min_clients`` / ``max_colluders``, or a threshold too low
            for them (``field`` names which).
    """
    t = cfg.resolve_threshold(len(client_ids))
    return cfg.replace(threshold=t, job_clients=tuple(sorted(client_ids)))


def _check_agg(cfg: AggregationConfig) -> AggregationConfig:
    if cfg.kind != "plain" and (cfg.precision_bits != AGG_SCALE_BITS or cfg.clip < AGG_CLIP or cfg.max_weight < 1):
        raise ValueError("aggregation: use tree_aggregation_config(kind) (scale 2^40, clip 2^12, max_weight 1) "
                         "so histogram sums are exact")
    return cfg


def _check_dp(dp: TreeDPParams | None, cfg: AggregationConfig, *, public_ranges: bool) -> None:
    """ValueError naming the field when ``dp`` cannot hold: plain aggregation shows the server each client's vector
    with its own share of the noise only; min/max ranges reveal extremes (one row decides them)."""
    if dp is None:
        return
    if cfg.kind == "plain":
        raise ValueError("params.aggregation: params.dp needs secagg (plain shows the server every client's "
                         "histograms with only that client's share of the noise)")
    if not public_ranges:
        raise ValueError("params.feature_ranges: params.dp needs public feature ranges (a client's min/max or the "
                         "range sketch reveals extreme values, which one row decides)")


def _plan_dp(role: _Resumable, d: int, cfg: AggregationConfig) -> TreeDP:
    """The job's noise plan from public values (``d`` features, the job's t and c). ValueError naming the field:
    a resumed run, or what :meth:`TreeDP.of` refuses."""
    if role._resume is not None:
        raise ValueError("params.dp: resuming is not supported under DP (binning would release its sums again "
                         "with fresh noise; the accountant is not checkpointed)")
    return TreeDP.of(role.dp, role.params, d, int(cfg.threshold), int(cfg.max_colluders))


def _privacy_record(acc, tdp: TreeDP, **extra) -> dict:
    """JSON-ready: the accountant's record, the grid (p, q, S), the releases per kind and ``extra``."""
    rec = acc.record()
    kinds: dict[str, int] = {}
    for r in rec["releases"]:
        kinds[r["name"]] = kinds.get(r["name"], 0) + 1
    del rec["releases"]   # one entry per level of every tree: the counts per kind and the sensitivities suffice
    sens = {r.name: {"l2_sensitivity": r.l2_sensitivity, "l1_sensitivity": r.l1_sensitivity} for r, _ in acc.entries}
    return {**rec, "releases": kinds, "sensitivities": sens, "precision_bits": tdp.precision, "h_bits": tdp.h_bits,
            "count_scale": tdp.count_scale, "gradient_bound": tdp.bg, "hessian_bound": tdp.bh, **extra}


_F32_MAX = float(np.finfo(np.float32).max)


def check_ranges(m: tree_pb2.HsbRanges, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate an hsb.ranges payload: ``d`` (lo, hi) pairs, finite in float32 (the grid's dtype), lo <= hi;
    or both NaN (a client with no value in that column: all missing).

    Returns (lo, hi), float64 (d,) each. Raises ProtocolError naming the first bad feature.
    """
    if len(m.lo) != d or len(m.hi) != d:
        raise ProtocolError(f"ranges: {len(m.lo)} lo and {len(m.hi)} hi values, expected {d} features")
    lo, hi = np.array(m.lo, dtype=np.float64), np.array(m.hi, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(lo) & np.isfinite(hi) & (np.abs(lo) <= _F32_MAX) & (np.abs(hi) <= _F32_MAX) & (lo <= hi))
    bad &= ~(np.isnan(lo) & np.isnan(hi))
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
        """The layout of features with ``n_bins[j]`` bins each (offsets are the cumulative sums)."""
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
    """What the binning stage agrees on: the cuts per feature, the base margin, the total row count and
    which features have missing values at some client (their splits learn a default direction)."""

    cuts: list[np.ndarray]
    base_margin: np.ndarray
    n_rows: int
    missing: np.ndarray | None = None

    @property
    def binner(self) -> Binner:
        """A :class:`Binner` of these cuts (features with missing values learn a default direction)."""
        return Binner(self.cuts, np.zeros(len(self.cuts), bool) if self.missing is None else self.missing)


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
class HorizontalSecureBoostServer(_Resumable, ProtocolRole):
    """The data-less coordinator: agrees on bins, sums histograms via secure aggregation, grows trees.

    Stages (methods): :meth:`hello`, :meth:`binning`, then per tree :meth:`grow_tree` (one
    aggregation of histograms per level, :meth:`find_split` per node) and per round :meth:`validation`.

    Args:
        transport: the server's transport.
        client_ids: every client (at least t of them must remain; see Dropout in the module docstring).
        params: :class:`SecureBoostParams`.
        aggregation: :class:`AggregationConfig` (default ``tree_aggregation_config("secagg")``);
            its threshold is fixed by :func:`job_threshold` (ValueError when the job's clients are too few
            for its ``min_clients`` / ``max_colluders``).
        feature_ranges: optional public (lo, hi) per feature; then no client reveals its min/max.
        callbacks, resume: the role lifecycle (:mod:`secureflhv.transport.lifecycle`); a callback's stop
            request ends the training after that round, as early stopping does.

    Attributes (after :meth:`fit`): ``active`` (the clients that built the last round), ``dropped``
    (client -> where it was lost), ``threshold`` (max(t, 2)).
    """

    protocol = "horizontal SecureBoost"

    def __init__(self, transport: Transport, client_ids: Sequence[str], params, *,
                 aggregation: AggregationConfig | None = None, feature_ranges=None,
                 callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None,
                 dp: TreeDPParams | None = None):
        super().__init__(transport)
        self._init_lifecycle(callbacks, resume)
        self.client_ids = sorted(client_ids)
        if len(self.client_ids) < 2:
            raise ValueError("client_ids: horizontal SecureBoost needs at least two clients")
        self.params = params if isinstance(params, SecureBoostParams) else SecureBoostParams(**params)
        self.agg_config = job_threshold(_check_agg(aggregation or tree_aggregation_config()), self.client_ids)
        _check_dp(dp, self.agg_config, public_ranges=feature_ranges is not None)
        self.dp, self.tdp, self.acc = dp, None, None      # DP: the plan (d = len(feature_ranges)), the accountant
        if dp is not None:
            self.tdp = _plan_dp(self, len(feature_ranges), self.agg_config)
            self.acc = self.tdp.accountant()
        self.privacy_history: list[dict] = []             # DP: ε after each boosting round
        self._survivors = 0                               # of the last aggregation
        self.threshold = max(int(self.agg_config.threshold), 2)
        self.agg = make_server(transport, self.agg_config)
        self.feature_ranges = feature_ranges
        self._agg_round = 0
        self._slot = -1           # envelope slot of the last tree attempt (hsb.tree round = slot + 1)
        self.active = list(self.client_ids)    # the clients taking part (the aggregation participants)
        self.dropped: dict[str, str] = {}      # client -> where it was lost
        self._lost: dict[str, str] = {}        # lost since the clients last agreed on ``active``
        self.model: BoostedModel | None = None
        self.tree_seconds: list[float] = []

    def _peers(self) -> list[str]:
        return self.active

    def fit(self) -> BoostedModel:
        """Train; returns the model (global feature indices, bins, thresholds; exportable to XGBoost)."""
        return self._guarded(self._trained, self._fit)

    def _fit(self) -> BoostedModel:
        prm = self.params
        binning = self.binning(self.hello())
        self.cuts, self.n_rows = binning.cuts, binning.n_rows
        self.binner = binning.binner                      # virtual columns where some client has NaN
        self.layout = HistLayout.of(self.binner.n_bins)
        model = BoostedModel(prm, binning.base_margin, [], binning.cuts)
        self.model = model
        r, K = 0, prm.trees_per_round
        r, arrays = self._restored_model(model, ("tree_seconds",))
        if r:
            self.tree_seconds = arrays["tree_seconds"].tolist()
        if self._lost:   # lost during binning: the cuts are those of the binning's survivors
            self._restart(_Dropped(self._lost, TAG_TREE, None), r * K)
        while r < prm.n_trees:
            try:
                stop = self._boosting_round(r)
            except _Dropped as drop:
                del model.trees[r * K:], self.tree_seconds[r * K:]
                self._restart(drop, r * K)
                continue
            r += 1
            if self.acc is not None:
                self.privacy_history.append({"round": r, "epsilon": self.acc.epsilon(), "delta": self.tdp.plan.delta})
            if self._round_done(r, lambda: {"tree_seconds": np.array(self.tree_seconds)}, model, stop):
                break
        self._slot += 1
        self._send_all(TAG_TREE, tree_pb2.HsbLevel(tree=r * K, stop=True, keep_trees=len(model.trees)),
                       self._slot + 1, "stop")
        if self._lost:
            log.warning("%s: client(s) %s unreachable at the end (the model is complete)", self.party_id,
                        sorted(self._lost))
        return model

    def _boosting_round(self, r: int) -> bool:
        """Round ``r``: its trees and its validation, all over ``active``; True when early stopping ends
        the training. Raises _Dropped when a client is lost (the caller discards the round's trees)."""
        K = self.params.trees_per_round
        for k in range(K):
            self.model.trees.append(self.grow_tree(r * K + k, k))
        return self.validation(r)

    def _restart(self, drop: _Dropped, first: int) -> None:
        """Drop ``drop.lost`` for the rest of the training and tell the others to rebuild from tree ``first``.

        Raises:
            HorizontalSecureBoostError: fewer than t (or 2) clients remain; names who dropped where.
        """
        self.dropped.update(drop.lost)
        self._lost.clear()
        self.active = [c for c in self.active if c not in drop.lost]
        lost = "; ".join(f"{c} ({w})" for c, w in sorted(self.dropped.items()))
        if len(self.active) < self.threshold:
            raise HorizontalSecureBoostError(
                f"only {len(self.active)} of {len(self.client_ids)} clients remain, fewer than the threshold "
                f"t={self.threshold}; dropped: {lost}")
        log.warning("%s: dropped %s; rebuilding from tree %d with %s", self.party_id, lost, first, self.active)
        rnd = drop.rnd
        if rnd is None:
            self._slot += 1
            rnd = self._slot + 1
        msg = tree_pb2.HsbLevel(tree=first, restart=True, clients=self.active)
        self._send_all(drop.tag, msg, rnd, f"restart at tree {first}")
        for c in drop.lost:   # best effort: a dropped client that is still alive stops cleanly
            try:
                self.t.send(c, drop.tag, msg, round=rnd, timeout=2.0)
            except TransportError:
                pass

    # ------------------------------------------------------------------------------ stages
    def hello(self) -> int:
        """Every client's number of features; returns it (HorizontalSecureBoostError if they disagree)."""
        hello = self._recv_all(TAG_HELLO, 0, parse_message(tree_pb2.SbHello), "hello")
        if not hello:
            raise HorizontalSecureBoostError(f"no client said hello: {self._lost}")
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
        dim = sum(sizes) + d + 2
        release = None if self.tdp is None else self.tdp.binning_release(dim)
        tot = np.rint(self._aggregate(dim, "bin counts", None, release) * 2.0 ** AGG_SCALE_BITS)
        offs = np.concatenate([[0], np.cumsum(sizes)])
        missing_at = 0.0
        if release is not None:   # post-processing of the noised sums (clamps; costs no privacy)
            tot[:offs[-1] + d] = np.maximum(tot[:offs[-1] + d], 0.0)
            tot[-2] = max(tot[-2], 1.0)
            tot[-1] = min(max(tot[-1], 0.0), tot[-2])
            missing_at = self.tdp.missing_threshold(release, self._survivors)
        cuts = [cuts_from_grid_counts(tot[offs[j]:offs[j + 1]], grids[j], prm.max_bin) for j in range(d)]
        missing = tot[offs[-1]:offs[-1] + d] > missing_at       # global missing-value count per feature
        n_total = int(tot[-2])
        label_sum = tot[-1] * 2.0 ** -LABEL_BITS if prm.objective == "regression" else tot[-1]
        bm = base_margin_from_sums(label_sum, n_total, prm)
        cmsg = tree_pb2.HsbCuts(cuts=[tensor_to_proto(c, "<f8") for c in cuts], base_margin=bm.tolist(),
                                n_rows=n_total, missing=missing.tolist())
        self._send_all(TAG_CUTS, cmsg, 1, "cuts")
        return Binning(cuts, bm, n_total, missing)

    def grow_tree(self, seq: int, k: int) -> Tree:
        """Tree ``seq`` for output ``k``: the clients' gradient bounds fix the precision, then :meth:`_grow`."""
        ts = time.perf_counter()
        self._slot += 1
        slot = self._slot
        self._send_all(TAG_TREE, tree_pb2.HsbLevel(tree=seq), slot + 1, f"tree {seq}")
        bounds = self._recv_all(TAG_BOUND, slot + 1, parse_message(tree_pb2.HsbBound), f"tree {seq} bound")
        self._check_lost(TAG_LEVEL, level_round(slot, 0))
        if self.tdp is not None:   # DP: public values only, never the clients' word
            p, e = self.tdp.precision, self.tdp.log2_bound
        else:
            e = max(int(b.log2_bound) for b in bounds.values())
            p = precision_bits_for(self.n_rows, e)   # n_rows of the binning: an upper bound of the active rows
        tree = self._grow(seq, slot, p, e)
        tree.output = k
        self.tree_seconds.append(time.perf_counter() - ts)
        log.info("%s: tree %d in %.2fs", self.party_id, seq + 1, self.tree_seconds[-1])
        return tree

    def validation(self, r: int) -> bool:
        """One aggregation of [loss sum / 2^20, n_val] (zeros from a client without validation rows);
        returns whether early stopping ends the training after round ``r``."""
        if self.tdp is not None:
            return self._dp_validation(r)
        v = self._aggregate(2, f"validation loss of round {r}", (TAG_TREE, None)) * 2.0 ** AGG_SCALE_BITS
        n_val = int(round(v[1]))
        if not n_val:
            return False
        s = v[0] * LOSS_SCALE / 2.0 ** AGG_SCALE_BITS
        return self.model.record_validation(r, math.sqrt(s / n_val) if self.params.objective == "regression"
                                            else s / n_val)

    def _dp_validation(self, r: int) -> bool:
        """DP: the noised [Σ clipped loss, count] (:meth:`TreeDP.validation_vector`) when the job validates."""
        if not self.tdp.validation:
            return False
        rel = self.tdp.validation_release()
        v = np.rint(self._aggregate(2, f"validation loss of round {r}", (TAG_TREE, None), rel) * 2.0 ** AGG_SCALE_BITS)
        mean = self.tdp.validation_loss(v, self.tdp.noise_std(rel, self._survivors))
        return False if mean is None else self.model.record_validation(r, mean)

    @property
    def privacy(self) -> dict | None:
        """DP: the job's record (:meth:`SumAccountant.record` plus the precision, the ε after each round and
        the noise std per release kind); None without DP."""
        if self.acc is None:
            return None
        return _privacy_record(self.acc, self.tdp, history=self.privacy_history)

    def find_split(self, hist: np.ndarray, g: float, h: float, n_rows: int, p: int) -> HistSplit | None:
        """Best split of a node from its integer histogram (first maximum gain in (feature, bin) order).

        The gain of a split is :func:`~secureflhv.tree.split.split_gain` (Chen & Guestrin 2016, eq. 7,
        without gamma: ``_split_node`` compares it with gamma).

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
        lay = self.layout
        F = lay.n_cells
        g_all, h_all, c_all = hist[:F], hist[F:2 * F], hist[2 * F:]
        best_gain, best = -np.inf, None
        for j in range(len(lay.n_bins)):
            sl = lay.feature(j)
            cnt = c_all[sl]
            cum_c = np.cumsum(cnt)[:-1]
            GL = dequantise(np.cumsum(g_all[sl])[:-1], p)
            HL = dequantise(np.cumsum(h_all[sl])[:-1], p)
            if self.tdp is not None:   # DP: noised sums; min_child_weight on the clamped H decides, not counts
                HL, cum_c, cnt = np.clip(HL, 0.0, h), np.clip(np.rint(cum_c), 0, n_rows), None
            gain = candidate_gains(GL, HL, g, h, self.params, cnt, n_rows)
            if gain is None:
                continue
            b = int(np.argmax(gain))
            if gain[b] > best_gain:
                best_gain = float(gain[b])
                gl, hl, n_left = float(GL[b]), float(HL[b]), int(cum_c[b])
                best = HistSplit(j, b, best_gain, NodeSums(gl, hl, n_left),
                                 NodeSums(g - gl, h - hl, n_rows - n_left))
        return best

    # ------------------------------------------------------------------------------ tree growing
    def _grow(self, seq: int, slot: int, p: int, e: int) -> Tree:
        """Level by level: tell the clients the last splits and the nodes to histogram, aggregate, split."""
        prm = self.params
        tree = Tree()
        sums: dict[int, NodeSums] = {}   # known from the parent's split
        counts = {0: self.n_rows}        # the root's count is replaced by the active clients' (histogram)
        hists: dict[int, np.ndarray] = {}
        level, splits = [0], []
        for depth in range(prm.max_depth + 1):
            split_now = [nid for nid in level if depth < prm.max_depth and counts[nid] >= 2]
            for nid in level:
                if nid not in split_now:
                    s = sums[nid]
                    tree.nodes[nid] = Node(nid, value=leaf_weight(s.g, s.h, prm), sum_hess=s.h, n_rows=s.n_rows)
            plan = plan_children(split_now, counts) if split_now else []
            msg = self._level_message(tree, seq, depth, p, e, plan, splits, done=not split_now)
            self._send_all(TAG_LEVEL, msg, level_round(slot, depth), f"tree {seq} depth {depth}")
            if msg.done:
                return tree
            new = self._level_histograms(seq, depth, list(msg.build), plan, hists,
                                         (TAG_LEVEL, level_round(slot, depth + 1)))
            if depth == 0:
                counts[0] = int(self._node_totals(new[0])[2])
            splits, level = [], []
            for nid in split_now:
                best = self._split_node(tree, nid, new[nid], counts[nid], p)
                if best is None:
                    continue
                node = tree.nodes[nid]
                splits.append(dict(node=nid, feature=node.feature, bin=node.bin, threshold=node.threshold,
                                   default_left=node.default_left))
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

    def _level_histograms(self, seq: int, depth: int, build: list[int], plan, parents: dict[int, np.ndarray],
                          wait: tuple[str, int]):
        """Integer histograms of this level's nodes: ``build`` aggregated, the others parent - sibling."""
        size, F = self.layout.size, self.layout.n_cells
        release = None if self.tdp is None else self.tdp.level_release(len(self.layout.n_bins), size * len(build))
        built = self._aggregate(size * len(build), f"histograms of tree {seq} depth {depth}", wait, release)
        built = np.rint(built * 2.0 ** AGG_SCALE_BITS).reshape(len(build), size)
        if release is not None:   # DP: h onto g's grid 2^-p, counts in rows (floats; sums stay exact enough)
            built[:, F:2 * F] *= 2.0 ** (self.tdp.precision - self.tdp.h_bits)
            built[:, 2 * F:] /= self.tdp.count_scale
        new = {nid: built[i] for i, nid in enumerate(build)}
        for nid, derived in plan:
            if derived:
                new[nid] = parents[(nid - 1) // 2] - new[sibling(nid)]
        return new

    def _split_node(self, tree: Tree, nid: int, hist: np.ndarray, n_rows: int, p: int) -> HistSplit | None:
        """Add node ``nid``: split on the best candidate when its gain exceeds gamma (returned), else a leaf."""
        g, h, _ = self._node_totals(hist)
        g, h = float(dequantise(g, p)), float(dequantise(h, p))
        node = Node(nid, sum_hess=h, n_rows=n_rows)
        tree.nodes[nid] = node
        best = self.find_split(hist, g, h, n_rows, p)
        if best is not None and beats_gamma(best.gain, self.params):
            node.leaf, node.gain = False, best.gain
            # virtual (column, bin) -> real split; never value bin -1 (its mirror, every value left and
            # missing right, has the same gain and comes first)
            node.feature, node.bin, node.threshold, node.default_left = self.binner.split(best.feature, best.bin)
            return best
        node.value = leaf_weight(g, h, self.params)
        return None

    def _node_totals(self, hist: np.ndarray) -> tuple[float, float, float]:
        """A node's (G, H, count) on the histogram's grid: the sums over feature 0's bins; under DP the mean over
        all virtual columns (each is a noised copy of the same totals: V times less noise variance), H and the
        count clamped at 0."""
        F, lay = self.layout.n_cells, self.layout
        if self.tdp is None:
            sl = lay.feature(0)
            return hist[:F][sl].sum(), hist[F:2 * F][sl].sum(), hist[2 * F:][sl].sum()
        V = len(lay.n_bins)
        g, h, c = (float(hist[k * F:(k + 1) * F].sum()) / V for k in range(3))
        return g, max(h, 0.0), max(round(c), 0)

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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # a column missing at every client
            lo, hi = np.nanmin(los, axis=0), np.nanmax(his, axis=0)
        return np.nan_to_num(lo, nan=0.0), np.nan_to_num(hi, nan=0.0)

    def _aggregate(self, dim: int, what: str, wait: tuple[str, int | None] | None, release=None) -> np.ndarray:
        """One aggregation over ``active``; its non-survivors join the lost clients.

        ``wait``: where the clients wait next; when given, a lost client raises :class:`_Dropped` (the
        sum is not over ``active``), when None (binning) the sum of the survivors is returned. ``release``
        (DP): the noised sum is accounted at its survivors before anything else (even a discarded sum was seen).
        """
        self._agg_round += 1
        try:
            res = self.agg.aggregate(self._agg_round, self.active, dim)
        except (AggregationError, TransportError) as exc:
            raise HorizontalSecureBoostError(f"aggregation of {what} failed (dropped before: "
                                             f"{self.dropped or 'none'}): {exc}") from exc
        self._survivors = len(res.survivors)
        if release is not None:
            try:
                self.tdp.step(self.acc, release, self._survivors)
            except ValueError as exc:
                raise HorizontalSecureBoostError(f"differential privacy of {what}: {exc}") from exc
        for c in res.dropped:
            self._lost.setdefault(c, f"{what}, aggregation stage {res.dropped_at.get(c, '?')}")
        if wait is not None:
            self._check_lost(*wait)
        return res.total

    def _check_lost(self, tag: str, rnd: int | None) -> None:
        """Raise :class:`_Dropped` when a client was lost in this round (the others wait for ``tag``/``rnd``)."""
        if self._lost:
            raise _Dropped(self._lost, tag, rnd)

    def _live(self) -> list[str]:
        return [c for c in self.active if c not in self._lost]

    def _recv_all(self, tag: str, rnd: int, parse, what: str) -> dict:
        """``tag`` from every live client, each within the transport's deadline. Dropout policy "drop": a silent
        or unreachable client is recorded as lost and the round is rebuilt without it (JobAborted is fatal)."""
        got = gather(self.t, self._live(), tag, rnd, None, "drop", parse, shared=False, failures=(TransportError,))
        for c, drop in got.dropped.items():
            log.warning("%s: client %s lost (%s): %s", self.party_id, c, what, drop.error)
            self._lost[c] = f"{what}: {type(drop.error).__name__}"
        return got.values

    def _send_all(self, tag: str, msg, rnd: int, what: str) -> None:
        """Send to every live client in turn. Dropout policy "drop": one that cannot be reached is recorded as
        lost (the round is then rebuilt without it)."""
        sent = broadcast(self.t, self._live(), tag, msg, rnd, None, "drop")
        for c, drop in sent.dropped.items():
            log.warning("%s: client %s lost (%s): %s", self.party_id, c, what, drop.error)
            self._lost[c] = f"{what}: unreachable"


# ============================================================================================ client
class HorizontalSecureBoostClient(_Resumable, ProtocolRole):
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
        callbacks, resume: the role lifecycle (:mod:`secureflhv.transport.lifecycle`); the server decides
            when to stop.
    """

    protocol = "horizontal SecureBoost"

    def __init__(self, transport: Transport, server_id: str, client_ids: Sequence[str], X, y, params, *,
                 X_val=None, y_val=None, aggregation: AggregationConfig | None = None, send_ranges: bool = True,
                 callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None,
                 dp: TreeDPParams | None = None):
        super().__init__(transport)
        self._init_lifecycle(callbacks, resume)
        self.server_id = server_id
        self.client_ids = sorted(client_ids)
        self.params = params if isinstance(params, SecureBoostParams) else SecureBoostParams(**params)
        self.X = check_matrix(X, "X", allow_nan=True)
        self.y = check_labels(y, self.params)
        if len(self.y) != len(self.X):
            raise ValueError(f"y: {len(self.y)} labels for {len(self.X)} rows")
        self.X_val = None if X_val is None else check_matrix(X_val, "X_val", allow_nan=True)
        self.y_val = None if y_val is None else check_labels(y_val, self.params)
        cfg = job_threshold(_check_agg(aggregation or tree_aggregation_config()), self.client_ids)
        _check_dp(dp, cfg, public_ranges=not send_ranges)
        self.agg_config, self.dp, self.tdp, self.acc = cfg, dp, None, None
        if dp is not None:   # this client's own bound: every release it submits, at the plan's variance
            self.tdp = _plan_dp(self, self.X.shape[1], cfg)
            self.acc = self.tdp.accountant()
        self.agg = make_client(transport, server_id, cfg)
        self.send_ranges = send_ranges
        self._agg_round = 0
        self._slot = -1                           # envelope slot of the last tree start (as the server's)
        self.active = list(self.client_ids)       # the aggregation participants, as the server last said
        self.model: BoostedModel | None = None

    def _peers(self) -> list[str]:
        return [self.server_id]

    def _abort_message(self, exc: BaseException) -> None:
        """A failing client is a dropout: it tells nobody (an abort would stop the server's whole job);
        the server notices at its next deadline and goes on while t clients remain."""
        log.warning("%s: leaving horizontal SecureBoost (a dropout for the server): %s: %s", self.party_id,
                    type(exc).__name__, exc)
        return None

    def fit(self) -> BoostedModel:
        """Train with the server; returns the shared model (same as the server's)."""
        return self._guarded(self._trained, self._fit)

    def _fit(self) -> BoostedModel:
        prm = self.params
        self.hello()
        binning = self.binning()
        self.n_total = binning.n_rows
        self.binner = binning.binner
        self.layout = HistLayout.of(self.binner.n_bins)
        self.hist_bins = self.binner.virtual_bins(self.X)     # histograms over virtual columns
        self.model = BoostedModel(prm, binning.base_margin, [], binning.cuts)
        bins = apply_bins(self.X, binning.cuts, allow_nan=True)
        vbins = None if self.X_val is None else apply_bins(self.X_val, binning.cuts, allow_nan=True)
        base = lambda b: None if b is None else np.tile(binning.base_margin, (len(b), 1)).astype(np.float64)  # noqa: E731
        starts = {0: (base(bins), base(vbins))}   # margins at the start of a round (the last two rounds)
        K = prm.trees_per_round
        r, arrays = self._restored_model(self.model, ("margin",) + (() if vbins is None else ("vmargin",)))
        if r:
            saved = arrays["margin"], arrays.get("vmargin")
            for fresh, old in zip(starts[0], saved):
                if (fresh is None) != (old is None) or (fresh is not None and fresh.shape != old.shape):
                    raise ValueError("checkpoint: margins of another shape")
            starts = {r: tuple(None if m is None else np.array(m) for m in saved)}
        self._saved = r
        while True:
            margin, vmargin = (None if m is None else m.copy() for m in starts[r])
            del self.model.trees[r * K:]
            self._pending = (r, starts[r])
            try:
                stop = self._boosting_round(r, bins, vbins, margin, vmargin)
            except _Restart as rs:
                r = self._apply_restart(rs.msg, sorted(starts), K)
                continue
            if stop is not None:
                return self._keep(stop)
            starts = {r: starts[r], r + 1: (margin, vmargin)}
            r += 1

    def _boosting_round(self, r: int, bins, vbins, margin: np.ndarray, vmargin) -> tree_pb2.HsbLevel | None:
        """Round ``r``: its trees (``margin``/``vmargin`` updated in place) and its validation loss.

        Returns the server's stop message instead when training is over. Raises :class:`_Restart`
        when the server rebuilds a round without a dropped client.
        """
        prm, K = self.params, self.params.trees_per_round
        g, h = gradients(margin, self.y, prm)
        if self.tdp is not None:
            g, h = self.tdp.clipped_gradients(g, h)
        for k in range(K):
            start = self._next_tree()
            if start.stop:
                return start
            if r >= prm.n_trees:
                raise HorizontalSecureBoostError("server wants more trees than params.n_trees")
            tree = self.grow_tree(r * K + k, k, bins, g[:, k], h[:, k])
            self.model.trees.append(tree)
            margin[:, k] += tree.predict_bins(bins)
            if vbins is not None:
                vmargin[:, k] += tree.predict_bins(vbins)
        self.validation(vbins, vmargin)
        return None

    def _next_tree(self) -> tree_pb2.HsbLevel:
        """hsb.tree of the next slot: a tree start, the stop, or a restart (raised as _Restart)."""
        self._slot += 1
        msg = self._recv(TAG_TREE, self._slot + 1, self._level_parser(lambda m: m))
        if msg.restart:
            raise _Restart(msg)
        done, (margin, vmargin) = self._pending
        if done > self._saved:  # the server kept round done - 1 with this client: checkpoint it
            self._round_done(done, lambda: {"margin": margin, **({} if vmargin is None else {"vmargin": vmargin})},
                             self.model)  # a client follows the server's stop, it asks for none
            self._saved = done
        return msg

    def _apply_restart(self, msg: tree_pb2.HsbLevel, rounds: list[int], K: int) -> int:
        """Take the server's new client set; returns the round to rebuild (its first tree is ``msg.tree``).

        Raises:
            ClientDroppedOut: this client is not in the set any more (it stops; it tells nobody).
            HorizontalSecureBoostError: the round is not one this client can rebuild (server bug).
        """
        if self.party_id not in msg.clients:
            raise ClientDroppedOut(f"{self.party_id}: the server dropped this client at tree {msg.tree} "
                                   f"(going on with {list(msg.clients)}); stopping")
        if msg.tree % K or msg.tree // K not in rounds:
            raise HorizontalSecureBoostError(f"server restarts at tree {msg.tree}; this client can rebuild "
                                             f"rounds {rounds} only")
        log.warning("%s: client(s) %s dropped out; rebuilding from tree %d", self.party_id,
                    sorted(set(self.active) - set(msg.clients)), msg.tree)
        self.active = list(msg.clients)
        return msg.tree // K

    # ------------------------------------------------------------------------------ stages
    def hello(self) -> None:
        """hsb.hello: the number of features; hsb.ranges: this client's min/max (unless ranges are public)."""
        self.t.send(self.server_id, TAG_HELLO, tree_pb2.SbHello(n_features=self.X.shape[1]))
        if self.send_ranges:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN column: NaN, NaN
                lo, hi = np.nanmin(self.X, axis=0), np.nanmax(self.X, axis=0)
            self.t.send(self.server_id, TAG_RANGES, tree_pb2.HsbRanges(lo=lo.tolist(), hi=hi.tolist()), round=1)

    def binning(self) -> Binning:
        """Global ranges in; grid counts + row count + label sum into one aggregation; cuts and base margin out."""
        prm, (n, d) = self.params, self.X.shape

        lo, hi = self._recv(TAG_RANGES, 1, parse_message(tree_pb2.HsbRanges, functools.partial(check_ranges, d=d)))
        present = ~np.isnan(self.X)
        counts = [grid_counts(self.X[present[:, j], j], grid(lo[j], hi[j], prm.sketch_bins)) for j in range(d)]
        label = np.sum(quantise(self.y, LABEL_BITS)) if prm.objective == "regression" else np.sum(self.y)
        if self.tdp is not None and prm.objective == "multiclass":
            label = 0.0   # unused (base margin 0): not released
        n_missing = (~present).sum(axis=0).astype(np.float64)
        vec = np.concatenate(counts + [n_missing, [n, label]])
        self._submit_ints(vec, None if self.tdp is None else self.tdp.binning_release(len(vec)))
        return self._recv(TAG_CUTS, 1, parse_message(tree_pb2.HsbCuts, lambda m: self._check_cuts(m, d)))

    def grow_tree(self, seq: int, k: int, bins: np.ndarray, g: np.ndarray, h: np.ndarray) -> Tree:
        """Tree ``seq`` for output ``k``: send the bound of |g|, |h|, then one histogram vector per level."""
        e = bound_log2(g, h) if self.tdp is None else self.tdp.log2_bound   # DP: the public bound, not ours
        self.t.send(self.server_id, TAG_BOUND, tree_pb2.HsbBound(log2_bound=e), round=self._slot + 1)
        tree = self._grow(seq, bins, g, h)
        tree.output = k
        return tree

    def validation(self, vbins: np.ndarray | None, vmargin: np.ndarray | None) -> None:
        """Submit [validation loss sum / 2^20, n_val] (zeros without validation rows) for early stopping; under DP
        the noised [Σ clipped loss, count] of :meth:`TreeDP.validation_vector`, only when the job validates."""
        if self.tdp is not None:
            if self.tdp.validation:
                vm = None if vbins is None else vmargin
                self._submit_ints(self.tdp.validation_vector(vm, self.y_val), self.tdp.validation_release())
            return
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
            msg = self._recv(TAG_LEVEL, level_round(self._slot, depth),
                             self._level_parser(lambda m: self._check_level(m, seq, depth, rows_of)))
            if msg.restart:
                raise _Restart(msg)
            if p is None:
                p, q = int(msg.precision_bits), int(msg.precision_bits)
                if self.tdp is not None:   # DP: the job's public grid
                    ok = p == self.tdp.precision and int(msg.log2_bound) == self.tdp.log2_bound
                    q = self.tdp.h_bits
                else:
                    ok = p == precision_bits_for(self.n_total, int(msg.log2_bound))
                if not ok or int(msg.log2_bound) < bound_log2(g, h):
                    raise HorizontalSecureBoostError(f"server announced precision {p} / bound 2^{msg.log2_bound} "
                                                     "inconsistent with this client's gradients")
                gq, hq = quantise(g, p), quantise(h, q)
            for s in msg.splits:
                nid = int(s.node)
                rows = rows_of[nid]
                col = bins[rows, s.feature]
                left = np.where(col == missing_bin(col.dtype), s.default_left, col.astype(np.int64) <= s.bin)
                tree.nodes[nid] = Node(nid, leaf=False, feature=int(s.feature), bin=int(s.bin),
                                       threshold=float(s.threshold), default_left=bool(s.default_left))
                rows_of[2 * nid + 1], rows_of[2 * nid + 2] = rows[left], rows[~left]
            if msg.done:
                for lf in msg.leaves:
                    tree.nodes[int(lf.node)] = Node(int(lf.node), value=float(lf.value))
                return tree
            hist = self._histograms(msg.build, rows_of, self.hist_bins, gq, hq)
            if self.tdp is not None:
                hist[:, 2 * self.layout.n_cells:] *= self.tdp.count_scale
            self._submit_ints(hist.ravel(), None if self.tdp is None else
                              self.tdp.level_release(len(self.layout.n_bins), hist.size))
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
        if len(m.missing) not in (0, d):
            raise ProtocolError(f"cuts: {len(m.missing)} missing-value flags for {d} features")
        missing = np.array(m.missing, dtype=bool) if len(m.missing) else np.zeros(d, dtype=bool)
        return Binning(cuts, np.array(m.base_margin), int(m.n_rows), missing)

    def _level_parser(self, check):
        """Parse an HsbLevel: a restart must name a non-empty subset of the active clients, else ``check``."""
        def validate(m: tree_pb2.HsbLevel):
            if not m.restart:
                return check(m)
            names = list(m.clients)
            if not names or len(set(names)) != len(names) or not set(names) <= set(self.active):
                raise ProtocolError(f"restart: clients {names} are not a subset of the active {self.active}")
            return m
        return parse_message(tree_pb2.HsbLevel, validate)

    def _check_level(self, m: tree_pb2.HsbLevel, seq: int, depth: int, rows_of: dict):
        cuts, missing = self.binner.cuts, self.binner.missing
        if m.tree != seq or m.depth != depth:
            raise ProtocolError(f"level message for tree {m.tree} depth {m.depth}, expected {seq}/{depth}")
        for s in m.splits:
            # value bin len(cuts) (every present value left) only where missing values exist
            if (int(s.node) not in rows_of or not 0 <= s.feature < len(cuts)
                    or not 0 <= s.bin < len(cuts[s.feature]) + int(missing[s.feature])):
                raise ProtocolError(f"split of node {s.node} on feature {s.feature} bin {s.bin} is invalid")
        return m

    def _keep(self, stop: tree_pb2.HsbLevel) -> BoostedModel:
        """The model cut to the server's ``keep_trees`` (early stopping keeps the best round)."""
        self.model.trees = self.model.trees[:stop.keep_trees]
        return self.model

    def _submit(self, vector: np.ndarray) -> None:
        self._agg_round += 1
        self.agg.submit(self._agg_round, self.active, vector, 1.0)

    def _submit_ints(self, ints: np.ndarray, release) -> None:
        """Submit an integer vector (< 2^52) as x = m / 2^40; with a DP ``release``, plus this client's noise share
        (accounted in its own bound at the plan's variance)."""
        if release is not None:
            ints = self.tdp.noised(ints, release, self._agg_round + 1, self.party_id)
            self.acc.step(release, self.tdp.plan.variance(release))
        self._submit(np.asarray(ints, dtype=np.float64) * 2.0 ** -AGG_SCALE_BITS)

    @property
    def privacy(self) -> dict | None:
        """DP: this client's own record (every release it submitted, at the plan's variance: an upper bound of
        the server's figure that needs no trust in its survivor counts); None without DP."""
        return None if self.acc is None else _privacy_record(self.acc, self.tdp, bound="client")

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
