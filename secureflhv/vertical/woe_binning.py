"""Federated WOE binning: a host's per-bin label counts under the guest's Paillier key.

The guest holds the labels y (classes 0..K-1), each host its columns, binned locally
(:mod:`secureflhv.data.woe`). Protocol (the root of a SecureBoost tree with every bin a candidate: it
reuses SecureBoost's row and histogram messages and :mod:`secureflhv.transport.row_parts`; FATE's hetero feature
binning sends [[y]] and [[1 - y]] the same way)::

    guest -> host  : woe.setup   SbSetup: n rows, K, passes P = ceil(K / 2), hosts, max bins, public key
    host  -> guest : woe.counts  Bundle: per column its bins' row counts (int64), the column names
    per pass m = 0..P-1 (classes 2m and 2m + 1; binary: the non-events and the events):
    guest -> host  : woe.start, woe.rows   [[(1{y_i = 2m}, 1{y_i = 2m + 1})]] per row, GH-packed, in parts
    host  -> guest : woe.sums    SbHistograms: per (column, non-empty bin), in order, the cumulative
                                  encrypted sums of the column's bins up to it, compressed
    guest -> host  : woe.result  Bundle: per column the cuts kept (monotonic merging), whether the column
                                  is kept (selection), and, if the job says so, the WOE of its bins

The guest decrypts and takes differences: per column and bin the rows of each class. It checks every
count against what it knows (bounds below), so a host's lie is an error naming it, never a silent
wrong IV.

What each role learns (semi-honest; FATE's hetero binning reveals the same to the guest):
    guest: every host column's per-bin row counts by class (hence its event and non-event counts and
        WOE), the host's column names and bin count per column; not the host's values or cuts.
    host: the guest's public key, n and K, and from ``woe.result``: which of its cuts the guest kept
        (monotonic: where its bins' event rates are not monotone), which columns were selected, and,
        only with ``send_woe`` (to encode its columns for a WOE model), the WOE of each bin with at least
        ``min_woe_rows`` rows (others get 0). WOE values are functions of the labels: a host that lies
        about its bins (two columns that differ by one row) can learn individual labels from them, which
        no check can prevent; ``send_woe`` is off by default and docs/security.md says so.

Checks on the host's word (ProtocolError in the parse callback: rejected, logged, the guest's deadline
names the host): the columns and bins within the job's ``max_features`` and ``max_bins`` + 1 (the
missing bin); every column's counts sum to n; each decrypted sum is a whole number; per bin each
class's rows lie in [0, count] and the classes add up to the count; per column each class's rows add
up to the guest's own class total.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..compute import executor as _ex
from ..crypto.homomorphic.backend import PairSums
from ..crypto.homomorphic.key_prefetch import resolve_keypair
from ..data.woe import ColumnBins
from ..proto import messages_pb2, tree_pb2
from ..transport import ProtocolError, Transport, TransportError, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto
from ..transport.he_codec import backend_and_codec
from ..transport.role import ProtocolRole
from ..transport.row_parts import MAX_ROW_PARTS, ROW_PART_ROUNDS, ROW_PART_WINDOW, part_rows

log = logging.getLogger("secureflhv.woe")

TAG_SETUP, TAG_COUNTS, TAG_START = "woe.setup", "woe.counts", "woe.start"
TAG_ROWS, TAG_ROWS_ACK, TAG_SUMS, TAG_RESULT = "woe.rows", "woe.rows_ack", "woe.sums", "woe.result"
OBJECTIVE = "woe_binning"  # SbSetup.objective of this protocol


class BinningError(RuntimeError):
    """The federated binning cannot go on (a peer failed, went silent or misbehaved)."""


def _part_round(pass_: int, part: int) -> int:
    return ROW_PART_ROUNDS.pack(tree=pass_, part=part) + 1


def passes(n_classes: int) -> int:
    """Encrypted passes over the rows: two classes per pass (one GH-packed ciphertext per row)."""
    return -(-int(n_classes) // 2)


@dataclass(frozen=True)
class HostBins:
    """What the guest learns of one host: its column names and, per column, the rows of each bin and
    class (int64 (n_bins, K); the last bin is the missing values')."""

    names: list[str]
    counts: list[np.ndarray]


@dataclass(frozen=True)
class HostDecision:
    """The guest's answer to a host, per column: the cuts kept (bool (bins - 2,)), whether the column is
    selected, and the WOE of its final bins (float64, or None when not sent)."""

    keep_cuts: list[np.ndarray]
    selected: list[bool]
    woe: list[np.ndarray] | None


class BinningGuest(ProtocolRole):
    """The label holder: encrypts its class indicators, decrypts every host's per-bin counts.

    Args:
        transport: this party's transport.
        host_ids: the hosts, as the job file lists them.
        y: int (n,) class ids 0..K-1 of the aligned rows (PSI order, the same rows at every host).
        n_classes: K >= 2.
        max_features, max_bins: the job's bounds on a host's columns and value bins per column.
        key_bits, insecure_test_key: the key (test keys only with the job's test setting).
        backend: ``paillier`` (default), ``ou`` (Okamoto-Uchiyama) or ``identity`` (NO encryption: benchmark
            baseline only); the hosts must use the same.
        keypair: a key pair generated beforehand (or its prefetch, :mod:`secureflhv.crypto.homomorphic.key_prefetch`);
            None: generated here.
    Raises ValueError for labels that are not class ids 0..n_classes-1 of at least one row.
    """

    def __init__(self, transport: Transport, host_ids: Sequence[str], y: np.ndarray, n_classes: int, *,
                 max_features: int, max_bins: int, key_bits: int = 2048, insecure_test_key: bool = False,
                 backend=None, keypair=None):
        super().__init__(transport)
        self.host_ids = list(host_ids)
        self.y = np.asarray(y, dtype=np.int64)
        self.n_classes = int(n_classes)
        if self.n_classes < 2 or self.y.size == 0 or self.y.min() < 0 or self.y.max() >= self.n_classes:
            raise ValueError(f"labels must be class ids 0..{self.n_classes - 1} of at least one row")
        self.totals = np.bincount(self.y, minlength=self.n_classes)
        self.max_features, self.max_bins = int(max_features), int(max_bins)
        self.key_bits, self.insecure_test_key = int(key_bits), bool(insecure_test_key)
        self.he, self.wire = backend_and_codec(backend)
        self._keypair = keypair

    def _peers(self) -> list[str]:
        return self.host_ids

    def host_counts(self) -> dict[str, HostBins]:
        """Run the protocol up to the counts: {host: :class:`HostBins`}. Raises BinningError naming a host."""
        return self._guarded(self._host_counts)

    def _host_counts(self) -> dict[str, HostBins]:
        n = len(self.y)
        self.pub, self.priv = resolve_keypair(self._keypair) or self.he.generate_keypair(self.key_bits,
                                                                                        self.insecure_test_key)
        setup = tree_pb2.SbSetup(n_rows=n, objective=OBJECTIVE, n_classes=self.n_classes,
                                 n_trees=passes(self.n_classes), hosts=self.host_ids, max_bin=self.max_bins)
        self.wire.put_setup_key(setup, self.pub)
        for h in self.host_ids:
            self._send(h, TAG_SETUP, setup, 0)
        announced = {h: self._recv(h, TAG_COUNTS, 0, self._counts_parser(h, n)) for h in self.host_ids}
        names = {h: a[0] for h, a in announced.items()}
        sizes = {h: a[1] for h, a in announced.items()}  # per column, its bins' row counts
        counts = {h: [np.zeros((len(c), self.n_classes), np.int64) for c in sizes[h]] for h in self.host_ids}
        for m in range(passes(self.n_classes)):
            classes = [2 * m, 2 * m + 1]
            sums = self._send_rows(m, n, classes)
            for h in self.host_ids:
                cum = self._recv(h, TAG_SUMS, m + 1, self._sums_parser(h, m, sums, sizes[h]))
                self._fill(counts[h], sizes[h], cum, classes)
        for h in self.host_ids:
            self._check_totals(h, counts[h], sizes[h])
        return {h: HostBins(names[h], counts[h]) for h in self.host_ids}

    def send_decisions(self, decisions: dict[str, HostDecision]) -> None:
        """``woe.result`` to every host: its columns' kept cuts, selection and (optionally) WOE."""
        self._guarded(self._send_decisions, decisions)

    def _send_decisions(self, decisions: dict[str, HostDecision]) -> None:
        for h in self.host_ids:
            d = decisions[h]
            msg = messages_pb2.Bundle()
            msg.tensors["keep_cuts"].CopyFrom(tensor_to_proto(np.concatenate(
                [np.asarray(k, dtype=np.uint8) for k in d.keep_cuts] or [np.zeros(0, np.uint8)])))
            msg.tensors["selected"].CopyFrom(tensor_to_proto(np.asarray(d.selected, dtype=np.uint8)))
            if d.woe is not None:
                msg.tensors["woe"].CopyFrom(tensor_to_proto(np.concatenate(d.woe or [np.zeros(0)]), "<f8"))
            self._send(h, TAG_RESULT, msg, 0)

    # ---------------------------------------------------------------- guest internals
    def _send(self, host: str, tag: str, msg, rnd: int) -> None:
        try:
            self.t.send(host, tag, msg, round=rnd)
        except TransportError as exc:
            raise BinningError(f"host {host!r} unreachable (sending {tag!r}): {exc}") from exc

    def _recv(self, host: str, tag: str, rnd: int, parse):
        try:
            return self.t.recv(host, tag, round=rnd, parse=parse)
        except TransportError as exc:
            raise BinningError(f"host {host!r} failed or went silent (waiting for {tag!r}): {exc}") from exc

    def _counts_parser(self, host: str, n: int):
        """``woe.counts``: names and per-column bin sizes within the job's bounds, each column's summing to n."""
        def check(m: messages_pb2.Bundle):
            what = f"bin counts from {host}"
            if set(m.tensors) != {"n_bins", "counts"} or "names" not in m.text:
                raise ProtocolError(f"{what}: expected tensors n_bins, counts and text names")
            n_bins = tensor_from_proto(m.tensors["n_bins"], what=what, dtype="<i8")
            if n_bins.ndim != 1 or not 1 <= len(n_bins) <= self.max_features:
                raise ProtocolError(f"{what}: {n_bins.size} columns, the job allows 1..{self.max_features}")
            if np.any(n_bins < 2) or np.any(n_bins > self.max_bins + 1):
                raise ProtocolError(f"{what}: bins per column must lie in 2..{self.max_bins + 1} (params.max_bins "
                                    f"value bins and the missing bin)")
            flat = tensor_from_proto(m.tensors["counts"], what=what, dtype="<i8", shape=(int(n_bins.sum()),))
            sizes = np.split(flat, np.cumsum(n_bins)[:-1])
            if any(np.any(s < 0) or s.sum() != n for s in sizes):
                raise ProtocolError(f"{what}: every column's bin counts must be >= 0 and sum to the {n} rows")
            names = m.text["names"].split("\n")
            if len(names) != len(n_bins) or len(set(names)) != len(names):
                raise ProtocolError(f"{what}: {len(names)} distinct names for {len(n_bins)} columns")
            return names, sizes
        return parse_message(messages_pb2.Bundle, check)

    def _send_rows(self, m: int, n: int, classes: list[int]) -> PairSums:
        """Pass ``m``: SbTreeStart, then the encrypted class-indicator pairs in parts (acknowledged with a
        window of ROW_PART_WINDOW parts, as SecureBoost's rows)."""
        sums = self.he.pair_sums(self.pub, 0, 0, n)
        rows = part_rows(n, self.wire.pair_bytes(self.pub), self.t.max_payload_bytes, _ex.workers())
        parts = -(-n // rows)
        start = tree_pb2.SbTreeStart(tree=m, precision_bits=0, log2_bound=0, part_rows=rows, row_parts=parts)
        for h in self.host_ids:
            self._send(h, TAG_START, start, m + 1)
        g, hh = (self.y == classes[0]).astype(np.int64), (self.y == classes[1]).astype(np.int64)
        for k in range(parts):
            a, b = k * rows, min(n, (k + 1) * rows)
            msg = tree_pb2.SbRowPart(tree=m, part=k)
            self.wire.put_pairs(msg, sums.encrypt(self.priv, g[a:b], hh[a:b]))
            for h in self.host_ids:
                if k >= ROW_PART_WINDOW:
                    self._ack(h, m, k - ROW_PART_WINDOW)
                self._send(h, TAG_ROWS, msg, _part_round(m, k))
        for h in self.host_ids:
            for k in range(max(0, parts - ROW_PART_WINDOW), parts):
                self._ack(h, m, k)
        return sums

    def _ack(self, host: str, m: int, k: int) -> None:
        def check(msg: tree_pb2.SbRowPart):
            if msg.tree != m or msg.part != k:
                raise ProtocolError(f"acknowledgement of part {msg.part} of pass {msg.tree}, expected {k} of {m}")
        self._recv(host, TAG_ROWS_ACK, _part_round(m, k), parse_message(tree_pb2.SbRowPart, check))

    def _sums_parser(self, host: str, m: int, sums: PairSums, sizes: list[np.ndarray]):
        """``woe.sums``: one node of exactly the non-empty bins' candidates, decrypted to whole numbers."""
        n_cands = sum(int(np.count_nonzero(s)) for s in sizes)

        def check(msg: tree_pb2.SbHistograms):
            what = f"encrypted bin sums from {host} (pass {m})"
            if len(msg.nodes) != 1 or msg.nodes[0].node != m or msg.nodes[0].n_candidates != n_cands:
                raise ProtocolError(f"{what}: expected one node {m} of {n_cands} candidates")
            value = self.wire.pair_sums_from(msg, self.pub, sums, [n_cands], what)
            cum = sums.decrypt(self.priv, value, [n_cands])
            if not np.all(np.isfinite(cum)) or np.any(cum != np.round(cum)) or np.any(np.abs(cum) > 2 ** 52):
                raise ProtocolError(f"{what}: sums that are not whole row counts")
            return cum.astype(np.int64)
        return parse_message(tree_pb2.SbHistograms, check)

    def _fill(self, counts: list[np.ndarray], sizes: list[np.ndarray], cum: np.ndarray, classes: list[int]) -> None:
        """Per column: differences of the cumulative sums at its non-empty bins -> rows per bin of ``classes``."""
        off = 0
        for j, size in enumerate(sizes):
            nz = np.flatnonzero(size)
            c = cum[off:off + len(nz)]
            off += len(nz)
            per_bin = np.diff(np.vstack([np.zeros((1, 2), np.int64), c]), axis=0)
            for slot, k in enumerate(classes):
                if k < self.n_classes:
                    counts[j][nz, k] = per_bin[:, slot]
                elif np.any(per_bin[:, slot] != 0):
                    raise ProtocolError(f"column {j}: rows of class {k}, of which there are none")

    def _check_totals(self, host: str, counts: list[np.ndarray], sizes: list[np.ndarray]) -> None:
        """Each bin's classes in [0, size] adding up to its size; each class adding up to the guest's total."""
        for j, (c, size) in enumerate(zip(counts, sizes)):
            if np.any(c < 0) or np.any(c.sum(axis=1) != size) or np.any(c.sum(axis=0) != self.totals):
                raise BinningError(f"host {host!r} sent bin sums of column {j} that do not match its bin counts or "
                                   f"the label totals: a lying or broken host; binning stopped (ask its operator "
                                   f"to check its data and software version, or run without that host)")


class BinningHost(ProtocolRole):
    """A feature holder: bins its columns, sums the guest's encrypted class indicators per bin.

    Args:
        transport: this party's transport.
        guest_id: the guest.
        bins: this host's :class:`~secureflhv.data.woe.ColumnBins`, one per column.
        X: float64 (n, d) the aligned rows (PSI order), NaN = missing.
        max_bins: the job's bound on value bins per column (the guest's SbSetup must agree).
        insecure_test_key: accept the guest's small test key (the job's test setting).
        backend: the guest's scheme, ``paillier`` (default), ``ou`` or ``identity`` (benchmark baseline).
    Raises ValueError when X is not (n, len(bins)).
    """

    def __init__(self, transport: Transport, guest_id: str, bins: Sequence[ColumnBins], X: np.ndarray, *,
                 max_bins: int, insecure_test_key: bool = False, backend=None):
        super().__init__(transport)
        self.guest_id, self.bins = guest_id, list(bins)
        self.X = np.asarray(X, dtype=np.float64)
        if self.X.ndim != 2 or self.X.shape[1] != len(self.bins):
            raise ValueError(f"X must be (n, {len(self.bins)}), got {self.X.shape}")
        self.max_bins, self.insecure_test_key = int(max_bins), bool(insecure_test_key)
        self.he, self.wire = backend_and_codec(backend)
        self.index = np.stack([b.index(self.X[:, j]) for j, b in enumerate(self.bins)], axis=1) \
            if self.bins else np.zeros((len(self.X), 0), np.int64)
        self.n_bins = [b.n_bins for b in self.bins]

    def _peers(self) -> list[str]:
        return [self.guest_id]

    def run(self) -> HostDecision:
        """Serve the guest's binning; return its decision for this host's columns. Raises BinningError."""
        return self._guarded(self._run)

    def _run(self) -> HostDecision:
        n = len(self.X)
        setup = self.t.recv(self.guest_id, TAG_SETUP, round=0,
                            parse=parse_message(tree_pb2.SbSetup, lambda m: self._check_setup(m, n)))
        self.pub = self.wire.setup_key(setup, self.insecure_test_key)
        sizes = [np.bincount(self.index[:, j], minlength=nb) for j, nb in enumerate(self.n_bins)]
        msg = messages_pb2.Bundle()
        msg.tensors["n_bins"].CopyFrom(tensor_to_proto(np.asarray(self.n_bins, np.int64)))
        msg.tensors["counts"].CopyFrom(tensor_to_proto(np.concatenate(sizes).astype(np.int64)))
        msg.text["names"] = "\n".join(b.name for b in self.bins)
        self.t.send(self.guest_id, TAG_COUNTS, msg, round=0)
        cands = [(j, b) for j, s in enumerate(sizes) for b in np.flatnonzero(s).tolist()]
        bins_u = self.index.astype(np.uint16 if max(self.n_bins) > 255 else np.uint8)
        for m in range(int(setup.n_trees)):
            sums, rows, parts = self._start(m, n)
            data = self._receive_rows(m, sums, rows, parts)
            hist = sums.histogram(data, np.arange(n), bins_u, self.n_bins)
            out = tree_pb2.SbHistograms()
            out.nodes.add(node=m, n_candidates=len(cands))
            self.wire.put_pair_sums(out, sums.collect(sums.select(hist, cands)))
            sums.release(data)
            self.t.send(self.guest_id, TAG_SUMS, out, round=m + 1)
        return self.t.recv(self.guest_id, TAG_RESULT, round=0, parse=parse_message(messages_pb2.Bundle,
                                                                                  self._check_result))

    def _check_setup(self, m: tree_pb2.SbSetup, n: int) -> tree_pb2.SbSetup:
        if m.objective != OBJECTIVE:
            raise ProtocolError(f"setup for {m.objective!r}, expected {OBJECTIVE!r}")
        if m.n_rows != n:
            raise ProtocolError(f"guest has {m.n_rows} rows, {self.party_id} has {n} (run PSI first)")
        if m.max_bin != self.max_bins:
            raise ProtocolError(f"params.max_bins: {self.max_bins} here, {m.max_bin} at the guest")
        if not 2 <= m.n_classes <= 1000 or m.n_trees != passes(m.n_classes):
            raise ProtocolError(f"{m.n_classes} classes in {m.n_trees} passes")
        if self.party_id not in m.hosts:
            raise ProtocolError(f"{self.party_id} is not in the guest's host list {list(m.hosts)}")
        return m

    def _start(self, m: int, n: int) -> tuple[PairSums, int, int]:
        def check(s: tree_pb2.SbTreeStart):
            rows, parts = int(s.part_rows), int(s.row_parts)
            if s.tree != m or s.stop or s.precision_bits != 0 or s.log2_bound != 0:
                raise ProtocolError(f"pass start {s.tree} (precision {s.precision_bits}), expected pass {m} of "
                                    f"0/1 indicators")
            if not 1 <= rows <= n or parts != -(-n // rows) or parts > MAX_ROW_PARTS:
                raise ProtocolError(f"{parts} parts of {rows} rows for the {n} rows here")
            limit = self.t.max_payload_bytes
            if limit is not None and rows * self.wire.pair_bytes(self.pub) > limit:
                raise ProtocolError(f"parts of {rows} rows exceed this party's message limit")
            return rows, parts
        rows, parts = self.t.recv(self.guest_id, TAG_START, round=m + 1,
                                  parse=parse_message(tree_pb2.SbTreeStart, check))
        return self.he.pair_sums(self.pub, 0, 0, n), rows, parts

    def _receive_rows(self, m: int, sums: PairSums, rows: int, parts: int):
        n, got = len(self.X), []
        for k in range(parts):
            count = min(n, (k + 1) * rows) - k * rows

            def check(p: tree_pb2.SbRowPart, k=k, count=count):
                if p.tree != m or p.part != k:
                    raise ProtocolError(f"row part {p.part} of pass {p.tree}, expected part {k} of pass {m}")
                return self.wire.pairs_from(p, self.pub, sums, count)

            got.append(self.t.recv(self.guest_id, TAG_ROWS, round=_part_round(m, k),
                                   parse=parse_message(tree_pb2.SbRowPart, check)))
            self.t.send(self.guest_id, TAG_ROWS_ACK, tree_pb2.SbRowPart(tree=m, part=k), round=_part_round(m, k))
        return self.wire.join_pairs(got)

    def _check_result(self, m: messages_pb2.Bundle) -> HostDecision:
        what = "the guest's binning result"
        n_cuts = [nb - 2 for nb in self.n_bins]
        keep = tensor_from_proto(m.tensors["keep_cuts"], what=what, dtype="|u1", shape=(sum(n_cuts),)) \
            if "keep_cuts" in m.tensors else None
        selected = tensor_from_proto(m.tensors["selected"], what=what, dtype="|u1", shape=(len(self.bins),)) \
            if "selected" in m.tensors else None
        if keep is None or selected is None or np.any(keep > 1) or np.any(selected > 1):
            raise ProtocolError(f"{what}: needs 0/1 keep_cuts ({sum(n_cuts)}) and selected ({len(self.bins)})")
        keep_cuts = [k.astype(bool) for k in np.split(keep, np.cumsum(n_cuts)[:-1])] if self.bins else []
        woe = None
        if "woe" in m.tensors:
            final = [int(k.sum()) + 2 for k in keep_cuts]
            flat = tensor_from_proto(m.tensors["woe"], what=what, dtype="<f8", shape=(sum(final),))
            woe = np.split(flat, np.cumsum(final)[:-1]) if final else []
        return HostDecision(keep_cuts, [bool(s) for s in selected], woe)
