"""KKRT-PSI: private set intersection from OT extension, a drop-in for the ECDH-PSI of :mod:`.psi`.

Use :func:`align_ids_guest` / :func:`align_ids_host` of this module instead of :mod:`.psi`'s (same
arguments; job file: ``job.psi_protocol: kkrt``). Same :class:`~secureflhv.vertical.psi.PsiResult` (same
``ids`` in the same agreed order, same ``rows``), same final step (``psi/intersection``) and the
same leakage profile as ECDH-PSI. Source: Kolesnikov, Kumaresan, Rosulek & Trieu, "Efficient
Batched Oblivious PRF with Applications to Private Set Intersection", ACM CCS 2016, sections 3
and 5 (semi-honest); primitives, parameters and their reasons in :mod:`secureflhv.crypto.kkrt`.

Protocol for the guest G (IDs X, n = |X|) and each host H_j (IDs Y_j), over :class:`Transport`:

0. G picks a 32-byte salt; with the job id it keys everything of the run (session context). G
   cuckoo-hashes X into m = ``cuckoo_bins(n)`` bins with 3 hash functions (a fresh salt if that
   fails, before anything is sent).
1. G -> H_j ``psi/hello`` (PsiHello, protocol "kkrt"): salt, n, truncation width t.
2. H_j -> G ``psi/kkrt/base_ot`` (KkrtBaseOt): H_j's 512 base-OT receiver points, for random
   secret choice bits s (the OT-extension secret).
3. G -> H_j ``psi/kkrt/matrix`` (KkrtMatrix): G's 512 base-OT sender points and the OT-extension
   matrix U (m rows of 64 bytes) encoding the codewords C(x, i) of its bins' contents.
   H_j now holds Q with q_k = t_k xor (C(r_k) AND s); G holds T.
4. H_j -> G ``psi/kkrt/oprf`` (PsiPoints, item_bytes t, count 3 |Y_j|): for each y in H_j's row
   order and i = 0, 1, 2 the OPRF value F(h_i(y), y || i). G compares them with its own values
   F(bin(x), x || i(x)) = H(bin || t_bin): x in X is in Y_j exactly when its value is among them,
   and value number 3 r + i gives the host row r -- the information ECDH-PSI gives G.
5. G -> H_j ``psi/intersection``: as in ECDH-PSI (common IDs as H_j's rows, agreed order).

What each role learns (semi-honest; AES a PRP, BLAKE2b a random oracle, CDH in Ed25519's group):

* **guest**: |Y_j| and X ∩ Y_j with H_j's row positions, as in ECDH-PSI. For y not in X the values
  F(., y || i) are pseudo-random: they differ from anything G can compute by the bits of the unknown s
  at >= 128 positions where two codewords differ (crypto.kkrt: PRC). Nothing about other hosts.
* **host j**: |X| (and m, a function of it) and the final intersection, as in ECDH-PSI. The base-OT
  messages and U are pseudo-random to H_j (U is masked by G(k1), whose seeds H_j lacks), so they
  reveal nothing about X or the cuckoo placement; the salt's only dependence on X is that it places
  X (statistical distance <= the cuckoo failure probability, crypto.kkrt).
* Fresh salt, base OTs and choice bits per run and per host: nothing links two runs; hosts never talk,
  and each host's OT extension uses its own seeds.
* Not covered (semi-honest model): a malicious guest can choose U to learn more than the intersection
  (KKRT's protocol is semi-honest), a malicious host can send wrong values.

Cost at 1M x 1M (one host): ~1M + 3M BLAKE2b calls, 1 + 3 AES passes over 64 bytes per item, 512 x
1.48M-bit PRG columns and bit transposes per side, 1,536 + 1,024 Ed25519 scalar multiplications.
Measured (``benchmarks/psi.py``, both parties on the same 2 cores, load ~1): ~9 core-s and ~8.5 s
wall, against ~144 core-s and ~76 s for ECDH-PSI in the same run. Runs in the calling process
(``workers`` is ignored: the steps depend on each other across the parties, and on shared cores a
pool's start-up would compete with the peer's critical path). Traffic per
host: 64 bytes per guest bin (~95 bytes per guest ID) to the host, 3t bytes per host ID back,
~33 KB of base-OT points, 8 bytes per common ID. One message holds at most ~22M guest IDs
(protobuf's 2 GiB limit on U).

Errors as in :mod:`.psi`: a malformed or inconsistent message (wrong lengths or counts, a matrix
whose size does not match the hello, an invalid or small-order Ed25519 point) is rejected with
:class:`~secureflhv.transport.ProtocolError` in the ``recv`` parse step, logged, and the wait goes on.
"""
from __future__ import annotations

