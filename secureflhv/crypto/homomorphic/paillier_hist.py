"""Encrypted histograms of packed Paillier ciphertexts (vertical SecureBoost hosts): the hot path, on raw gmpy2 integers.

Every row i carries one Paillier ciphertext c_i = [[pack(g_i, h_i)]] (the guest packs both into one
plaintext, SecureBoost+ "GH packing", arXiv 2110.10927 sec. 4.1). A homomorphic addition is one
multiplication mod n^2, so the encrypted histogram of a node is, per feature j and bin b,
``prod_{i in node, bin_ij = b} c_i mod n^2``.

Costs and tricks (measured in ``benchmarks/secureboost.py``):

* integer-index bucketing: one pass over the node's rows per feature (or per PAIR of features on
  the joint bin, for nodes with more than 2 B^2 rows: ~half the multiplications), ``acc[bin] = acc[bin] * c % n2``
  (~4 us per row and feature at 2048-bit keys, the whole host cost); a node's work goes to the
  executor (:mod:`secureflhv.compute.executor`) as equal pieces of feature pairs and rows on the local
  pool (:func:`work_pieces`), as row shards on Ray; partial histograms of a shared pair are multiplied
  together; nodes from PAR_MIN_WORK rows x features (~4,000 rows of 10 features) go to the executor,
  and a level's smaller nodes go there together (:func:`build_nodes`);
* histogram subtraction (Ke et al. LightGBM 2017; SecureBoost+ sec. 4.2): only the child with fewer
  rows is built; vertical SecureBoost derives its sibling's candidate sums at the guest in plaintext, so
  :func:`subtract` (parent / child, one batched modular inversion) remains for a caller that needs
  the sibling's ciphertexts;
* cumulative sums over bins (left sums of each candidate), one multiplication per bin;
* cipher compression (SecureBoost+ sec. 4.3): k candidates' ciphertexts become one,
  ``C = prod_t c_t^(2^(t * 2s))`` (Horner: C = C^(2^(2s)) * c_t), because each candidate's plaintext is
  two signed slots of s bits; the guest decrypts ~k times fewer ciphertexts (k = 26 at 2048 bits
  for 10,000 rows: s = 39). Cost: 2s squarings mod n^2 per candidate (Horner is the shortest chain
  for these exponents), the host's largest cost at depth 5; a whole tree level is one batch for the
  pool (:func:`compress_many`).
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from concurrent.futures.process import BrokenProcessPool
from threading import BrokenBarrierError

import gmpy2
import numpy as np
from gmpy2 import mpz

from ...compute import executor as _ex
from . import paillier_engine as _eng
from ...compute import pool as _par
from .paillier_engine import batch_invert

PAR_MIN_WORK = 40_000       # rows * features below which a node is built inline (the pool pays off above ~3,000 rows x 10)
PAR_MIN_COMPRESS = 256      # candidates below which compression runs inline
PAR_MIN_LEVEL_WORK = 10_000  # rows * features of a level's small nodes below which they are built inline
                             # (whole nodes per task, nothing to merge: 4 nodes x 600 rows x 10, 107 ms
                             # inline, 66 ms on 2 workers)


def _bucket(cts: list, codes: list, size: int, n2) -> list:
    acc = [None] * size
    for c, b in zip(cts, codes):
        a = acc[b]
        acc[b] = c if a is None else a * c % n2
    return acc


def histograms(cts: list, bins: np.ndarray, n_bins: list[int], n2) -> list[list]:
    """Encrypted per-feature, per-bin sums for one node: list (features) of lists (bins) of mpz|None.

    cts: the node's row ciphertexts (mpz, len m); bins: uint (m, d) of the same rows. None = empty bin.

    Feature pairing: when the node has more than 2 * B_j * B_j' rows, features j and j' are bucketed
    together on the joint bin b_j * B_j' + b_j' (one multiplication per row for both features) and the
    two histograms are the joint table's row and column products (<= 2 B_j B_j' multiplications), which
    nearly halves the multiplications of large nodes.
    """
    n2 = mpz(n2)
    m, d = bins.shape
    out: list = [None] * d
    j = 0
    while j < d:
        if j + 1 < d and m > 2 * n_bins[j] * n_bins[j + 1]:
            b2 = n_bins[j + 1]
            codes = (bins[:, j].astype(np.int64) * b2 + bins[:, j + 1]).tolist()
            joint = _bucket(cts, codes, n_bins[j] * b2, n2)
            h1, h2 = [None] * n_bins[j], [None] * b2
            for k, v in enumerate(joint):
                if v is None:
                    continue
                a, b = divmod(k, b2)
                h1[a] = v if h1[a] is None else h1[a] * v % n2
                h2[b] = v if h2[b] is None else h2[b] * v % n2
            out[j], out[j + 1] = h1, h2
            j += 2
        else:
            out[j] = _bucket(cts, bins[:, j].tolist(), n_bins[j], n2)
            j += 1
    return out


def task_histograms(n2: int, cts: list, bins: np.ndarray, n_bins: list) -> list:
    """Worker task: :func:`histograms` of one node's ciphertexts ``cts`` and bins (uint (m, d))."""
    return histograms(cts, bins, n_bins, n2)


