"""Vertical SecureBoost: the guest holds labels (and some columns), hosts hold the other columns.

After Cheng et al., "SecureBoost: A Lossless Federated Learning Framework" (arXiv 1901.08755, Alg. 1-3)
with the SecureBoost+ engineering (Chen et al., arXiv 2110.10927: GH packing, histogram subtraction,
cipher compression; the subtraction of a derived node's candidate sums moved to the guest, in
plaintext, ours). Rows are already aligned (PSI, :mod:`secureflhv.vertical.psi`).

One tree (``[[.]]`` = Paillier under the guest's key; round ids ``tree * 64 + depth + 1``)::

    guest        g, h from the labels and current margins; quantised to integers at p fraction bits
                 (params.precision_bits_for); [[pack(g_i, h_i)]] per row (2 slots, one ciphertext)
    guest->hosts SbTreeStart: p, the power-of-two bound of |g|, |h|, the part layout; then the n
                 ciphertexts in SbRowPart messages (``part_rows`` rows each), each sent as soon as
                 its rows are encrypted and acknowledged by the host (at most ROW_PART_WINDOW
                 outstanding), so a host decodes part k while the guest encrypts part k + 1
    for depth = 0 .. max_depth:
      guest->hosts SbLevelPlan: the row partitions of the splits of the previous level; the nodes to
                   split now; for each pair of children which one is built and which derived
      host         encrypted histograms of the built nodes (the smaller child, row by row),
                   cumulative over bins, candidates = (feature, bin) with rows in the
                   bin and rows right of it, identical partitions dropped (first in (feature, bin)
                   order kept), shuffled, compressed ~18 per ciphertext -> SbHistograms; for a
                   derived node no sums but, per candidate, the parent's candidate and the sibling's
                   term with the same left rows (``_derivation``): no compression or decryption for it
      guest        decrypts; derived nodes: parent's sums - sibling's in plaintext (exact);
                   gain per candidate (its own in plaintext), best per node: the first maximum
                   in the order guest columns, host 1, host 2, ... (within a host: its shuffle order)
      guest->host  SbDecision: only that host's winning candidate ids (plus any candidates with exactly
                   the same gain: the host takes the first in its (feature, bin) order, so ties are
                   broken as in the centralised model; the host learns that these candidates tie)
      host->guest  SbSplitResults: per won node a record id of its private lookup table
                   (feature, bin, threshold) and the left/right partition of the node's rows;
                   the guest checks that the partition's hessian sum equals the decrypted one
    leaves: weight -lr G/(H + lambda), known to the guest only

Missing values (NaN) follow XGBoost's sparsity-aware split finding (Chen & Guestrin 2016, Alg. 3)
without a change to the messages: each party's :class:`~secureflhv.tree.binning.Binner` gives a column
with NaN in the training rows two virtual columns (missing bin last: missing rows go right; missing bin
first: they go left), so the encrypted histograms carry the missing-value bucket and the candidates
cover both default directions; a won candidate maps back to (feature, bin, threshold, default_left),
which for a host split stays in the host's table. A host's candidate count is bounded by
2 * max_bin per feature it declared. Prediction: each owner routes a NaN by its split's default_left.

The role methods are these stages: guest :meth:`~SecureBoostGuest._encrypt_gradients` (SbTreeStart,
SbRowPart), ``_open_level`` / ``_send_plan`` (SbLevelPlan), ``_find_splits`` (SbHistograms -> one
:class:`SplitCandidate` per node), ``_apply_splits`` (SbDecision, SbSplitResults); host
``_receive_rows``, ``_apply_partitions``, ``_aggregate_histograms``, ``_send_candidates``,
``_apply_decision``. Encryption and the encrypted histogram arithmetic are
:class:`secureflhv.crypto.homomorphic.backend.PairSums` (Paillier or, for the plaintext baseline, identity); their wire
encoding is :mod:`secureflhv.transport.he_codec`.
Each role's ``phases`` (:class:`PhaseLog`) records wall and CPU seconds per tree, phase and depth
(``benchmarks/secureboost.py --phases`` prints them).

Prediction (:meth:`SecureBoostGuest.predict`): level by level over all trees at once, the guest asks
each host which way the rows sitting at its nodes go (SbRouteRequest/Reply): at most ``max_depth``
rounds per host. Early stopping uses the same routing on the validation rows after every round.

What each role learns (semi-honest; SecureBoost's known leakage is stated, not removed):

* guest: labels and its columns (its own); the decrypted cumulative (G_L, H_L) of every host candidate
  of every node (hence the hosts' per-node bin histograms up to shuffling, SecureBoost's design);
  for a derived node, which of its candidates correspond to which of its parent's and sibling's (also
  computable from the sums: a parent's candidate sum is its children's sums of that candidate);
  the row partition of every split, including host splits (Cheng et al. sec. 5, "the active party
  learns the instance space"); never a host's feature id or threshold (record ids are opaque).
* host: every node's row set (the partitions are broadcast so hosts can build histograms, as in
  SecureBoost), the number of rows, p and the power-of-two bound of |g| (regression: the scale of the
  residuals), its own won splits; nothing about g, h or labels (IND-CPA Paillier), nothing about the
  guest's or other hosts' features or thresholds, nor leaf weights.
* prediction: a host learns which of the queried rows reach its nodes and answers only for those.
* missing values: with a host column holding NaN the guest's decrypted candidate sums also give the
  (G, H) of that column's missing rows in every node (the difference of the two directions' sums)
  and, through the partitions, which rows a host split sends the default way; the guest does not
  learn which column or which direction.

Errors: a histogram under another key, of the wrong shape or packing, a derivation whose indices leave
the parent's or sibling's candidates, a bad partition mask, an unknown candidate or record id is
rejected (ProtocolError in the parse callback, logged; the wait goes on).
A silent or dead host ends the job with :class:`SecureBoostError` naming the host, tree and depth; the
role tells its peers (Transport.abort) before raising.
"""
from __future__ import annotations


import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..compute import executor as _ex
from ..crypto.homomorphic.backend import PairSums
from ..crypto.homomorphic.key_prefetch import resolve_keypair
from ..data.dataset import check_matrix
from ..proto import tree_pb2
from ..transport.he_codec import backend_and_codec
from ..transport.lifecycle import Callback, Checkpoint, Lifecycle
from ..transport.role import ProtocolRole
from ..transport.row_parts import MAX_ROW_PARTS, ROW_PART_ROUNDS, ROW_PART_WINDOW, part_rows
from ..transport import ProtocolError, Transport, TransportError, parse_message
from .binning import Binner
from .model import BoostedModel, Node, Tree, model_from_dict, model_to_dict, plan_children, sibling
from .routing import left_masks
from .params import (SecureBoostParams, base_margin, bound_log2, check_labels, dequantise, gradients, loss,
                     precision_bits_for, quantise, transform)
from .rounds import level_round
from .split import beats_gamma, candidate_gains, leaf_weight

log = logging.getLogger("secureflhv.tree.vertical")

TAG_SETUP, TAG_HELLO, TAG_START = "sb.setup", "sb.hello", "sb.start"
TAG_PLAN, TAG_HIST, TAG_DECIDE, TAG_SPLIT = "sb.plan", "sb.hist", "sb.decide", "sb.split"
TAG_ROUTE, TAG_ROUTED = "sb.route", "sb.routed"
TAG_ROWS, TAG_ROWS_ACK = "sb.rows", "sb.rows_ack"
class SecureBoostError(RuntimeError):
    """The federated training or prediction cannot go on (a peer failed, went silent or misbehaved)."""