import logging
import os
from typing import Sequence

import numpy as np
from nacl.bindings import crypto_core_ed25519_is_valid_point, crypto_core_ed25519_sub

from ..crypto import kkrt
from ..proto import psi_pb2
from ..transport import ProtocolError, Transport, parse_message
from .psi import (DEFAULT_TRUNCATE_BYTES, PROTOCOL_VERSION, TAG_HELLO, PsiGuest, PsiHost, PsiResult, _check_ids,
                  _hello_parser)

log = logging.getLogger("secureflhv.vertical.psi")

__all__ = ["KkrtGuest", "KkrtHost", "align_ids_guest", "align_ids_host", "TAG_BASE_OT", "TAG_MATRIX", "TAG_OPRF",
           "MAX_SET_SIZE"]

TAG_BASE_OT = "psi/kkrt/base_ot"
TAG_MATRIX = "psi/kkrt/matrix"
TAG_OPRF = "psi/kkrt/oprf"
# U (64 bytes per bin) must fit one protobuf message (< 2 GiB) and bin numbers a uint32
MAX_SET_SIZE = int(((2 ** 31 - 2 ** 20) // kkrt.CODE_BYTES - 256) / kkrt.BIN_FACTOR)
_OT_POINT_BYTES = kkrt.BASE_OTS * kkrt.POINT_BYTES


# ------------------------------------------------------------------------------ parse callbacks
def _check_ot_points(points: bytes, sender: str, what: str) -> bytes:
    if len(points) != _OT_POINT_BYTES:
        raise ProtocolError(f"{what} from {sender!r}: {len(points)} bytes, expected {kkrt.BASE_OTS} points "
                            f"of {kkrt.POINT_BYTES} bytes")
    valid = crypto_core_ed25519_is_valid_point
    for i in range(0, len(points), kkrt.POINT_BYTES):
        if not valid(points[i:i + kkrt.POINT_BYTES]):
            raise ProtocolError(f"{what} from {sender!r}: point {i // kkrt.POINT_BYTES} is not a valid "
                                f"prime-order Ed25519 point")
    return bytes(points)


def _base_ot_parser(sender: str, cp: bytes):
    """KkrtBaseOt -> the host's PK0 points; ``cp`` (:func:`~secureflhv.crypto.kkrt.base_ot_cp`): PK1 = Cp - PK0
    must be a valid point too (PK0 = Cp would make it the identity and fail the guest's key step)."""
    def validate(msg: psi_pb2.KkrtBaseOt):
        points = _check_ot_points(msg.points, sender, "base-OT points")
        for i in range(0, len(points), kkrt.POINT_BYTES):
            if not crypto_core_ed25519_is_valid_point(crypto_core_ed25519_sub(cp, points[i:i + kkrt.POINT_BYTES])):
                raise ProtocolError(f"base-OT points from {sender!r}: Cp - point {i // kkrt.POINT_BYTES} is not a "
                                    f"valid prime-order Ed25519 point")
        return points
    return parse_message(psi_pb2.KkrtBaseOt, validate)


def _matrix_parser(sender: str, rows: int):
    """KkrtMatrix -> ``(sender points, U (rows, 64) uint8)``; ``rows`` = cuckoo_bins(hello.set_size)."""
    def validate(msg: psi_pb2.KkrtMatrix):
        if msg.rows != rows:
            raise ProtocolError(f"OT-extension matrix from {sender!r}: {msg.rows} rows, expected {rows} "
                                f"(cuckoo bins for the hello's set size)")
        if len(msg.matrix) != rows * kkrt.CODE_BYTES:
            raise ProtocolError(f"OT-extension matrix from {sender!r}: {len(msg.matrix)} bytes for {rows} rows "
                                f"of {kkrt.CODE_BYTES} bytes")
        points = _check_ot_points(msg.ot_points, sender, "base-OT sender points")
        return points, np.frombuffer(msg.matrix, np.uint8).reshape(rows, kkrt.CODE_BYTES)
    return parse_message(psi_pb2.KkrtMatrix, validate)


def _oprf_parser(sender: str, width: int):
    """PsiPoints of 3 OPRF values per host ID -> the packed values."""
    def validate(msg: psi_pb2.PsiPoints):
        if msg.item_bytes != width:
            raise ProtocolError(f"OPRF values from {sender!r}: item_bytes {msg.item_bytes}, expected {width}")
        if msg.count % kkrt.N_HASHES:
            raise ProtocolError(f"OPRF values from {sender!r}: count {msg.count} is not {kkrt.N_HASHES} per ID")
        if len(msg.items) != msg.count * width:
            raise ProtocolError(f"OPRF values from {sender!r}: {len(msg.items)} bytes for {msg.count} values "
                                f"of {width} bytes")
        return msg.items
    return parse_message(psi_pb2.PsiPoints, validate)


def _check_message_size(transport: Transport, size: int, what: str) -> None:
    """Refuse before any work a message the peers would refuse (same job file: same ``job.max_message_mb``)."""
    limit = transport.max_payload_bytes
    if limit is not None and size > limit:
        raise ValueError(f"KKRT-PSI: {what} of {size / 2 ** 20:,.1f} MiB, above this job's message limit of "
                         f"{limit / 2 ** 20:,.1f} MiB: set job.max_message_mb to at least "
                         f"{-(-size // 2 ** 20) + 1} at every party, or use job.psi_protocol: ecdh")


# ------------------------------------------------------------------------------ roles
class KkrtGuest(PsiGuest):
    """The guest's side of KKRT-PSI (module docstring): PSI receiver, OT-extension receiver.

    Arguments, result and errors as in :func:`~secureflhv.vertical.psi.align_ids_guest`; the
    intersection step (:meth:`send_intersection`) is ECDH-PSI's.
    """

    psi_protocol = "kkrt"

    def _align(self) -> np.ndarray:
        self.ids = _check_ids(self.ids, self.party_id)
        if len(self.ids) > MAX_SET_SIZE:
            raise ValueError(f"KKRT-PSI takes at most {MAX_SET_SIZE} guest IDs, got {len(self.ids)}")
        _check_message_size(self.t, kkrt.cuckoo_bins(len(self.ids)) * kkrt.CODE_BYTES + _OT_POINT_BYTES + 64,
                            f"{len(self.ids):,} guest IDs make an OT-extension matrix")
        salt, ctx, items, cand, table, index = kkrt.guest_table(self.ids, self.t.job_id)
        self.clock.lap("hash")
        hello = psi_pb2.PsiHello(version=PROTOCOL_VERSION, salt=salt, set_size=len(self.ids),
                                 truncate_bytes=self.truncate_bytes, protocol=self.psi_protocol)
        for h in self.hosts:
            self._send(h, TAG_HELLO, hello)
        codewords = kkrt.guest_codewords(kkrt.Prc(ctx), items, table, index)
        del items, table
        self.clock.lap("extend")
        mine = {}
        for h in self.hosts:
            mine[h] = self._extend(h, ctx, codewords, cand, index)
        del codewords
        return self.send_intersection({h: self._match(h, mine.pop(h)) for h in self.hosts})

    def _extend(self, host: str, ctx: bytes, codewords: np.ndarray, cand: np.ndarray, index: np.ndarray) -> bytes:
        """Base OTs and OT extension with ``host``; returns our OPRF values (t bytes per guest row)."""
        sender = kkrt.BaseOtSender(ctx)
        self.clock.lap("base_ot")
        points = self._recv(host, TAG_BASE_OT, None, _base_ot_parser(host, kkrt.base_ot_cp(ctx)))
        self.clock.lap("wait")
        k0, k1 = sender.keys(points)
        self.clock.lap("base_ot")
        T, U = kkrt.receiver_rows(k0, k1, codewords)
        del k0, k1
        self.clock.lap("extend")
        self._send(host, TAG_MATRIX, psi_pb2.KkrtMatrix(ot_points=sender.points(), rows=U.shape[0],
                                                        matrix=U.tobytes()))
        del U
        self.clock.lap("send")
        values = kkrt.guest_values(ctx, T, cand, index, self.truncate_bytes)
        self.clock.lap("oprf")
        return values

    def _match(self, host: str, mine: bytes) -> np.ndarray:
        """Receive ``host``'s OPRF values and match; int64 (|X|,): each guest row's row at ``host``, or -1."""
        n, width = len(self.ids), self.truncate_bytes
        theirs = self._recv(host, TAG_OPRF, 3 * n, _oprf_parser(host, width))
        self.sizes[host] = len(theirs) // (kkrt.N_HASHES * width)
        self.clock.lap("wait")
        return self.host_rows(host, mine, theirs, width, per_id=kkrt.N_HASHES)


class KkrtHost(PsiHost):
    """A host's side of KKRT-PSI (module docstring): PSI sender, OT-extension sender.

    Arguments, result and errors as in :func:`~secureflhv.vertical.psi.align_ids_host`; the hello
    and the intersection steps are ECDH-PSI's.
    """

    psi_protocol = "kkrt"

    def _align(self):
        self.ids = _check_ids(self.ids, self.party_id)
        hello = self._recv(self.guest, TAG_HELLO, None,
                           _hello_parser(self.guest, self.psi_protocol, max_set_size=MAX_SET_SIZE))
        self.clock.lap("wait")
        _check_message_size(self.t, kkrt.N_HASHES * len(self.ids) * hello.truncate_bytes + 64,
                            f"{len(self.ids):,} host IDs make OPRF values")
        ctx = kkrt.session_context(self.t.job_id, hello.salt)
        rows = kkrt.cuckoo_bins(hello.set_size)
        choices = np.unpackbits(np.frombuffer(os.urandom(kkrt.BASE_OTS // 8), np.uint8)).astype(bool)
        receiver = kkrt.BaseOtReceiver(ctx, choices)
        self._send(self.guest, TAG_BASE_OT, psi_pb2.KkrtBaseOt(points=receiver.points()))
        self.clock.lap("base_ot")
        items, cand = kkrt.hash_ids(self.ids, ctx, rows)
        self.clock.lap("hash")
        points, U = self._recv(self.guest, TAG_MATRIX, len(self.ids) + hello.set_size,
                               _matrix_parser(self.guest, rows))
        self.clock.lap("wait")
        Q = kkrt.sender_rows(receiver.keys(points), choices, U)
        del U
        self.clock.lap("extend")
        values = kkrt.host_values(ctx, Q, choices, items, cand, hello.truncate_bytes)
        del Q
        self.clock.lap("oprf")
        self._send(self.guest, TAG_OPRF, psi_pb2.PsiPoints(item_bytes=hello.truncate_bytes,
                                                           count=kkrt.N_HASHES * len(self.ids), items=values))
        del values
        self.clock.lap("send")
        return (hello, *self.receive_intersection(hello))


def align_ids_guest(transport: Transport, ids: Sequence[str], hosts: Sequence[str], *, round_base: int = 0,
                    workers: int | None = None, truncate_bytes: int = DEFAULT_TRUNCATE_BYTES,
                    timeout: float | None = None) -> PsiResult:
    """KKRT-PSI as the guest with every host (each runs this module's :func:`align_ids_host`).

    Arguments, result and errors as in :func:`secureflhv.vertical.psi.align_ids_guest` (``workers``
    is accepted for the same signature and ignored: the work runs in this process); also raises
    ValueError for more than ``MAX_SET_SIZE`` IDs.
    """
    return KkrtGuest(transport, ids, hosts, round_base=round_base, workers=workers, truncate_bytes=truncate_bytes,
                     timeout=timeout).run()


def align_ids_host(transport: Transport, ids: Sequence[str], guest: str, *, round_base: int = 0,
                   workers: int | None = None, timeout: float | None = None) -> PsiResult:
    """KKRT-PSI as a host with the guest (which runs this module's :func:`align_ids_guest`).

    Arguments, result and errors as in :func:`secureflhv.vertical.psi.align_ids_host` (``workers`` ignored).
    """
    return KkrtHost(transport, ids, guest, round_base=round_base, workers=workers, timeout=timeout).run()