def _merge_bins(fa: list, fb: list, n2) -> list:
    """Per-bin product of two partial histograms of one feature (None = empty)."""
    return [y if x is None else (x if y is None else x * y % n2) for x, y in zip(fa, fb)]


def _merge(a: list, b: list, n2) -> list:
    return [_merge_bins(fa, fb, n2) for fa, fb in zip(a, b)]


FEATURE_SPLIT_MAX_WORKERS = 4  # above this, sending every task all the node's rows costs more than it saves
RESIDENT_KEEP = 2  # row-ciphertext lists each worker keeps (the current tree's of up to two hosts sharing the pool)


# ------------------------------------------------------------------ row ciphertexts resident in the workers
# A tree's row ciphertexts are sent to every worker of the local pool once (``_resident_token``); the
# histogram tasks of every level then carry row indices, not ciphertexts (10,000 rows: 22 ms of
# pickling per task and level in this process, a serial cost that held 2 workers to ~1.5x).
class ResidentMissing(LookupError):
    """A worker lacks the row ciphertexts a task refers to (its pool was restarted)."""


_resident: OrderedDict = OrderedDict()  # in a worker: token -> row ciphertexts
_installed: OrderedDict = OrderedDict()  # in the caller: id(list) -> (list, token, pool)
_install_lock = threading.Lock()
_tokens = itertools.count(1)


def _install(token: int, blob: bytes, width: int) -> None:
    _resident[token] = _eng.from_blob(blob, width)
    while len(_resident) > RESIDENT_KEEP:
        _resident.popitem(last=False)


def _resident_rows(token: int, rows: np.ndarray) -> list:
    cts = _resident.get(token)
    if cts is None:
        raise ResidentMissing(f"row ciphertexts {token} are not in this worker")
    return [cts[i] for i in rows.tolist()]


def _resident_token(cts_all: list, n2) -> int | None:
    """A token under which every worker of the local pool holds ``cts_all`` (residues mod ``n2``, sent at
    the first call for that list as one fixed-width byte string: a pickled list of 10,000 mpz costs
    the caller ~15 ms per worker, the bytes ~6 ms once); None on another executor or inline."""
    if not isinstance(_ex.current(), _ex.LocalExecutor) or not _par.pooled():
        return None
    with _install_lock:
        pool = _par._get_pool()
        hit = _installed.get(id(cts_all))
        if hit is not None and hit[0] is cts_all and hit[2] is pool:
            return hit[1]
        token = next(_tokens)
        width = (int(n2).bit_length() + 7) // 8
        blob = _eng.to_blob(cts_all, width)
        try:
            _par.on_each_worker(_install, token, blob, width)
        except (BrokenProcessPool, BrokenBarrierError):
            return None  # the tasks then carry the ciphertexts (and the executor handles the broken pool)
        _installed[id(cts_all)] = (cts_all, token, pool)
        while len(_installed) > RESIDENT_KEEP:
            _installed.popitem(last=False)
        return token