def _part_rnd(tree: int, part: int) -> int:
    return ROW_PART_ROUNDS.pack(tree=tree, part=part) + 1


class PhaseLog:
    """Wall and CPU seconds per (tree, phase, depth) of one role, for profiles (``benchmarks/secureboost.py``).

    ``cpu_clock``: a callable returning CPU seconds (default :func:`time.process_time`: this process,
    all threads; a benchmark may count worker processes too). Guest and host phases mostly alternate
    (one waits while the other works), so process-wide CPU deltas are attributable to the phase.
    ``records``: list of (tree, phase, depth, wall_s, cpu_s); depth -1 = not per level.
    """

    def __init__(self):
        self.records: list[tuple[int, str, int, float, float]] = []
        self.cpu_clock = time.process_time
        self._open: tuple | None = None

    def start(self, tree: int, phase: str, depth: int = -1) -> None:
        """End the open phase (if any) and open this one."""
        self.stop()
        self._open = (tree, phase, depth, time.perf_counter(), self.cpu_clock())

    def stop(self) -> None:
        """End the open phase (if any) and record its wall and CPU seconds."""
        if self._open is not None:
            tree, phase, depth, w0, c0 = self._open
            self.records.append((tree, phase, depth, time.perf_counter() - w0, self.cpu_clock() - c0))
            self._open = None


# --------------------------------------------------------------------------------- wire helpers
def pack_mask(mask: np.ndarray) -> bytes:
    """A boolean row mask (n,) as bytes, eight rows per byte (``np.packbits``, big-endian bit order)."""
    return np.packbits(np.asarray(mask, dtype=bool)).tobytes()


def unpack_mask(data: bytes, n: int, what: str) -> np.ndarray:
    """The boolean (n,) mask of :func:`pack_mask`'s bytes. ProtocolError (naming ``what``) for a wrong length
    or bits set beyond row ``n``.
    """
    if len(data) != (n + 7) // 8:
        raise ProtocolError(f"{what}: mask of {len(data)} bytes for {n} rows (expected {(n + 7) // 8})")
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    if bits[n:].any():
        raise ProtocolError(f"{what}: mask has bits set beyond row {n}")
    return bits[:n].astype(bool)


def _leaf_values(tree: Tree, pos: np.ndarray, n_rows: int) -> np.ndarray:
    """The leaf value of every row, given the node each row has reached."""
    vals = np.zeros(n_rows)
    for nid in np.unique(pos).tolist():
        vals[pos == nid] = tree.nodes[nid].value
    return vals


def _route_reply_parser(host: str, lens: list[int]):
    def validate(m: tree_pb2.SbRouteReply):
        if len(m.left_masks) != len(lens):
            raise ProtocolError(f"route reply from {host}: {len(m.left_masks)} masks for {len(lens)} queries")
        return [unpack_mask(b, k, f"route reply from {host}") for b, k in zip(m.left_masks, lens)]
    return parse_message(tree_pb2.SbRouteReply, validate)


@dataclass
class TrainResult:
    """Guest: the model (host splits by record id), validation losses, seconds per tree."""

    model: BoostedModel
    tree_seconds: list[float] = field(default_factory=list)
    stopped_early: bool = False


@dataclass
class SplitCandidate:
    """The best split of one node found so far by the guest (Cheng et al. 2021, Alg. 2).

    ``owner`` is "guest" (``feature``, ``bin``: its own column and bin) or a host id (``candidate``: the
    id in that host's shuffled candidate table of the node; ``tied``: every id with exactly this gain,
    the host takes the first in its (feature, bin) order; ``tied_hess``: their left hessian sums, which
    the host's returned partition must match).
    """

    gain: float
    owner: str
    feature: int = -1
    bin: int = -1
    candidate: int = -1
    tied: list[int] = field(default_factory=list)
    tied_hess: set[float] = field(default_factory=set)


def _gain_of(cand: SplitCandidate | None) -> float:
    return -np.inf if cand is None else cand.gain


@dataclass
class _GrowingTree:
    """The guest's state of the tree being grown: quantised g, h, rows per node, leaves, partitions."""

    seq: int
    p: int
    gq: np.ndarray
    hq: np.ndarray
    sums: PairSums
    tree: Tree = field(default_factory=Tree)
    rows_of: dict[int, np.ndarray] = field(default_factory=dict)
    totals: dict[int, tuple[float, float]] = field(default_factory=dict)
    leaf_rows: dict[int, np.ndarray] = field(default_factory=dict)
    partitions: list[tuple[int, np.ndarray]] = field(default_factory=list)
    derived: set[int] = field(default_factory=set)  # this level's nodes whose host sums are parent - sibling
    host_sums: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)  # (G_L, H_L)

    def __post_init__(self):
        self.rows_of[0] = np.arange(len(self.gq))

    def sum_gh(self, rows: np.ndarray) -> tuple[float, float]:
        return float(dequantise(self.gq[rows].sum(), self.p)), float(dequantise(self.hq[rows].sum(), self.p))


def _trees_done(done: int, arrays: dict, state: dict) -> bool:
    return isinstance(state.get("trees_done"), int)


class _Role(Lifecycle, ProtocolRole):
    protocol = "SecureBoost"
    # checkpoints (runtime/store/resume.py): state after each boosting round (step = rounds done); the key is
    # not kept: a resumed session makes a fresh one, which changes no tree (every decryption is exact)
    family = "SecureBoost"

    def __init__(self, transport: Transport, params, backend, callbacks: Sequence[Callback] = (),
                 resume: Checkpoint | None = None):
        super().__init__(transport)
        self._init_lifecycle(callbacks, resume)
        self.params = params if isinstance(params, SecureBoostParams) else SecureBoostParams(**params)
        # an explicit backend wins (the plaintext benchmark baseline); else the job's he_scheme
        self.he, self.wire = backend_and_codec(self.params.he_scheme if backend is None else backend)
        self.phases = PhaseLog()


