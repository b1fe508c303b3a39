"""KKRT-PSI: private set intersection from OT extension, a drop-in for the ECDH-PSI of :mod:`.psi`.

The ID alignment of vertical jobs that declare their parties follow the protocol (job file
``job.psi_security: semi_honest``; ``job.psi_protocol`` then defaults to ``kkrt``): ~8x faster than
ECDH-PSI at 1M x 1M. Under the default ``job.psi_security: malicious`` jobs run ECDH-PSI, and an
explicit ``psi_protocol: kkrt`` is refused when the job file is read, because a guest that deviates
from this protocol learns every host ID (below). :func:`align_ids_guest` / :func:`align_ids_host`
take the same arguments as :mod:`.psi`'s. Same :class:`~secureflhv.vertical.psi.PsiResult` (same
``ids`` in the same agreed order, same ``rows``), same final step (``psi/intersection``) and the
same leakage profile as ECDH-PSI against parties that follow the protocol. Source: Kolesnikov,
Kumaresan, Rosulek & Trieu, "Efficient Batched Oblivious PRF with Applications to Private Set
Intersection", ACM CCS 2016, sections 3 and 5 (semi-honest), plus a choice-bit swap that takes the
host's base-OT choice bits out of its hands; primitives, parameters and their reasons in
:mod:`secureflhv.crypto.kkrt`.

Protocol for the guest G (IDs X, n = |X|) and each host H_j (IDs Y_j), over :class:`Transport`:

0. G picks a 32-byte salt; with the job id it keys everything of the run (session context). G
   cuckoo-hashes X into m = ``cuckoo_bins(n)`` bins with 3 hash functions (a fresh salt if that
   fails, before anything is sent).
1. G -> H_j ``psi/hello`` (PsiHello, protocol "kkrt"): salt, n, truncation width t.
2. H_j -> G ``psi/kkrt/base_ot`` (KkrtBaseOt): H_j's 512 base-OT receiver points, for random
   secret choice bits s' (they fix which key of each pair H_j can compute).
3. G -> H_j ``psi/kkrt/matrix`` (KkrtMatrix), in parts. Only after step 2's points arrived, G draws
   fresh random bits delta (512, from the OS) and swaps its base-OT key pairs where delta_i = 1
   (:func:`~secureflhv.crypto.kkrt.swap_base_ot_keys`): H_j's effective choice bits are s = s' xor delta
   (the OT-extension secret), uniform whatever s' it picked (its points fixed s' before it saw delta).
   Then the OT-extension matrix U (m rows of 64 bytes) encoding the codewords C(x, i) of its bins'
   contents, under the swapped keys. Part k travels in round ``round_base * 2**32 + k`` and holds rows
   [k R, min((k + 1) R, m)), R = the rows of part 0 (a multiple of 128; :func:`matrix_parts`: at most
   16 MiB and a quarter of ``job.max_message_mb``); part 0 also holds G's 512 base-OT sender points and
   delta (64 bytes; H_j refuses a part 0 without it). A part's row range follows from its round, so a
   guest cannot send overlapping, missing or out-of-order rows: any other row count or byte length
   is rejected. H_j acknowledges each part on receipt (``psi/kkrt/matrix_ack``, same round: a
   KkrtMatrix with only ``rows`` = the rows received so far) and computes its rows of Q while the
   next part travels. G computes U part by part and keeps at most W parts unacknowledged (W R 64
   bytes <= ``job.max_message_mb``), so H_j's mailbox (at most twice that queued per sender) never
   refuses a part as a flood. H_j now holds Q with q_k = t_k xor (C(r_k) AND s); G holds T.
4. H_j -> G ``psi/kkrt/oprf`` (PsiPoints, item_bytes t, count 3 |Y_j|): for each y in H_j's row
   order and i = 0, 1, 2 the OPRF value F(h_i(y), y || i). G compares them with its own values
   F(bin(x), x || i(x)) = H(bin || t_bin): x in X is in Y_j exactly when its value is among them,
   and value number 3 r + i gives the host row r -- the information ECDH-PSI gives G. In parts as
   in step 3 (:func:`value_parts`: V values per part, a multiple of 3; every part's ``count`` is the
   total), each acknowledged by G (``psi/kkrt/oprf_ack``: a PsiPoints with only t and the count
   received so far), at most W unacknowledged.
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

What a party that lies can still do:

* **A lying host** (any base-OT points, any OPRF values): learns whether guessed IDs are in the final
  intersection, as in ECDH-PSI -- a value matches a guest bin j only if it equals H(j || t_j), i.e. the
  host's q_j xor (C(g) AND s) for a guess g with C(g) = the bin's codeword on the ~256 positions where
  s is 1; the codewords are pseudo-random, so without the ID nothing matches. Before the swap a host
  with s' = 0 had q_j = t_j and made *every* guest item match; the guest then sent the matched bins in
  ID order and a dictionary walk recovered its IDs. Now s = s' xor delta has ~256 ones whatever s' was
  (fewer than 128 with probability < 2**-96). Guessing costs the host 3 values per guess (more to
  cover other bins), within ``max_ids`` IDs (``job.psi_max_ids``).
* **A lying guest** is *not* caught: it chooses U freely, so it can set row j to G(k0')_j xor G(k1')_j
  xor C(y) xor e_i for a known common ID y and read bit i of s from whether H_j's value for y matches;
  ~171 known IDs give all 512 bits, after which it evaluates F on any guess and recovers Y_j by
  dictionary. An actively secure extension needs a consistency check on U (Orrù, Orsini & Scholl,
  CT-RSA 2017), which needs a linear code (KKRT's pseudo-random code is not) and is not implemented.
  Hence the job setting: KKRT only with ``job.psi_security: semi_honest``; ECDH-PSI otherwise.
* **Set sizes are bounded by the job** (``max_ids``): a hello (the guest's n) or OPRF values
  (3 |Y_j|) announcing more than that is refused with :class:`~secureflhv.vertical.psi.PsiSetTooLarge`
  naming the sender before Q or any value list is allocated; a party with more IDs refuses before it
  sends anything.

Cost at 1M x 1M (one host): ~1M + 3M BLAKE2b calls, 1 + 3 AES passes over 64 bytes per item, 512 x
1.48M-bit PRG columns and bit transposes per side, 1,536 + 1,024 Ed25519 scalar multiplications.
Measured (``benchmarks/psi.py``, both parties on the same 2 cores, load ~1): ~9 core-s and ~8.5 s
wall, against ~144 core-s and ~76 s for ECDH-PSI in the same run. Runs in the calling process
(``workers`` is ignored: the steps depend on each other across the parties, and on shared cores a
pool's start-up would compete with the peer's critical path). Traffic per
host: 64 bytes per guest bin (~95 bytes per guest ID) to the host in parts of at most 16 MiB, 3t
bytes per host ID back, ~33 KB of base-OT points, ~100 bytes per part of acknowledgements, 8 bytes
per common ID. At most ``MAX_SET_SIZE`` (~22M) guest IDs: it bounds the Q a hello makes a host
allocate (64 bytes per bin, < 2 GiB; pages are only touched as parts arrive).

Message sizes: every message stays below ``job.max_message_mb`` whatever the set sizes (parts of at
most a quarter of it), so no set is too large for the default limit; a limit below ~25 KiB (part 0
with the base-OT points) is refused before any work (ValueError naming the setting).

Errors as in :mod:`.psi`: a malformed or inconsistent message (wrong lengths or counts, a part whose
rows or values do not match the hello and part 0, an acknowledgement of other rows or values than
were sent, an invalid or small-order Ed25519 point) is rejected with
:class:`~secureflhv.transport.ProtocolError` in the ``recv`` parse step, logged, and the wait goes on.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
from nacl.bindings import crypto_core_ed25519_is_valid_point, crypto_core_ed25519_sub

from ..crypto import kkrt
from ..proto import psi_pb2
from ..transport import ProtocolError, Transport, parse_message
from .psi import DEFAULT_MAX_IDS, DEFAULT_TRUNCATE_BYTES, TAG_HELLO, PsiGuest, PsiHost, PsiResult, _hello_parser

log = logging.getLogger("secureflhv.vertical.psi")

__all__ = ["KkrtGuest", "KkrtHost", "align_ids_guest", "align_ids_host", "matrix_parts", "value_parts", "part_round",
           "TAG_BASE_OT", "TAG_MATRIX", "TAG_MATRIX_ACK", "TAG_OPRF", "TAG_OPRF_ACK", "MAX_SET_SIZE", "MAX_HOST_IDS",
           "PART_BYTES", "MAX_WINDOW", "PROTOCOL_VERSION"]

PROTOCOL_VERSION = 2         # PsiHello.version of KKRT-PSI runs: 2 = with the choice-bit swap (delta in part 0)

TAG_BASE_OT = "psi/kkrt/base_ot"
TAG_MATRIX = "psi/kkrt/matrix"
TAG_MATRIX_ACK = "psi/kkrt/matrix_ack"
TAG_OPRF = "psi/kkrt/oprf"
TAG_OPRF_ACK = "psi/kkrt/oprf_ack"
# bounds the Q a hello makes a host allocate (64 bytes per bin, < 2 GiB); bin numbers fit a uint32
MAX_SET_SIZE = int(((2 ** 31 - 2 ** 20) // kkrt.CODE_BYTES - 256) / kkrt.BIN_FACTOR)
MAX_HOST_IDS = 2 ** 32 - 1   # a host's OPRF values announce at most 3 x this many (a sanity bound on a lie)
# U's parts: 16 MiB (262,144 rows) makes per-message costs noise and lets the host's Q work overlap the
# transfer; a quarter of the message limit at most, so that W >= 4 parts can be in flight
PART_BYTES = 16 * 2 ** 20
MAX_WINDOW = 8               # parts the guest keeps unacknowledged (< the mailbox's 64 messages per sender)
PART_ROUND_STRIDE = 2 ** 32  # part k of the run with round_base r travels in round r * 2**32 + k
_OT_POINT_BYTES = kkrt.BASE_OTS * kkrt.POINT_BYTES
_PART_OVERHEAD = 64          # protobuf framing of a part, generously


def part_round(round_base: int, part: int) -> int:
    """The transport round of part ``part`` (and of its acknowledgement) in the run of ``round_base``:
    increasing in the part and, across runs, in ``round_base`` (rounds per (sender, tag) must increase)."""
    return round_base * PART_ROUND_STRIDE + part


def _parts(count: int, unit_bytes: int, align: int, max_payload_bytes: int | None) -> tuple[int, int]:
    """``(per_part, W)`` for ``count`` units of ``unit_bytes``: per_part a multiple of ``align`` (at least
    ``align``, at most ``max(count, align)``) with per_part x unit_bytes <= min(``PART_BYTES``, limit / 4);
    W = min(``MAX_WINDOW``, limit / part size), at least 1, so W parts queued at the receiver stay within
    the limit: half of what its mailbox queues per sender. ``max_payload_bytes`` None: 256 MiB assumed."""
    limit = 256 * 2 ** 20 if max_payload_bytes is None else int(max_payload_bytes)
    budget = min(PART_BYTES, limit // 4 - _PART_OVERHEAD)
    per = max(align, budget // unit_bytes // align * align)
    per = min(per, max(count, align))
    return per, max(1, min(MAX_WINDOW, limit // (per * unit_bytes + _PART_OVERHEAD)))


def matrix_parts(bins: int, max_payload_bytes: int | None) -> tuple[int, int]:
    """``(R, W)``: rows per part of U (a multiple of 128, <= ``bins``) and parts in flight, for a matrix of
    ``bins`` rows under a message limit of ``max_payload_bytes`` (None: unknown, 256 MiB assumed).

    R x 64 bytes <= min(``PART_BYTES``, limit / 4) (at least 128 rows); W = min(``MAX_WINDOW``, limit / part
    size), at least 1: W parts queued at the host stay within the limit, half of what its mailbox queues
    per sender. Part 0 also carries the 16 KiB of base-OT points.
    """
    return _parts(bins, kkrt.CODE_BYTES, kkrt.ROW_ALIGN, max_payload_bytes)


def value_parts(values: int, width: int, max_payload_bytes: int | None) -> tuple[int, int]:
    """``(V, W)``: OPRF values per part (a multiple of 3, so a host row's values travel together) and parts
    in flight, for ``values`` values of ``width`` bytes; bounds as in :func:`matrix_parts`."""
    return _parts(values, width, kkrt.N_HASHES, max_payload_bytes)


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


def _matrix_parser(sender: str, rows: int, part: int = 0, part_rows: int | None = None):
    """KkrtMatrix part ``part`` of U -> part 0: ``(sender points, delta (512,) bool, U rows (R, 64) uint8)``,
    else the U rows.

    ``rows`` = cuckoo_bins(hello.set_size); ``part_rows`` = R, the rows of part 0 (its own row count, a
    multiple of 128 in [128, rows], sets it); part k holds rows [k R, min((k + 1) R, rows)), exactly.
    """
    def validate(msg: psi_pb2.KkrtMatrix):
        what = f"OT-extension matrix part {part} from {sender!r}"
        if part == 0:
            n = msg.rows
            if not 0 < n <= rows or n % kkrt.ROW_ALIGN:
                raise ProtocolError(f"{what}: {n} rows, expected a multiple of {kkrt.ROW_ALIGN} in "
                                    f"[{kkrt.ROW_ALIGN}, {rows}] ({rows} cuckoo bins for the hello's set size)")
            points = _check_ot_points(msg.ot_points, sender, "base-OT sender points")
            if len(msg.delta) != kkrt.DELTA_BYTES:
                raise ProtocolError(f"{what}: delta of {len(msg.delta)} bytes, expected {kkrt.DELTA_BYTES} (the "
                                    f"guest's choice-bit swap; a guest without it runs an older protocol)")
            delta = kkrt.mask_to_bits(msg.delta, kkrt.BASE_OTS)
        else:
            first = part * part_rows
            n = min(part_rows, rows - first)
            if msg.rows != n:
                raise ProtocolError(f"{what}: {msg.rows} rows, expected {n} (rows {first}..{first + n - 1} of "
                                    f"{rows}, parts of {part_rows} rows)")
            if msg.ot_points:
                raise ProtocolError(f"{what}: base-OT points belong in part 0 only")
            if msg.delta:
                raise ProtocolError(f"{what}: delta belongs in part 0 only")
        if len(msg.matrix) != n * kkrt.CODE_BYTES:
            raise ProtocolError(f"{what}: {len(msg.matrix)} bytes for {n} rows of {kkrt.CODE_BYTES} bytes")
        U = np.frombuffer(msg.matrix, np.uint8).reshape(n, kkrt.CODE_BYTES)
        return U if part else (points, delta, U)
    return parse_message(psi_pb2.KkrtMatrix, validate)


def _ack_parser(sender: str, part: int, received: int):
    """The host's acknowledgement of part ``part``: a KkrtMatrix holding only ``rows`` = ``received``, the
    rows of parts 0..``part``; anything else is a lie (rejected)."""
    def validate(msg: psi_pb2.KkrtMatrix):
        if msg.rows != received or msg.matrix or msg.ot_points or msg.delta:
            raise ProtocolError(f"acknowledgement of matrix part {part} from {sender!r}: {msg.rows} rows and "
                                f"{len(msg.matrix) + len(msg.ot_points) + len(msg.delta)} other bytes, expected only "
                                f"rows = {received}")
        return received
    return parse_message(psi_pb2.KkrtMatrix, validate)


def _oprf_parser(sender: str, width: int, part: int = 0, per_part: int | None = None, total: int | None = None):
    """PsiPoints part ``part`` of the host's OPRF values (3 per host ID) -> part 0: ``(total values, its
    packed values)``, else the packed values.

    Every part's ``count`` is the total (3 |Y|, fixed by part 0); part 0 holds V values (a multiple of 3,
    ``per_part`` = V for later parts; all of them when V = total), part k values [k V, min((k + 1) V, total)).
    """
    def validate(msg: psi_pb2.PsiPoints):
        what = f"OPRF values part {part} from {sender!r}"
        if msg.item_bytes != width:
            raise ProtocolError(f"{what}: item_bytes {msg.item_bytes}, expected {width}")
        if len(msg.items) % width:
            raise ProtocolError(f"{what}: {len(msg.items)} bytes, not a multiple of {width}")
        n = len(msg.items) // width
        if part == 0:
            if msg.count % kkrt.N_HASHES or msg.count > kkrt.N_HASHES * MAX_HOST_IDS:
                raise ProtocolError(f"{what}: count {msg.count} is not {kkrt.N_HASHES} per ID (of at most "
                                    f"{MAX_HOST_IDS} IDs)")
            if n % kkrt.N_HASHES or n > msg.count or (n == 0 and msg.count):
                raise ProtocolError(f"{what}: {n} values of {msg.count}, expected a positive multiple of "
                                    f"{kkrt.N_HASHES} (all of them if fewer)")
            return msg.count, msg.items
        expected = min(per_part, total - part * per_part)
        if msg.count != total or n != expected:
            raise ProtocolError(f"{what}: {n} values of count {msg.count}, expected {expected} of {total} "
                                f"(values {part * per_part}.. in parts of {per_part})")
        return msg.items
    return parse_message(psi_pb2.PsiPoints, validate)


def _values_ack_parser(sender: str, width: int, part: int, received: int):
    """The guest's acknowledgement of OPRF values part ``part``: a PsiPoints holding only ``item_bytes`` and
    ``count`` = ``received``, the values of parts 0..``part``; anything else is a lie (rejected)."""
    def validate(msg: psi_pb2.PsiPoints):
        if msg.count != received or msg.item_bytes != width or msg.items:
            raise ProtocolError(f"acknowledgement of OPRF values part {part} from {sender!r}: count {msg.count}, "
                                f"item_bytes {msg.item_bytes}, {len(msg.items)} item bytes; expected only "
                                f"count = {received}, item_bytes = {width}")
        return received
    return parse_message(psi_pb2.PsiPoints, validate)


def _check_message_size(transport: Transport, size: int, what: str) -> None:
    """Refuse before any work a message the peers would refuse (same job file: same ``job.max_message_mb``)."""
    limit = transport.max_payload_bytes
    if limit is not None and size > limit:
        raise ValueError(f"KKRT-PSI: {what} of {size / 2 ** 20:,.2f} MiB, above this job's message limit of "
                         f"{limit / 2 ** 20:,.2f} MiB: set job.max_message_mb to at least "
                         f"{-(-size // 2 ** 20) + 1} at every party, or use job.psi_protocol: ecdh")


# ------------------------------------------------------------------------------ roles
class _PartsSender:
    """The sending side of a transfer in parts with flow control (module docstring), for both roles."""

    def _send_parts(self, peer: str, tag: str, n_parts: int, window: int, make_part, await_ack) -> range:
        """Send ``make_part(k)`` for k in 0..``n_parts``-1, part k in round ``part_round(round_base, k)``
        and only once part k - ``window`` is acknowledged (``await_ack(k - window)``), so that at most
        ``window`` parts wait at ``peer``. Returns the parts whose acknowledgement is still to be taken."""
        for k in range(n_parts):
            if k >= window:
                await_ack(k - window)
            self._send(peer, tag, make_part(k), round=part_round(self.round_base, k))
            self.clock.lap("send")
        return range(max(0, n_parts - window), n_parts)

    def _await_part_ack(self, peer: str, tag: str, part: int, max_items: int | None, parser) -> None:
        """Wait for ``peer``'s acknowledgement of part ``part`` (``parser`` rejects one that lies)."""
        self._recv(peer, tag, max_items, parser, round=part_round(self.round_base, part))
        self.clock.lap("wait")