def _forget(cts_all: list) -> None:
    with _install_lock:
        _installed.pop(id(cts_all), None)


def _uninstall(token: int) -> None:
    _resident.pop(token, None)


def release(cts_all: list) -> None:
    """The workers drop ``cts_all`` (a tree is finished). Kept alive, 10,000 row ciphertexts made the same
    workers' encryption ~13% slower (the guest's, where guest and host share a pool), besides the memory."""
    with _install_lock:
        hit = _installed.pop(id(cts_all), None)
        if hit is not None and hit[0] is cts_all and hit[2] is _par.current_pool():
            try:
                _par.on_each_worker(_uninstall, hit[1])
            except (BrokenProcessPool, BrokenBarrierError):
                pass  # a broken pool's workers hold nothing any more


def task_histogram_pieces_resident(n2: int, token: int, rows: np.ndarray, bins: np.ndarray, n_bins: list,
                                   pieces: list) -> list:
    """:func:`task_histogram_pieces` on the worker's resident row ciphertexts ``rows``."""
    return task_histogram_pieces(n2, _resident_rows(token, rows), bins, n_bins, pieces)


def task_histograms_of_resident_nodes(n2: int, token: int, nodes: list) -> list:
    """:func:`task_histograms_of_nodes` with each node's rows given as indices of the resident list."""
    return [histograms(_resident_rows(token, rows), bins, n_bins, n2) for rows, bins, n_bins in nodes]