# ============================================================================================ guest
class SecureBoostGuest(_Role):
    """The label holder: drives training, decrypts histograms, owns the tree structure and leaves.

    Args:
        transport: this party's transport.
        host_ids: hosts in a fixed order (the tie-break order of equal gains).
        X: float (n, d_g) guest columns (rows aligned with every host), NaN = missing; y: labels (n,).
        params: :class:`SecureBoostParams` (or dict).
        X_val, y_val: optional validation rows (aligned with the hosts' validation rows).
        cuts: guest bin cuts (default: :func:`~secureflhv.tree.binning.fit_cuts` of X, NaN ignored).
        keypair: (public, private) of ``params.he_scheme``, or a Future of one
            (:func:`~secureflhv.crypto.homomorphic.key_prefetch.prefetch_keypair`); default: generated with ``params.key_bits``.
        backend: None (default: ``params.he_scheme``, "paillier" or "ou") or "identity" (NO encryption:
            the plaintext baseline of ``benchmarks/secureboost.py``; never use it with real data).
        callbacks, resume: the role lifecycle (:mod:`secureflhv.transport.lifecycle`): run after every boosting
            round; a stop request (or early stopping on the validation loss) ends the training there.
    """

    def __init__(self, transport: Transport, host_ids: Sequence[str], X, y, params, *, X_val=None, y_val=None,
                 cuts=None, keypair=None, backend=None, callbacks: Sequence[Callback] = (),
                 resume: Checkpoint | None = None):
        super().__init__(transport, params, backend, callbacks, resume)
        self.host_ids = list(host_ids)
        if not self.host_ids:
            raise ValueError("host_ids: vertical SecureBoost needs at least one host")
        self.X = check_matrix(X, "X", allow_nan=True)
        self.y = check_labels(y, self.params)
        if len(self.y) != self.X.shape[0]:
            raise ValueError(f"y: {len(self.y)} labels for {self.X.shape[0]} rows")
        self.binner = Binner.fit(self.X, self.params.max_bin, cuts)
        self.cuts = self.binner.cuts
        self.bins = self.binner.virtual_bins(self.X)   # candidates are (virtual column, bin)
        self.n_bins = self.binner.n_bins
        self.X_val = None if X_val is None else check_matrix(X_val, "X_val", allow_nan=True)
        self.y_val = None if y_val is None else check_labels(y_val, self.params)
        self._keypair = keypair
        self.model: BoostedModel | None = None
        self._route_round = {h: 0 for h in self.host_ids}
        self.timings: dict[str, float] = {}

    @classmethod
    def from_model(cls, transport: Transport, host_ids: Sequence[str], model: BoostedModel, *,
                   backend="paillier") -> "SecureBoostGuest":
        """A guest that only predicts (:meth:`predict`) with a saved ``model`` (its own splits with
        thresholds, host splits as owner + record id); no key is needed."""
        guest = cls.__new__(cls)
        _Role.__init__(guest, transport, model.params, backend)
        guest.host_ids = list(host_ids)
        unknown = {n.owner for t in model.trees for n in t.nodes.values() if not n.leaf and n.owner != "guest"} \
            - set(guest.host_ids)
        if unknown:
            raise ValueError(f"host_ids: the model has splits of {sorted(unknown)}, not among {guest.host_ids}")
        guest.model, guest._route_round, guest.timings = model, {h: 0 for h in guest.host_ids}, {}
        return guest

    def _peers(self):
        return self.host_ids

    # ------------------------------------------------------------------------------- training
    def fit(self) -> TrainResult:
        """Train with the hosts; returns :class:`TrainResult`. Raises SecureBoostError naming a failed host."""
        return self._guarded(self._trained, self._fit)

    def _fit(self) -> TrainResult:
        prm, t = self.params, self.t
        n = len(self.y)
        self._setup(n)
        bm = base_margin(self.y, prm)
        model = BoostedModel(prm, bm)
        margin = np.tile(bm, (n, 1)).astype(np.float64)
        vmargin = None if self.X_val is None else np.tile(bm, (len(self.X_val), 1)).astype(np.float64)
        result = TrainResult(model)
        seq = 0
        first, arr, st = self._restored(prm.n_trees, check=_trees_done)
        if first:
            model = result.model = model_from_dict(st["model"])
            if arr["margin"].shape != margin.shape or (vmargin is not None) != ("vmargin" in arr) or \
                    (vmargin is not None and arr["vmargin"].shape != vmargin.shape):
                raise ValueError("checkpoint: margins of another shape")
            margin, vmargin = arr["margin"].copy(), arr["vmargin"].copy() if vmargin is not None else None
            result.tree_seconds, seq = arr["tree_seconds"].tolist(), st["trees_done"]
        for r in range(first, prm.n_trees):
            g, h = gradients(margin, self.y, prm)
            for k in range(prm.trees_per_round):
                ts = time.perf_counter()
                tree, leaf_rows = self._grow(seq, g[:, k], h[:, k])
                tree.output = k
                model.trees.append(tree)
                for nid, rows in leaf_rows.items():
                    margin[rows, k] += tree.nodes[nid].value
                if vmargin is not None:
                    self.phases.start(seq, "validate")
                    vmargin[:, k] += self._route([tree], "val", len(self.X_val), self.X_val)[0]
                    self.end_prediction()
                self.phases.stop()
                seq += 1
                result.tree_seconds.append(time.perf_counter() - ts)
                log.info("%s: tree %d (round %d, output %d) in %.2fs", self.party_id, seq, r + 1, k,
                         result.tree_seconds[-1])
            stop = vmargin is not None and model.record_validation(r, loss(vmargin, self.y_val, prm))
            if self._after_step(r + 1, lambda _step: ({"margin": margin, "tree_seconds": np.array(result.tree_seconds),
                                                 **({} if vmargin is None else {"vmargin": vmargin})},
                                                {"trees_done": seq, "model": model_to_dict(model)}),
                                stopping=stop, save_when_stopping=False):
                result.stopped_early = True
                break
        for h_id in self.host_ids:
            t.send(h_id, TAG_START, tree_pb2.SbTreeStart(tree=seq, stop=True, keep_trees=len(model.trees)),
                   round=seq + 1)
        self.model = model
        return result

    def _setup(self, n: int) -> None:
        """Key pair, SbSetup (the public key, shapes, the parameters hosts must share) and the hosts' widths."""
        prm = self.params
        t0 = time.perf_counter()
        self.phases.start(0, "keygen")
        self.pub, self.priv = resolve_keypair(self._keypair) or self.he.generate_keypair(prm.key_bits,
                                                                                        prm.insecure_test_key)
        self.timings["keygen"] = time.perf_counter() - t0
        self.phases.start(0, "hello")
        setup = tree_pb2.SbSetup(n_rows=n, n_val_rows=0 if self.X_val is None else len(self.X_val),
                                 objective=prm.objective, n_classes=prm.n_classes, max_depth=prm.max_depth,
                                 n_trees=prm.n_trees, hosts=self.host_ids, max_bin=prm.max_bin)
        self.wire.put_setup_key(setup, self.pub)
        for h in self.host_ids:
            self.t.send(h, TAG_SETUP, setup)
        self.host_features = {}
        for h in self.host_ids:
            msg = self._recv(h, TAG_HELLO, 0, parse_message(tree_pb2.SbHello), "setup")
            self.host_features[h] = int(msg.n_features)
        self.phases.stop()

    def _recv(self, host: str, tag: str, rnd: int, parse, where: str):
        try:
            return self.t.recv(host, tag, round=rnd, parse=parse)
        except TransportError as exc:
            raise SecureBoostError(f"host {host!r} failed or went silent ({where}, waiting for {tag!r}): {exc}") \
                from exc

    def _send(self, host: str, tag: str, msg, rnd: int, where: str):
        try:
            self.t.send(host, tag, msg, round=rnd)
        except TransportError as exc:
            raise SecureBoostError(f"host {host!r} unreachable ({where}, sending {tag!r}): {exc}") from exc

    # Cheng et al. 2021, Alg. 1-2, one tree: encrypt g, h; per level: plan, find splits, apply them
    def _grow(self, seq: int, g: np.ndarray, h: np.ndarray) -> tuple[Tree, dict[int, np.ndarray]]:
        st = self._encrypt_gradients(seq, g, h)
        level = [0]
        for depth in range(self.params.max_depth + 1):
            self.phases.start(seq, "plan", depth)
            split_now = self._open_level(st, level, depth)
            self._send_plan(st, depth, split_now)
            if not split_now:
                break
            best = self._find_splits(st, split_now, depth)
            level = self._apply_splits(st, best, depth)
        return st.tree, st.leaf_rows

    def _encrypt_gradients(self, seq: int, g: np.ndarray, h: np.ndarray) -> _GrowingTree:
        """Alg. 1 step 1: quantise g, h at p fraction bits, send [[pack(g_i, h_i)]] per row to every host
        (SbTreeStart, then the rows in SbRowPart messages as they are encrypted)."""
        n = len(g)
        e = bound_log2(g, h)
        p = precision_bits_for(n, e)
        st = _GrowingTree(seq, p, quantise(g, p), quantise(h, p), self.he.pair_sums(self.pub, p, e, n))
        rows = part_rows(n, self.wire.pair_bytes(self.pub), self.t.max_payload_bytes, _ex.workers())
        start = tree_pb2.SbTreeStart(tree=seq, precision_bits=p, log2_bound=e, part_rows=rows,
                                     row_parts=-(-n // rows))
        te = time.perf_counter()
        self.phases.start(seq, "encrypt")
        for host in self.host_ids:
            self._send(host, TAG_START, start, seq + 1, f"tree {seq}")
        self._stream_rows(st, [(a, min(n, a + rows)) for a in range(0, n, rows)])
        self.timings["encrypt"] = self.timings.get("encrypt", 0.0) + time.perf_counter() - te
        return st

    def _stream_rows(self, st: _GrowingTree, bounds: list[tuple[int, int]]) -> None:
        """Encrypt the parts' row pairs one after the other in a thread (the worker pool computes) while
        this one encodes and sends the previous part to every host; before sending part k to a host, take
        its acknowledgement of part k - ROW_PART_WINDOW, and at the end every acknowledgement left."""
        seq, where = st.seq, f"tree {st.seq}"
        with ThreadPoolExecutor(1, thread_name_prefix="secureflhv-sb-encrypt") as pool:
            parts = [pool.submit(st.sums.encrypt, self.priv, st.gq[a:b], st.hq[a:b]) for a, b in bounds]
            try:
                for k, fut in enumerate(parts):
                    msg = tree_pb2.SbRowPart(tree=seq, part=k)
                    self.wire.put_pairs(msg, fut.result())
                    parts[k] = None  # sent: its ciphertexts need not stay in memory
                    for host in self.host_ids:
                        if k >= ROW_PART_WINDOW:
                            self._rows_ack(host, seq, k - ROW_PART_WINDOW)
                        self._send(host, TAG_ROWS, msg, _part_rnd(seq, k), where)
            finally:
                for fut in parts:
                    if fut is not None:
                        fut.cancel()  # a host failed: encrypt no more parts
        for host in self.host_ids:
            for k in range(max(0, len(bounds) - ROW_PART_WINDOW), len(bounds)):
                self._rows_ack(host, seq, k)

    def _rows_ack(self, host: str, seq: int, part: int) -> None:
        def check(m: tree_pb2.SbRowPart):
            if m.tree != seq or m.part != part:
                raise ProtocolError(f"acknowledgement of tree {m.tree} part {m.part}, expected tree {seq} part {part}")
        self._recv(host, TAG_ROWS_ACK, _part_rnd(seq, part), parse_message(tree_pb2.SbRowPart, check),
                   f"tree {seq}, row part {part}")

    def _open_level(self, st: _GrowingTree, level: list[int], depth: int) -> list[int]:
        """Create the level's nodes; those at max depth or with < 2 rows become leaves. Returns the rest."""
        split_now = []
        for nid in level:
            rows = st.rows_of[nid]
            st.totals[nid] = st.sum_gh(rows)
            st.tree.nodes[nid] = Node(nid, sum_hess=st.totals[nid][1], n_rows=len(rows))
            if depth < self.params.max_depth and len(rows) >= 2:
                split_now.append(nid)
            else:
                self._make_leaf(st, nid)
        return split_now

    def _make_leaf(self, st: _GrowingTree, nid: int) -> None:
        G, H = st.totals[nid]
        st.tree.nodes[nid].value = leaf_weight(G, H, self.params)
        st.leaf_rows[nid] = st.rows_of[nid]

    def _send_plan(self, st: _GrowingTree, depth: int, split_now: list[int]) -> None:
        """The previous level's partitions, the nodes to split now and which histograms to build/derive."""
        plan = tree_pb2.SbLevelPlan(depth=depth, done=not split_now)
        for nid, mask in st.partitions:
            plan.partitions.add(node=nid, left_mask=pack_mask(mask))
        st.derived = set()
        for nid, derived in plan_children(split_now, {k: len(v) for k, v in st.rows_of.items()}):
            plan.nodes.add(node=nid, derived=derived, send=nid in split_now)
            if derived and nid in split_now:
                st.derived.add(nid)
        for host in self.host_ids:
            self._send(host, TAG_PLAN, plan, level_round(st.seq, depth), f"tree {st.seq} depth {depth}")

    def _find_splits(self, st: _GrowingTree, split_now: list[int], depth: int) -> dict[int, SplitCandidate | None]:
        """Alg. 2: the best split per node, own candidates first (plaintext), then each host's (decrypted)."""
        self.phases.start(st.seq, "guest_split", depth)
        best = {nid: self._guest_split(st, nid) for nid in split_now}
        for host in self.host_ids:
            self.phases.start(st.seq, "wait_hosts", depth)
            cands = self._recv(host, TAG_HIST, level_round(st.seq, depth),
                               self._hist_parser(host, split_now, st, depth), f"tree {st.seq} depth {depth}")
            st.host_sums[host] = cands
            self.phases.start(st.seq, "host_split", depth)
            for nid, (GL, HL) in cands.items():
                cand = self._host_split(host, GL, HL, *st.totals[nid])
                if cand is not None and cand.gain > _gain_of(best[nid]):
                    best[nid] = cand
        return best

    def _guest_split(self, st: _GrowingTree, nid: int) -> SplitCandidate | None:
        """The guest's best (feature, bin) of node ``nid``: the first maximum in (feature, bin) order."""
        rows = st.rows_of[nid]
        G, H = st.totals[nid]
        gq, hq = st.gq[rows].astype(np.float64), st.hq[rows].astype(np.float64)
        best = None
        for j in range(self.bins.shape[1]):
            b_j, nb = self.bins[rows, j], self.n_bins[j]
            cnt = np.bincount(b_j, minlength=nb)
            GL = dequantise(np.cumsum(np.bincount(b_j, gq, nb))[:-1], st.p)
            HL = dequantise(np.cumsum(np.bincount(b_j, hq, nb))[:-1], st.p)
            gain = candidate_gains(GL, HL, G, H, self.params, cnt, len(rows))
            if gain is not None:
                b = int(np.argmax(gain))
                if gain[b] > _gain_of(best):
                    best = SplitCandidate(float(gain[b]), "guest", feature=j, bin=b)
        return best

    def _host_split(self, host: str, GL, HL, G: float, H: float) -> SplitCandidate | None:
        """A host's best candidate of one node from its decrypted (G_L, H_L), with its exact ties."""
        gain = candidate_gains(GL, HL, G, H, self.params)
        if gain is None:
            return None
        c = int(np.argmax(gain))
        tied = np.flatnonzero(gain == gain[c])
        return SplitCandidate(float(gain[c]), host, candidate=c, tied=[int(x) for x in tied],
                              tied_hess={float(v) for v in HL[tied]})

    def _apply_splits(self, st: _GrowingTree, best: dict[int, SplitCandidate | None], depth: int) -> list[int]:
        """Alg. 2 end: split where the gain beats gamma (hosts apply theirs), else a leaf; returns next level."""
        where = f"tree {st.seq} depth {depth}"
        self.phases.start(st.seq, "decide", depth)
        decisions = {host: tree_pb2.SbDecision() for host in self.host_ids}
        chosen = {}
        for nid, cand in best.items():
            node = st.tree.nodes[nid]
            if cand is None or not beats_gamma(cand.gain, self.params):
                self._make_leaf(st, nid)
                continue
            node.leaf, node.gain, node.owner = False, cand.gain, cand.owner
            chosen[nid] = cand
            if cand.owner == "guest":
                node.feature, node.bin, node.threshold, node.default_left = self.binner.split(cand.feature, cand.bin)
            else:
                decisions[cand.owner].choices.add(node=nid, candidate=cand.candidate,
                                                  tied=[c for c in cand.tied if c != cand.candidate])
        for host in self.host_ids:
            self._send(host, TAG_DECIDE, decisions[host], level_round(st.seq, depth), where)
        host_masks = {}
        for host in self.host_ids:
            res = self._recv(host, TAG_SPLIT, level_round(st.seq, depth),
                             self._split_parser(host, decisions[host], st.rows_of), where)
            for nid, (record, mask) in res.items():
                st.tree.nodes[nid].record = record
                host_masks[nid] = mask
        st.partitions, level = [], []
        for nid in sorted(chosen):
            node = st.tree.nodes[nid]
            mask = self._partition(st, nid, chosen[nid], host_masks.get(nid), where)
            rows = st.rows_of[nid]
            st.rows_of[node.left], st.rows_of[node.right] = rows[mask], rows[~mask]
            st.partitions.append((nid, mask))
            level += [node.left, node.right]
        return level

    def _partition(self, st: _GrowingTree, nid: int, cand: SplitCandidate, host_mask, where: str) -> np.ndarray:
        """Left mask of node ``nid``'s rows; a host's is checked against the hessian sums it won with."""
        rows = st.rows_of[nid]
        if cand.owner == "guest":
            return left_masks(self.bins, [(cand.feature, cand.bin, False, rows)], binned=True)[0]
        hl = float(dequantise(st.hq[rows[host_mask]].sum(), st.p))  # a tied candidate has the same sum
        if hl not in cand.tied_hess:
            raise SecureBoostError(f"host {cand.owner!r} returned a partition for node {nid} whose hessian "
                                   f"sum {hl} differs from its histogram's {sorted(cand.tied_hess)} ({where})")
        return host_mask

    def _hist_parser(self, host: str, nodes: list[int], st: _GrowingTree, depth: int):
        """SbHistograms -> {node: (G_L, H_L)} per candidate: built nodes decrypted, derived nodes as the
        parent's (last level) minus the sibling's sums (exact: multiples of 2^-p far below 2^53)."""
        # a feature with missing values has two virtual columns of at most max_bin candidates each
        max_cands = self.host_features[host] * 2 * self.params.max_bin
        sums, parents = st.sums, st.host_sums.get(host, {})

        def validate(msg: tree_pb2.SbHistograms):
            got = [int(x.node) for x in msg.nodes]
            if got != list(nodes):
                raise ProtocolError(f"histograms from {host} for nodes {got}, expected {list(nodes)}")
            counts = [int(x.n_candidates) for x in msg.nodes]
            if any(c > max_cands for c in counts):
                raise ProtocolError(f"histograms from {host}: more candidates than {max_cands}")
            count_of = dict(zip(nodes, counts))
            for x in msg.nodes:
                self._check_derivation(host, x, st, parents, count_of)
            built = [(nid, c) for nid, c in zip(nodes, counts) if nid not in st.derived]
            self.phases.start(st.seq, "decode", depth)
            value = self.wire.pair_sums_from(msg, self.pub, sums, [c for _, c in built], f"histograms from {host}")
            self.phases.start(st.seq, "decrypt", depth)
            td = time.perf_counter()
            flat = sums.decrypt(self.priv, value, [c for _, c in built])
            self.timings["decrypt"] = self.timings.get("decrypt", 0.0) + time.perf_counter() - td
            out, off = {}, 0
            for nid, c in built:
                out[nid] = (flat[off:off + c, 0], flat[off:off + c, 1])
                off += c
            for x in msg.nodes:
                if x.derived:
                    out[int(x.node)] = self._derive(st, int(x.node), parents, out, x)
            return out

        return parse_message(tree_pb2.SbHistograms, validate)

    @staticmethod
    def _check_derivation(host: str, x, st: _GrowingTree, parents: dict, counts: dict[int, int]) -> None:
        """A derived node's entry: flagged as the plan says, indices within the parent's and sibling's."""
        nid = int(x.node)
        if x.derived != (nid in st.derived):
            raise ProtocolError(f"histograms from {host}: node {nid} derived={x.derived}, the plan says "
                                f"{nid in st.derived}")
        par, sib = list(x.parent_candidate), list(x.sibling_candidate)
        if not x.derived:
            if par or sib:
                raise ProtocolError(f"histograms from {host}: node {nid} is built but carries a derivation")
            return
        if (nid - 1) // 2 not in parents:
            raise ProtocolError(f"histograms from {host}: node {nid} derived from a parent it sent no sums for")
        n_par = len(parents[(nid - 1) // 2][0])
        n_sib = counts.get(sibling(nid), 0)
        if len(par) != x.n_candidates or len(sib) != x.n_candidates:
            raise ProtocolError(f"histograms from {host}: node {nid} derivation of {len(par)}/{len(sib)} "
                                f"entries for {x.n_candidates} candidates")
        if any(not 0 <= i < n_par for i in par) or any(not -2 <= i < n_sib for i in sib):
            raise ProtocolError(f"histograms from {host}: node {nid} derivation refers to candidates beyond "
                                f"the parent's {n_par} or the sibling's {n_sib}")

    @staticmethod
    def _derive(st: _GrowingTree, nid: int, parents: dict, out: dict, x) -> tuple[np.ndarray, np.ndarray]:
        """(G_L, H_L) of a derived node: parent's candidate sums minus the sibling's (0 / its total)."""
        sib_id = sibling(nid)
        pg, ph = parents[(nid - 1) // 2]
        sg, sh = out.get(sib_id, (np.zeros(0), np.zeros(0)))
        tg, th = st.sum_gh(st.rows_of[sib_id])
        par, sib = np.asarray(x.parent_candidate, dtype=np.int64), np.asarray(x.sibling_candidate, dtype=np.int64)
        take = np.maximum(sib, 0)
        g = np.where(sib >= 0, sg[take] if len(sg) else 0.0, np.where(sib == -1, 0.0, tg))
        h = np.where(sib >= 0, sh[take] if len(sh) else 0.0, np.where(sib == -1, 0.0, th))
        return pg[par] - g, ph[par] - h

    def _split_parser(self, host: str, decision, rows_of):
        wanted = [int(c.node) for c in decision.choices]

        def validate(msg: tree_pb2.SbSplitResults):
            got = [int(r.node) for r in msg.results]
            if got != wanted:
                raise ProtocolError(f"split results from {host} for nodes {got}, expected {wanted}")
            return {int(r.node): (int(r.record), unpack_mask(r.left_mask, len(rows_of[int(r.node)]),
                                                              f"partition of node {r.node} from {host}"))
                    for r in msg.results}

        return parse_message(tree_pb2.SbSplitResults, validate)

    # ----------------------------------------------------------------------------- prediction
    def _route(self, trees: list[Tree], dataset: str, n_rows: int, X: np.ndarray) -> list[np.ndarray]:
        """Leaf value per row for each tree, asking hosts level by level (<= max_depth rounds)."""
        pos = [np.zeros(n_rows, dtype=np.int64) for _ in trees]
        for _ in range(self.params.max_depth):
            queries = self._route_own(trees, pos, X)
            if queries is None:
                break
            self._route_hosts(trees, pos, queries, dataset, n_rows)
        return [_leaf_values(tree, p, n_rows) for tree, p in zip(trees, pos)]

    def _route_own(self, trees: list[Tree], pos: list[np.ndarray], X: np.ndarray) -> dict | None:
        """Move rows one level down through the guest's splits; the host splits' (tree, node, rows) per
        host, or None when every row sits at a leaf."""
        queries = {h: [] for h in self.host_ids}
        own = []
        active = False
        for ti, tree in enumerate(trees):
            for nid in np.unique(pos[ti]).tolist():
                node = tree.nodes[nid]
                if node.leaf:
                    continue
                active = True
                rows = np.flatnonzero(pos[ti] == nid)
                (own if node.owner == "guest" else queries[node.owner]).append((ti, nid, rows))
        # the guest's own splits of this level in one batch (tasks next to the row shards on Ray)
        lefts = left_masks(X, [(trees[ti].nodes[nid].feature, trees[ti].nodes[nid].threshold,
                                trees[ti].nodes[nid].default_left, rows) for ti, nid, rows in own], binned=False)
        for (ti, nid, rows), left in zip(own, lefts):
            node = trees[ti].nodes[nid]
            pos[ti][rows] = np.where(left, node.left, node.right)
        return queries if active else None

    def _route_hosts(self, trees: list[Tree], pos: list[np.ndarray], queries: dict, dataset: str, n_rows: int):
        """Ask each host which way the rows at its nodes go (SbRouteRequest/Reply) and move them."""
        where = f"prediction ({dataset})"
        asked = {h: qs for h, qs in queries.items() if qs}
        for h, qs in asked.items():
            self._route_round[h] += 1
            req = tree_pb2.SbRouteRequest(dataset=dataset, n_rows=n_rows)
            for ti, nid, rows in qs:
                req.queries.add(record=trees[ti].nodes[nid].record, rows=rows.tolist())
            self._send(h, TAG_ROUTE, req, self._route_round[h], where)
        for h, qs in asked.items():
            masks = self._recv(h, TAG_ROUTED, self._route_round[h],
                               _route_reply_parser(h, [len(q[2]) for q in qs]), where)
            for (ti, nid, rows), left in zip(qs, masks):
                node = trees[ti].nodes[nid]
                pos[ti][rows] = np.where(left, node.left, node.right)

    def predict_margin(self, X, dataset: str = "predict") -> np.ndarray:
        """Federated margins (n, outputs) for guest rows X aligned with the hosts' ``dataset`` rows."""
        return self._guarded(self._predict_margin, X, dataset)

    def _predict_margin(self, X, dataset):
        if self.model is None:
            raise RuntimeError("predict before fit")
        X = check_matrix(X, "X", allow_nan=True)
        m = np.tile(self.model.base_margin, (X.shape[0], 1)).astype(np.float64)
        for tree, vals in zip(self.model.trees, self._route(self.model.trees, dataset, X.shape[0], X)):
            m[:, tree.output] += vals
        return m

    def predict(self, X, dataset: str = "predict") -> np.ndarray:
        """P(y=1) (n,), class probabilities (n, K) or values (n,), federated."""
        return transform(self.predict_margin(X, dataset), self.params)

    def end_prediction(self) -> None:
        """Release the hosts from :meth:`SecureBoostHost.serve_predictions`."""
        for h in self.host_ids:
            self._route_round[h] += 1
            self.t.send(h, TAG_ROUTE, tree_pb2.SbRouteRequest(stop=True), round=self._route_round[h])


# ============================================================================================ host
class SecureBoostHost(_Role):
    """A feature holder without labels.

    Args:
        transport, params: as for the guest.
        guest_id: the guest's party id.
        X: float (n, d_h) host columns aligned with the guest's rows, NaN = missing.
        X_val: validation rows aligned with the guest's (needed when the guest validates).
        cuts: bin cuts (default: quantile cuts of X, computed here and never sent).
        backend: must match the guest's ("identity" only for the plaintext benchmark baseline).
        callbacks, resume: the role lifecycle, as for the guest (the guest decides when to stop).

    ``records`` is the host's private lookup table: record id -> (feature, bin, threshold, default_left)
    (a missing value goes left exactly when default_left; the guest never learns it).
    """

    def __init__(self, transport: Transport, guest_id: str, X, params, *, X_val=None, cuts=None,
                 backend=None, callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None):
        super().__init__(transport, params, backend, callbacks, resume)
        self.guest_id = guest_id
        self.X = check_matrix(X, "X", allow_nan=True)
        self.binner = Binner.fit(self.X, self.params.max_bin, cuts)
        self.cuts = self.binner.cuts
        self.bins = self.binner.virtual_bins(self.X)   # candidates are (virtual column, bin)
        self.n_bins = self.binner.n_bins
        self.datasets = {"train": self.X}
        if X_val is not None:
            self.datasets["val"] = check_matrix(X_val, "X_val", allow_nan=True)
        self.records: list[tuple[int, int, float, bool]] = []
        self.keep_trees = 0
        self._route_round = 0
        self.timings: dict[str, float] = {"histograms": 0.0, "compress": 0.0}
        rng = np.random.default_rng()
        self._row_hash = rng.integers(0, 1 << 32, size=(2, self.X.shape[0])).astype(np.float64)

    @classmethod
    def from_records(cls, transport: Transport, guest_id: str, records, params, *,
                     backend="paillier") -> "SecureBoostHost":
        """A host that only answers routing requests (:meth:`serve_predictions`) with its saved lookup
        table ``records``: record id -> (feature index, bin, threshold[, default_left]); a threshold may
        be "inf" / "-inf" (JSON); without default_left a missing value goes right."""
        host = cls.__new__(cls)
        _Role.__init__(host, transport, params, backend)
        host.guest_id = guest_id
        host.records = [(int(r[0]), int(r[1]), float(r[2]), bool(r[3]) if len(r) > 3 else False) for r in records]
        host.datasets, host._route_round, host.timings = {}, 0, {}
        return host

    def _peers(self):
        return [self.guest_id]

    def fit(self) -> None:
        """Serve the guest's training until it stops (raises SecureBoostError if the guest fails)."""
        self._guarded(self._trained, self._fit)

    def _fit(self):
        t, prm = self.t, self.params
        setup = t.recv(self.guest_id, TAG_SETUP, parse=parse_message(tree_pb2.SbSetup, self._check_setup))
        try:
            self.pub = self.wire.setup_key(setup, prm.insecure_test_key)
        except ProtocolError as exc:
            raise SecureBoostError(f"{self.party_id}: the guest's public key is unacceptable: {exc}") from exc
        self._seed = self.params.shuffle_seed  # the host's own: a shuffle known to the guest would hide nothing
        self._validating = setup.n_val_rows > 0
        t.send(self.guest_id, TAG_HELLO, tree_pb2.SbHello(n_features=self.X.shape[1]))
        seq = 0
        first, _, st = self._restored(prm.n_trees, check=_trees_done)
        if first:
            seq = st["trees_done"]
            self.records = [(int(j), int(b), float(thr), bool(dl)) for j, b, thr, dl in st["records"]]
        while True:
            self.phases.start(seq, "wait")
            start = t.recv(self.guest_id, TAG_START, round=seq + 1,
                           parse=parse_message(tree_pb2.SbTreeStart, lambda m: self._parse_start(m, seq)))
            if start[0] is None:
                self.phases.stop()
                self.keep_trees = start[1]
                return
            sums = start[0]
            data = self._receive_rows(seq, *start)
            try:
                self._tree(seq, data, sums)
            finally:
                sums.release(data)
            self.timings["compress"] += sums.compress_seconds
            seq += 1
            if self._validating:
                self.phases.start(seq - 1, "validate")
                self._serve(None)  # the guest routes its validation rows through the new tree
                self.phases.stop()
            if seq % prm.trees_per_round == 0:  # a round ends: the guest checkpoints it too
                self._after_step(seq // prm.trees_per_round,
                                 lambda _step: ({}, {"trees_done": seq, "records": list(self.records)}))

    def _check_setup(self, m: tree_pb2.SbSetup):
        prm = self.params
        if m.n_rows != self.X.shape[0]:
            raise ProtocolError(f"guest has {m.n_rows} rows, {self.party_id} has {self.X.shape[0]} (run PSI first)")
        if m.n_val_rows and m.n_val_rows != len(self.datasets.get("val", ())):
            raise ProtocolError(f"guest validates on {m.n_val_rows} rows; give this host X_val of that many rows")
        for name in ("objective", "max_depth", "max_bin", "n_trees"):
            if getattr(m, name) != getattr(prm, name):
                raise ProtocolError(f"params.{name}: {getattr(prm, name)!r} here, {getattr(m, name)!r} at the guest")
        if self.party_id not in m.hosts:
            raise ProtocolError(f"{self.party_id} is not in the guest's host list {list(m.hosts)}")
        return m

    def _parse_start(self, m: tree_pb2.SbTreeStart, seq: int):
        """(None, trees kept) for a stop, else (the tree's PairSums, rows per part, parts)."""
        if m.tree != seq:
            raise ProtocolError(f"tree {m.tree}, expected {seq}")
        if m.stop:
            return None, int(m.keep_trees)
        n, rows, parts = self.X.shape[0], int(m.part_rows), int(m.row_parts)
        sums = self.he.pair_sums(self.pub, int(m.precision_bits), int(m.log2_bound), n)
        if not 1 <= rows <= n or parts != -(-n // rows) or parts > MAX_ROW_PARTS:
            raise ProtocolError(f"{parts} parts of {rows} rows for the {n} rows here (at most {MAX_ROW_PARTS} parts)")
        limit = self.t.max_payload_bytes
        if limit is not None and rows * self.wire.pair_bytes(self.pub) > limit:
            raise ProtocolError(f"parts of {rows} rows exceed this party's message limit")
        return sums, rows, parts

    def _receive_rows(self, seq: int, sums: PairSums, rows: int, parts: int):
        """The tree's row pairs, part by part (each decoded while the guest encrypts the next, and
        acknowledged so the guest sends more), joined for :meth:`PairSums.histogram`."""
        n, got = self.X.shape[0], []
        for k in range(parts):
            count = min(n, (k + 1) * rows) - k * rows

            def check(m: tree_pb2.SbRowPart, k=k, count=count):
                if m.tree != seq or m.part != k:
                    raise ProtocolError(f"row part {m.part} of tree {m.tree}, expected part {k} of tree {seq}")
                self.phases.start(seq, "decode")
                return self.wire.pairs_from(m, self.pub, sums, count)

            self.phases.start(seq, "wait")
            got.append(self.t.recv(self.guest_id, TAG_ROWS, round=_part_rnd(seq, k),
                                   parse=parse_message(tree_pb2.SbRowPart, check)))
            self.t.send(self.guest_id, TAG_ROWS_ACK, tree_pb2.SbRowPart(tree=seq, part=k), round=_part_rnd(seq, k))
        return self.wire.join_pairs(got)

    # Cheng et al. 2021, Alg. 1-2, host side of one tree: per level, apply the guest's partitions,
    # aggregate encrypted histograms, send the candidates' sums, apply the splits it won
    def _tree(self, seq: int, data, sums: PairSums) -> None:
        rows_of = {0: np.arange(self.X.shape[0])}
        tables: dict[int, list] = {}  # the last level's candidate tables and partition keys (the parents of
        keys: dict[int, list] = {}    # derived nodes)
        for depth in range(self.params.max_depth + 1):
            rnd = level_round(seq, depth)
            self.phases.start(seq, "wait", depth)
            plan = self.t.recv(self.guest_id, TAG_PLAN, round=rnd, parse=parse_message(
                tree_pb2.SbLevelPlan, lambda m: self._check_plan(m, depth, rows_of)))
            self.phases.start(seq, "partitions", depth)
            self._apply_partitions(plan, rows_of)
            if plan.done:
                self.phases.stop()
                return
            self.phases.start(seq, "histograms", depth)
            hists = self._aggregate_histograms(plan, rows_of, data, sums)
            tables, keys = self._send_candidates(plan, rows_of, hists, sums, seq, depth, tables, keys)
            self.phases.start(seq, "wait", depth)
            decision = self.t.recv(self.guest_id, TAG_DECIDE, round=rnd, parse=parse_message(
                tree_pb2.SbDecision, lambda m: self._check_decision(m, tables)))
            self.phases.start(seq, "decision", depth)
            self.t.send(self.guest_id, TAG_SPLIT, self._apply_decision(decision, tables, rows_of), round=rnd)

    @staticmethod
    def _apply_partitions(plan: tree_pb2.SbLevelPlan, rows_of: dict) -> None:
        for part in plan.partitions:
            nid = int(part.node)
            rows = rows_of[nid]
            left = unpack_mask(part.left_mask, len(rows), "partition")
            rows_of[2 * nid + 1], rows_of[2 * nid + 2] = rows[left], rows[~left]

    def _aggregate_histograms(self, plan, rows_of: dict, data, sums: PairSums) -> dict:
        """Encrypted histograms of the nodes the plan builds and sends. A derived node needs none: the
        guest subtracts its candidates' sums in plaintext (``_derivation``), so no ciphertext histogram
        is ever parent - child (nor is a built sibling that is not sent: a leaf of at most one row)."""
        th = time.perf_counter()
        for np_ in plan.nodes:
            nid = int(np_.node)
            if nid not in rows_of or (np_.derived and nid == 0):
                raise SecureBoostError(f"{self.party_id}: the guest's plan names node {nid}, unknown here")
        built = [int(x.node) for x in plan.nodes if x.send and not x.derived]
        hists = dict(zip(built, sums.histograms(data, [rows_of[nid] for nid in built], self.bins, self.n_bins)))
        self.timings["histograms"] += time.perf_counter() - th
        return hists

    def _send_candidates(self, plan, rows_of: dict, hists: dict, sums: PairSums, seq: int, depth: int,
                         parent_tables: dict, parent_keys: dict) -> tuple[dict, dict]:
        """Shuffled candidates of the nodes to split -> SbHistograms: the cumulative sums of built nodes
        (compressed), the derivation of derived ones (``_derivation``); returns the tables and the sent
        nodes' partition keys."""
        msg = tree_pb2.SbHistograms()
        rng = self._rng(seq, depth)
        tables, keys_of = {}, {}
        self.phases.start(seq, "candidates", depth)
        send = sorted(int(x.node) for x in plan.nodes if x.send)
        derived = {int(x.node) for x in plan.nodes if x.send and x.derived}
        for nid in send:
            keys_of[nid] = self._bin_keys(rows_of[nid])
            cands = self._candidates(rows_of[nid], keys_of[nid])
            order = rng.permutation(len(cands))
            tables[nid] = [cands[i] for i in order]
        for nid in send:
            entry = msg.nodes.add(node=nid, n_candidates=len(tables[nid]), derived=nid in derived)
            if nid in derived:
                parent, sib_id = (nid - 1) // 2, sibling(nid)
                if parent not in parent_tables:
                    raise SecureBoostError(f"{self.party_id}: the guest's plan derives node {nid}, whose parent "
                                           f"was not split at the last level")
                if sib_id not in keys_of:  # a sibling not sent (a leaf of at most one row)
                    keys_of[sib_id] = self._bin_keys(rows_of[sib_id])
                par, sib = self._derivation(tables[nid], parent_keys[parent], parent_tables[parent],
                                            keys_of[sib_id], tables.get(sib_id, []), len(rows_of[sib_id]))
                entry.parent_candidate.extend(par)
                entry.sibling_candidate.extend(sib)
        self.phases.start(seq, "compress", depth)
        elements = []
        for part in sums.select_level([(hists[nid], tables[nid]) for nid in send if nid not in derived]):
            elements.extend(part)
        self.phases.start(seq, "send", depth)
        self.wire.put_pair_sums(msg, sums.collect(elements))
        self.t.send(self.guest_id, TAG_HIST, msg, round=level_round(seq, depth))
        return tables, {nid: keys_of[nid] for nid in send}

    def _apply_decision(self, decision: tree_pb2.SbDecision, tables: dict, rows_of: dict) -> tree_pb2.SbSplitResults:
        """Record each won split in the private lookup table; the partition of the node's rows for the guest."""
        out = tree_pb2.SbSplitResults()
        won = []
        for ch in decision.choices:
            nid = int(ch.node)
            # exact ties (rows with equal g, h make them common): the first in (virtual column, bin) order,
            # i.e. (feature, default_left false before true, bin) as in the centralised twin
            v, b = min(tables[nid][int(c)] for c in [ch.candidate, *ch.tied])
            self.records.append(self.binner.split(v, b))
            won.append((nid, len(self.records) - 1, v, b))
        # the partitions in one batch (tasks next to the bin shards on Ray)
        masks = left_masks(self.bins, [(v, b, False, rows_of[nid]) for nid, _, v, b in won], binned=True)
        for (nid, record, _, _), mask in zip(won, masks):
            out.results.add(node=nid, record=record, left_mask=pack_mask(mask))
        return out

    def _rng(self, seq: int, depth: int) -> np.random.Generator:
        if self._seed:
            tag = int.from_bytes(self.party_id.encode()[:8].ljust(8, b"\0"), "little")
            return np.random.default_rng([self._seed, tag, seq, depth])
        return np.random.default_rng(secrets.randbits(128))

    def _bin_keys(self, rows: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per column: rows per bin, and per bin b < last the left partition's key (rows left, two row-hash
        sums): equal keys = the same left rows (with overwhelming probability)."""
        out = []
        for j in range(self.bins.shape[1]):
            b_j, nb = self.bins[rows, j], self.n_bins[j]
            cnt = np.bincount(b_j, minlength=nb)
            out.append((cnt, np.cumsum(cnt)[:-1], np.cumsum(np.bincount(b_j, self._row_hash[0, rows], nb))[:-1],
                        np.cumsum(np.bincount(b_j, self._row_hash[1, rows], nb))[:-1]))
        return out

    @staticmethod
    def _key(keys, j: int, b: int) -> tuple:
        _, cum, h1, h2 = keys[j]
        return int(cum[b]), h1[b], h2[b]

    def _candidates(self, rows: np.ndarray, keys=None) -> list[tuple[int, int]]:
        """Valid (feature, bin) of a node, identical partitions removed (first in order kept)."""
        keys = self._bin_keys(rows) if keys is None else keys
        seen, out = set(), []
        for j, (cnt, cum, _, _) in enumerate(keys):
            for b in np.flatnonzero((cnt[:-1] > 0) & (cum < len(rows))).tolist():
                k = self._key(keys, j, b)
                if k not in seen:
                    seen.add(k)
                    out.append((j, b))
        return out

    def _derivation(self, cands: list, p_keys: list, p_table: list, s_keys: list, s_table: list, n_sib: int):
        """Where the guest finds a derived node's candidate sums: per candidate (its table order ``cands``),
        the parent's candidate (``p_table``) with the same left rows in the parent, and the sibling's
        term (its candidate in ``s_table`` with the same left rows in the sibling, -1: none of its
        ``n_sib`` rows left, -2: all); ``*_keys``: ``_bin_keys`` of the parent's / sibling's rows.

        Both exist: a valid split of the node splits its parent too (rows left in the node, rows right of
        it), and any key of a valid (feature, bin) is the key of a kept candidate (dedup keeps the first)."""
        p_index = {self._key(p_keys, j, b): i for i, (j, b) in enumerate(p_table)}
        s_index = {self._key(s_keys, j, b): i for i, (j, b) in enumerate(s_table)}
        par, sibling = [], []
        for j, b in cands:
            par.append(p_index[self._key(p_keys, j, b)])
            left = int(s_keys[j][1][b])
            sibling.append(-1 if left == 0 else -2 if left == n_sib else s_index[self._key(s_keys, j, b)])
        return par, sibling

    def _check_plan(self, m: tree_pb2.SbLevelPlan, depth: int, rows_of: dict):
        if m.depth != depth:
            raise ProtocolError(f"level plan for depth {m.depth}, expected {depth}")
        for part in m.partitions:
            if int(part.node) not in rows_of:
                raise ProtocolError(f"partition of unknown node {part.node}")
        return m

    def _check_decision(self, m: tree_pb2.SbDecision, tables: dict):
        for ch in m.choices:
            if int(ch.node) not in tables or not all(0 <= int(c) < len(tables[int(ch.node)])
                                                         for c in [ch.candidate, *ch.tied]):
                raise ProtocolError(f"decision for unknown candidate {ch.candidate} of node {ch.node}")
        return m

    # ----------------------------------------------------------------------------- prediction
    def serve_predictions(self, X=None, max_requests: int | None = None) -> int:
        """Answer the guest's routing requests on ``X`` (dataset "predict") until it ends prediction."""
        if X is not None:
            self.datasets["predict"] = check_matrix(X, "X", allow_nan=True)
        return self._guarded(self._serve, max_requests)

    def _serve(self, max_requests):
        served = 0
        while max_requests is None or served < max_requests:
            self._route_round += 1
            req = self.t.recv(self.guest_id, TAG_ROUTE, round=self._route_round,
                              parse=parse_message(tree_pb2.SbRouteRequest, self._check_route))
            if req.stop:
                break
            X = self.datasets[req.dataset]
            reply = tree_pb2.SbRouteReply()
            qs = []
            for q in req.queries:
                j, _, thr, default_left = self.records[int(q.record)]
                qs.append((j, thr, default_left, np.asarray(q.rows, dtype=np.int64)))
            for left in left_masks(X, qs, binned=False):  # tasks next to the row shards on Ray
                reply.left_masks.append(pack_mask(left))
            self.t.send(self.guest_id, TAG_ROUTED, reply, round=self._route_round)
            served += 1
        return served

    def _check_route(self, m: tree_pb2.SbRouteRequest):
        if m.stop:
            return m
        if m.dataset not in self.datasets:
            raise ProtocolError(f"route request for dataset {m.dataset!r}; this host has {sorted(self.datasets)}")
        n = len(self.datasets[m.dataset])
        if m.n_rows != n:
            raise ProtocolError(f"route request for {m.n_rows} rows of {m.dataset!r}; this host holds {n}")
        for q in m.queries:
            if not 0 <= q.record < len(self.records):
                raise ProtocolError(f"route request for unknown record {q.record}")
            if len(q.rows) and max(q.rows) >= n:
                raise ProtocolError("route request: row index out of range")
        return m