class KkrtGuest(_PartsSender, PsiGuest):
    """The guest's side of KKRT-PSI (module docstring): PSI receiver, OT-extension receiver.

    Arguments, result and errors as in :func:`~secureflhv.vertical.psi.align_ids_guest`; the
    intersection step (:meth:`send_intersection`) is ECDH-PSI's.
    """

    psi_protocol = "kkrt"

    def _align(self) -> np.ndarray:
        self._check_own_ids()
        if len(self.ids) > MAX_SET_SIZE:
            raise ValueError(f"KKRT-PSI takes at most {MAX_SET_SIZE} guest IDs, got {len(self.ids)}")
        part_rows, _ = matrix_parts(kkrt.cuckoo_bins(len(self.ids)), self.t.max_payload_bytes)
        _check_message_size(self.t, part_rows * kkrt.CODE_BYTES + _OT_POINT_BYTES + _PART_OVERHEAD,
                            "the first part of the OT-extension matrix (with the base-OT points)")
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
        # drawn only now, after the host's points fixed its choice bits s': s' xor delta is uniform
        delta = kkrt.random_bits(kkrt.BASE_OTS)
        k0, k1 = kkrt.swap_base_ot_keys(k0, k1, delta)
        self.clock.lap("base_ot")
        T, unacked, part_rows = self._send_matrix(host, sender.points(), kkrt.bits_to_mask(delta).tobytes(), k0, k1,
                                                  codewords)
        del k0, k1
        values = kkrt.guest_values(ctx, T, cand, index, self.truncate_bytes)
        self.clock.lap("oprf")
        m = codewords.shape[0]
        for k in unacked:  # consumed, so the host's acknowledgements never pile up in our mailbox
            self._await_ack(host, k, part_rows, m)
        return values

    def _send_matrix(self, host: str, ot_points: bytes, delta: bytes, k0: np.ndarray, k1: np.ndarray,
                     codewords: np.ndarray) -> tuple[np.ndarray, range, int]:
        """Step 3: compute and send U in parts (module docstring), at most W unacknowledged; part 0 carries our
        base-OT points and ``delta`` (64 bytes); ``k0``, ``k1``: the swapped key pairs.

        Returns T ``(m, 64) uint8``, the parts whose acknowledgement is still to be taken and R (rows per part).
        """
        m = codewords.shape[0]
        part_rows, window = matrix_parts(m, self.t.max_payload_bytes)
        T = np.empty_like(codewords)

        def make_part(k: int) -> psi_pb2.KkrtMatrix:
            a, b = k * part_rows, min(m, (k + 1) * part_rows)
            T[a:b], U = kkrt.receiver_rows(k0, k1, codewords[a:b], start_row=a)
            self.clock.lap("extend")
            return psi_pb2.KkrtMatrix(ot_points=b"" if k else ot_points, delta=b"" if k else delta, rows=b - a,
                                      matrix=U.tobytes())

        unacked = self._send_parts(host, TAG_MATRIX, -(-m // part_rows), window, make_part,
                                   lambda k: self._await_ack(host, k, part_rows, m))
        return T, unacked, part_rows

    def _await_ack(self, host: str, part: int, part_rows: int, rows: int) -> None:
        """Wait for ``host``'s acknowledgement of matrix part ``part``: the rows of parts 0..``part`` (parts of
        ``part_rows`` rows, ``rows`` in all)."""
        received = min(rows, (part + 1) * part_rows)
        self._await_part_ack(host, TAG_MATRIX_ACK, part, len(self.ids), _ack_parser(host, part, received))

    def _match(self, host: str, mine: bytes) -> np.ndarray:
        """Receive ``host``'s OPRF values and match; int64 (|X|,): each guest row's row at ``host``, or -1."""
        n, width = len(self.ids), self.truncate_bytes
        theirs = self._receive_values(host, width, 3 * n)
        self.sizes[host] = len(theirs) // (kkrt.N_HASHES * width)
        self.clock.lap("wait")
        return self.host_rows(host, mine, theirs, width, per_id=kkrt.N_HASHES)

    def _receive_values(self, host: str, width: int, n_items: int) -> bytes:
        """Step 4: ``host``'s OPRF values, part by part (module docstring), each acknowledged on receipt."""
        total, part = self._recv(host, TAG_OPRF, n_items, _oprf_parser(host, width),
                                 round=part_round(self.round_base, 0))
        self._check_peer_size(host, total // kkrt.N_HASHES, "OPRF values")  # before taking more parts
        per_part, parts, got, k = len(part) // width, [part], len(part) // width, 0
        while True:
            self._send(host, TAG_OPRF_ACK, psi_pb2.PsiPoints(item_bytes=width, count=got),
                       round=part_round(self.round_base, k))
            if got == total:
                return b"".join(parts)  # memory grows only with values the host actually sent
            k += 1
            part = self._recv(host, TAG_OPRF, n_items, _oprf_parser(host, width, k, per_part, total),
                              round=part_round(self.round_base, k))
            parts.append(part)
            got += len(part) // width


class KkrtHost(_PartsSender, PsiHost):
    """A host's side of KKRT-PSI (module docstring): PSI sender, OT-extension sender.

    Arguments, result and errors as in :func:`~secureflhv.vertical.psi.align_ids_host`; the hello
    and the intersection steps are ECDH-PSI's.
    """

    psi_protocol = "kkrt"

    def _align(self):
        self._check_own_ids()
        hello = self._recv(self.guest, TAG_HELLO, None,
                           _hello_parser(self.guest, self.psi_protocol, max_set_size=MAX_SET_SIZE,
                                         version=PROTOCOL_VERSION))
        self._check_peer_size(self.guest, hello.set_size, "PsiHello")  # before Q (64 bytes per bin) exists
        self.clock.lap("wait")
        width, n_values = hello.truncate_bytes, kkrt.N_HASHES * len(self.ids)
        _check_message_size(self.t, value_parts(n_values, width, self.t.max_payload_bytes)[0] * width
                            + _PART_OVERHEAD, "a part of the OPRF values")
        ctx = kkrt.session_context(self.t.job_id, hello.salt)
        rows = kkrt.cuckoo_bins(hello.set_size)
        receiver = kkrt.BaseOtReceiver(ctx, self._choice_bits())
        self._send(self.guest, TAG_BASE_OT, psi_pb2.KkrtBaseOt(points=receiver.points()))
        self.clock.lap("base_ot")
        items, cand = kkrt.hash_ids(self.ids, ctx, rows)
        self.clock.lap("hash")
        Q, choices = self._receive_matrix(rows, len(self.ids) + hello.set_size, receiver)
        self.clock.lap("extend")
        values = self._oprf_values(ctx, Q, choices, items, cand, hello.truncate_bytes)
        del Q
        self.clock.lap("oprf")
        self._send_values(values, width, len(self.ids) + hello.set_size)
        del values
        return (hello, *self.receive_intersection(hello))

    def _choice_bits(self) -> np.ndarray:
        """s': our base-OT choice bits, ``(512,) bool`` (uniform; the guest's delta makes them so anyway)."""
        return kkrt.random_bits(kkrt.BASE_OTS)

    @staticmethod
    def _effective_choices(chosen: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """s = s' xor delta: the choice bits the guest's swapped keys give us (crypto.kkrt: choice-bit swap)."""
        return np.logical_xor(chosen, delta)

    def _oprf_values(self, ctx: bytes, Q: np.ndarray, choices: np.ndarray, items: np.ndarray, cand: np.ndarray,
                     width: int) -> bytes:
        """Step 4's values: :func:`~secureflhv.crypto.kkrt.host_values` with the effective choice bits."""
        return kkrt.host_values(ctx, Q, choices, items, cand, width)

    def _send_values(self, values: bytes, width: int, n_items: int) -> None:
        """Step 4: send our OPRF values in parts (module docstring), at most W unacknowledged, and take every
        acknowledgement (so none is left queued at the guest's side of our mailbox)."""
        total = len(values) // width
        per_part, window = value_parts(total, width, self.t.max_payload_bytes)
        view = memoryview(values)

        def make_part(k: int) -> psi_pb2.PsiPoints:
            items = bytes(view[k * per_part * width:min(total, (k + 1) * per_part) * width])
            return psi_pb2.PsiPoints(item_bytes=width, count=total, items=items)

        def await_ack(k: int) -> None:
            self._await_part_ack(self.guest, TAG_OPRF_ACK, k, n_items,
                                 _values_ack_parser(self.guest, width, k, min(total, (k + 1) * per_part)))

        for k in self._send_parts(self.guest, TAG_OPRF, max(1, -(-total // per_part)), window, make_part, await_ack):
            await_ack(k)

    def _receive_matrix(self, rows: int, n_items: int,
                        receiver: kkrt.BaseOtReceiver) -> tuple[np.ndarray, np.ndarray]:
        """Step 3: take U part by part (module docstring), acknowledge each on receipt, and compute its rows
        of Q while the next part travels; returns Q ``(rows, 64) uint8`` and the effective choice bits s =
        s' xor delta ``(512,) bool``. Holds Q and one part (plus those queued in the mailbox), never all of U."""
        points, delta, U = self._recv(self.guest, TAG_MATRIX, n_items, _matrix_parser(self.guest, rows),
                                      round=part_round(self.round_base, 0))
        self.clock.lap("wait")
        keys = receiver.keys(points)
        choices = self._effective_choices(receiver.choices, delta)
        part_rows = U.shape[0]
        Q = np.empty((rows, kkrt.CODE_BYTES), np.uint8)  # pages are touched only as parts arrive
        a = 0
        for k in range(-(-rows // part_rows)):
            if k:
                U = self._recv(self.guest, TAG_MATRIX, n_items, _matrix_parser(self.guest, rows, k, part_rows),
                               round=part_round(self.round_base, k))
                self.clock.lap("wait")
            b = a + U.shape[0]
            self._send(self.guest, TAG_MATRIX_ACK, psi_pb2.KkrtMatrix(rows=b), round=part_round(self.round_base, k))
            kkrt.sender_rows(keys, choices, U, start_row=a, out=Q[a:b])
            self.clock.lap("extend")
            a = b
        return Q, choices


def align_ids_guest(transport: Transport, ids: Sequence[str], hosts: Sequence[str], *, round_base: int = 0,
                    workers: int | None = None, truncate_bytes: int = DEFAULT_TRUNCATE_BYTES,
                    timeout: float | None = None, max_ids: int = DEFAULT_MAX_IDS) -> PsiResult:
    """KKRT-PSI as the guest with every host (each runs this module's :func:`align_ids_host`).

    Arguments, result and errors as in :func:`secureflhv.vertical.psi.align_ids_guest` (``workers``
    is accepted for the same signature and ignored: the work runs in this process); also raises
    ValueError for more than ``MAX_SET_SIZE`` IDs.
    """
    return KkrtGuest(transport, ids, hosts, round_base=round_base, workers=workers, truncate_bytes=truncate_bytes,
                     timeout=timeout, max_ids=max_ids).run()


def align_ids_host(transport: Transport, ids: Sequence[str], guest: str, *, round_base: int = 0,
                   workers: int | None = None, timeout: float | None = None,
                   max_ids: int = DEFAULT_MAX_IDS) -> PsiResult:
    """KKRT-PSI as a host with the guest (which runs this module's :func:`align_ids_guest`).

    Arguments, result and errors as in :func:`secureflhv.vertical.psi.align_ids_host` (``workers`` ignored).
    """
    return KkrtHost(transport, ids, guest, round_base=round_base, workers=workers, timeout=timeout,
                    max_ids=max_ids).run()