def work_pieces(m: int, d: int, parts: int) -> list[list[tuple[int, int, int, int]]]:
    """Cut a node's work (m rows x d features, in units of one feature pair) into ``parts`` near-equal
    tasks: the units in column order, m rows each, laid end to end and cut every m * units / parts rows.
    A task is a list of pieces (lo, hi, r0, r1): columns [lo, hi) over rows [r0, r1). Whole pairs keep
    :func:`histograms`' pairing; only the pair at each cut is shared by two tasks, whose partial
    histograms are multiplied (10 features on 2 workers: 2.5 pairs each, where whole pairs per worker
    would be 2 and 3, and a split by rows would build every pair's marginals twice)."""
    units = [(lo, min(d, lo + 2)) for lo in range(0, d, 2)]
    cuts = [m * len(units) * k // parts for k in range(parts + 1)]
    tasks = []
    for a, b in zip(cuts, cuts[1:]):
        pieces = [(lo, hi, max(a - u * m, 0), min(b - u * m, m)) for u, (lo, hi) in enumerate(units)]
        pieces = [p for p in pieces if p[2] < p[3]]
        if pieces:
            tasks.append(pieces)
    return tasks


def task_histogram_pieces(n2: int, cts: list, bins: np.ndarray, n_bins: list, pieces: list) -> list:
    """Worker side of :func:`build_node`'s local-pool path: ``histograms`` of each piece (columns and rows
    relative to the block this task was sent)."""
    return [histograms(cts[r0:r1], bins[r0:r1, lo:hi], n_bins[lo:hi], n2) for lo, hi, r0, r1 in pieces]


def build_node(cts_all: list, rows: np.ndarray, bins_all: np.ndarray, n_bins: list[int], n2) -> list[list]:
    """Histograms of the node whose rows (int64, ascending) index ``cts_all`` / ``bins_all``."""
    n2 = mpz(n2)
    parts = _ex.parallel_chunks(len(rows) * bins_all.shape[1], PAR_MIN_WORK)
    if parts > 1:  # an executor that keeps the rows as shards builds each shard's part where it lies
        res = _ex.run_sharded(task_histograms, (int(n2),), (cts_all, bins_all), rows, (list(n_bins),))
        if res is not None:
            out = res[0]
            for r in res[1:]:
                out = _merge(out, r, n2)
            return out
    b = bins_all[rows]
    if parts == 1:
        return histograms([cts_all[i] for i in rows.tolist()], b, n_bins, n2)
    parts = min(parts, _ex.workers())
    if parts <= FEATURE_SPLIT_MAX_WORKERS:
        tasks = work_pieces(len(rows), b.shape[1], parts)
        blocks = []
        for pieces in tasks:
            r0, r1 = min(p[2] for p in pieces), max(p[3] for p in pieces)
            c0, c1 = min(p[0] for p in pieces), max(p[1] for p in pieces)
            blocks.append((r0, r1, np.ascontiguousarray(b[r0:r1, c0:c1]), list(n_bins[c0:c1]),
                           [(lo - c0, hi - c0, a - r0, z - r0) for lo, hi, a, z in pieces]))
        res = _with_resident(
            cts_all, n2,
            lambda token: _ex.run(task_histogram_pieces_resident, (int(n2), token),
                                  [(rows[r0:r1], *rest) for r0, r1, *rest in blocks]),
            lambda: _ex.run(task_histogram_pieces, (int(n2),),
                            [([cts_all[i] for i in rows[r0:r1].tolist()], *rest) for r0, r1, *rest in blocks]))
        out: list = [None] * b.shape[1]
        for pieces, hists in zip(tasks, res):
            for (lo, hi, _, _), hist in zip(pieces, hists):
                for j, h in zip(range(lo, hi), hist):
                    out[j] = h if out[j] is None else _merge_bins(out[j], h, n2)
        return out
    cts = [cts_all[i] for i in rows.tolist()]
    # many workers: one chunk of rows each (a task sent all rows would cost more than it saves)
    bounds = [len(rows) * i // parts for i in range(parts + 1)]
    chunks = [(cts[bounds[i]:bounds[i + 1]], np.ascontiguousarray(b[bounds[i]:bounds[i + 1]]), list(n_bins))
              for i in range(parts) if bounds[i + 1] > bounds[i]]
    res = _ex.run(task_histograms, (int(n2),), chunks)
    out = res[0]
    for r in res[1:]:
        out = _merge(out, r, n2)
    return out


def task_histograms_of_nodes(n2: int, nodes: list) -> list:
    """Worker side of :func:`build_nodes`: ``histograms`` of each (cts, bins, n_bins)."""
    return [histograms(cts, bins, n_bins, n2) for cts, bins, n_bins in nodes]


def build_nodes(cts_all: list, rows_list: list[np.ndarray], bins_all: np.ndarray, n_bins: list[int], n2) -> list:
    """:func:`build_node` of each node of a tree level. Nodes worth the executor on their own are cut
    as there (:func:`work_pieces`, Ray shards); the smaller ones (deep levels: each under PAR_MIN_WORK)
    go to the workers together, whole nodes per task, largest first onto the least loaded task, instead
    of one after the other in this process (SecureBoost (a), depths 2-4: ~0.2 s of a tree on one core,
    the other idle).

    ``rows_list``: per node its int64 row indices (ascending) into ``cts_all`` / ``bins_all`` (uint, (n, d)).
    Returns one :func:`build_node` result per node, in order: per feature a list of per-bin ciphertexts
    mod ``n2`` (None for an empty bin). Identical to building the nodes one by one."""
    d = bins_all.shape[1]
    out: list = [None] * len(rows_list)
    small = []
    for i, rows in enumerate(rows_list):
        if len(rows) * d >= PAR_MIN_WORK:
            out[i] = build_node(cts_all, rows, bins_all, n_bins, n2)
        else:
            small.append(i)
    parts = min(len(small), _ex.parallel_chunks(sum(len(rows_list[i]) for i in small) * d, PAR_MIN_LEVEL_WORK))
    if parts <= 1:
        for i in small:
            out[i] = build_node(cts_all, rows_list[i], bins_all, n_bins, n2)
        return out
    tasks: list[list[int]] = [[] for _ in range(parts)]
    load = [0] * parts
    for i in sorted(small, key=lambda k: -len(rows_list[k])):
        t = load.index(min(load))
        tasks[t].append(i)
        load[t] += len(rows_list[i])
    res = _with_resident(
        cts_all, n2,
        lambda token: _ex.run(task_histograms_of_resident_nodes, (int(n2), token),
                              [([(rows_list[i], bins_all[rows_list[i]], list(n_bins)) for i in task],)
                               for task in tasks]),
        lambda: _ex.run(task_histograms_of_nodes, (int(n2),),
                        [([([cts_all[r] for r in rows_list[i].tolist()], bins_all[rows_list[i]], list(n_bins))
                           for i in task],) for task in tasks]))
    for task, hists in zip(tasks, res):
        for i, h in zip(task, hists):
            out[i] = h
    return out


def _with_resident(cts_all: list, n2, by_token, by_value):
    """``by_token(token)`` with ``cts_all`` resident in the workers, else (another executor, or a worker
    that lost it twice) ``by_value()``, which sends the ciphertexts with the tasks."""
    for _ in range(2):
        token = _resident_token(cts_all, n2)
        if token is None:
            break
        try:
            return by_token(token)
        except ResidentMissing:
            _forget(cts_all)  # a worker was restarted: send the list again
    return by_value()


def subtract(parent: list[list], child: list[list], n2) -> list[list]:
    """parent / child per bin (the sibling's histograms); None stands for an empty sum."""
    n2 = mpz(n2)
    need = [(j, b) for j, f in enumerate(child) for b, c in enumerate(f) if c is not None]
    inv = batch_invert([child[j][b] for j, b in need], n2)
    out = [list(f) for f in parent]
    for (j, b), ci in zip(need, inv):
        p = parent[j][b]
        if p is None:
            raise ValueError("histogram subtraction: child has rows in a bin where its parent has none")
        out[j][b] = p * ci % n2
    return out


def cumulative(hist: list[list], n2) -> list[list]:
    """Left sums: out[j][b] = prod_{b' <= b} hist[j][b'] (None while all are empty)."""
    n2 = mpz(n2)
    out = []
    for f in hist:
        acc, row = None, []
        for c in f:
            if c is not None:
                acc = c if acc is None else acc * c % n2
            row.append(acc)
        out.append(row)
    return out


def compress(cts: list, per: int, shift_bits: int, n2) -> list:
    """Pack groups of ``per`` ciphertexts into one: C = prod_t c_t^(2^(t*shift_bits)) (Horner)."""
    return compress_many([cts], per, shift_bits, n2)[0]


def compress_many(lists: list[list], per: int, shift_bits: int, n2) -> list[list]:
    """:func:`compress` of each list (groups never span two lists), as one batch for the executor.

    A tree level's nodes are compressed together: one parallel call instead of one per node, so
    nodes too small to be worth the pool on their own (deep levels) still use every worker.
    """
    n2 = mpz(n2)
    groups, sizes = [], []
    for cts in lists:
        g = [cts[i:i + per] for i in range(0, len(cts), per)]
        groups += g
        sizes.append(len(g))
    parts = _ex.parallel_chunks(sum(len(c) for c in lists), PAR_MIN_COMPRESS)
    if parts == 1:
        flat = _compress_groups(int(n2), shift_bits, groups)
    else:
        chunks = [(c,) for c in _par.split(groups, parts)]
        flat = [x for r in _ex.run(_compress_groups, (int(n2), shift_bits), chunks) for x in r]
    out, off = [], 0
    for k in sizes:
        out.append(flat[off:off + k])
        off += k
    return out


def _compress_groups(n2: int, shift_bits: int, groups: list) -> list:
    n2 = mpz(n2)
    e = mpz(1) << shift_bits
    out = []
    for g in groups:
        acc = g[-1]
        for c in reversed(g[:-1]):
            acc = gmpy2.powmod(acc, e, n2) * c % n2
        out.append(acc)
    return out
