"""Private set intersection (ECDH-PSI) to align the guest's and hosts' ID columns before training.

The default of vertical jobs (``job.psi_security: malicious``, the default, makes ``job.psi_protocol``
resolve to ``ecdh``). The OT-extension protocol :mod:`secureflhv.vertical.psi_kkrt` (``kkrt``) gives the
same result for ~15x less CPU, but a guest that deviates from it learns every host ID, so a job runs it
only when it declares ``job.psi_security: semi_honest``; it reuses this module's result type, hello,
ordering, set-size bounds and intersection step.

Protocol (Meadows 1986; Huberman, Franklin & Hogg 1999; here over Curve25519, Bernstein 2006 -- the
primitives and their references are in :mod:`secureflhv.crypto.ecdh_psi`). For one guest G (IDs X,
secret scalar a) and each host H_j (IDs Y_j, secret scalar b_j), all over :class:`Transport`:

1. G -> H_j  ``psi/hello``  (PsiHello): fresh 32-byte salt, |X|, truncation width t.
   Both sides hash IDs to curve points with H keyed by (job id, salt).
2. G -> H_j  ``psi/points`` (PsiPoints): H(x)^a for x in X, in G's row order.
   H_j -> G  ``psi/points``: H(y)^b_j for y in Y_j, in H_j's row order. (Computed concurrently.)
3. H_j -> G  ``psi/double``: (H(x)^a)^b_j truncated to t bytes, in G's order.
   G computes (H(y)^b_j)^a truncated to t bytes and matches: x in X is in Y_j exactly when its
   doubly blinded value is among them, and G learns its position in H_j's list.
4. G -> H_j  ``psi/intersection`` (PsiIntersection): the final common IDs (in X and in every Y_j),
   as row positions in H_j's own list, in the agreed order.

Agreed order: the common IDs sorted by Unicode code point (Python ``sorted`` on ``str``; the same
as sorting their UTF-8 bytes). A canonical order reveals nothing beyond the set itself, whereas
the guest's row order would tell hosts how the guest's file is sorted. Every party ends with the
same ``PsiResult.ids`` and its own ``PsiResult.rows`` (``own_ids[rows[k]] == ids[k]``).

What each role learns (semi-honest parties, DDH hard on Curve25519, H a random oracle):

* **guest**: each host's set size |Y_j| and each pairwise intersection X ∩ Y_j (with the
  matching row positions in H_j's list, needed to tell H_j its rows); nothing about the other
  elements of Y_j, which it sees only as H(y)^b_j for an unknown b_j.
* **host j**: the guest's set size |X| and the final intersection X ∩ Y_1 ∩ ... ∩ Y_k -- not
  its pairwise intersection with the guest, nothing about X outside the final intersection
  (it sees only H(x)^a for an unknown a), nothing about other hosts (hosts never talk).
* Hash points are restricted to the curve (not its twist), so a blinded value does not even leak
  one bit of H(x); see :mod:`secureflhv.crypto.ecdh_psi`.
* Fresh scalars and a fresh salt per run: values from different runs cannot be linked.
* Colluding hosts learn nothing about X beyond what each learns (they all receive the same H(x)^a).

What a party that lies can still do (the protocol is semi-honest; these are its limits against any
message a lying party may send, DDH and H a random oracle as above):

* **A lying guest** learns whether a guessed ID is in Y_j: it sends H(g) (or H(g)^a) for guesses g
  among its points, one point per guess, so at most ``max_ids`` (``job.psi_max_ids``) guesses per run.
  Nothing else: every point it sends comes back raised to b_j, and b_j stays hidden (the points it can
  craft are on the curve or its twist; clamped scalars are multiples of the cofactor, and the discrete
  logarithm is hard in both prime-order subgroups), so no value of Y_j outside its guesses can be
  recognised. It can also tell a host a wrong intersection (rows it did not match, still in the agreed
  order): the host learns nothing from that, but the job then uses the rows the guest named.
* **A lying host** learns whether a guessed ID is in the final intersection: it can list H(g) for
  guesses among its points (or answer a guest point with anything), and the guest reports what
  matched. It cannot make a guest ID it has not guessed match: a match needs the guest's a-th power of
  a point the host chose, and the host knows a-th powers only of the guest's own hashed IDs, which it
  cannot tell apart without guessing them. So the intersection the guest sends (the only message that
  depends on the guest's ID order) holds true common IDs and guessed ones only; a host that repeats a
  value makes the run fail (``match_positions``), never match more.
* **Set sizes are bounded by the job** (``max_ids``): a hello, point list or value list announcing
  more IDs than that is refused with :class:`PsiSetTooLarge` naming the sender, before anything sized
  by it is allocated or computed; a party with more IDs refuses before it sends anything.

Cost: X25519 operations (libsodium; ~23-32 us each on the 2-core reference machine, depending on
its load) -- guest |X| + sum_j |Y_j|, host j |Y_j| + |X| -- plus hashing |own set| IDs to the
curve (~4-6 us each); spread over a process pool of ``workers`` (spawned, so scripts that call
this need an ``if __name__ == "__main__":`` guard). Everything else (messages, checks, the sorted
join) adds ~5% CPU at 1M x 1M (``benchmarks/psi.py`` prints the ratio to this compute floor). Traffic per host: 32 bytes per ID each way, plus t bytes per guest ID and 8 bytes per
common ID. One message holds at most ~60M points (protobuf's 2 GiB limit).

Example (one call per party, at the same time)::

    res = align_ids_guest(transport, guest_ids, ["host-1", "host-2"])   # at the guest
    res = align_ids_host(transport, host_ids, "guest")                   # at each host
    X_aligned = X[res.rows]          # every party now has the rows of res.ids, in the same order

Errors: duplicate IDs raise ``ValueError`` naming the party and an example (before anything is
sent; the other parties are told via ``transport.abort``); a malformed or inconsistent message is
rejected with :class:`~secureflhv.transport.ProtocolError` in the ``recv`` parse step, logged, and
the wait for a valid message goes on.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..crypto.ecdh_psi import (DEFAULT_TRUNCATE_BYTES, MIN_TRUNCATE_BYTES, POINT_BYTES, LowOrderPointError,
                               PsiEngine, check_points, find_duplicate, hash_context, match_positions,
                               new_scalar)
from ..proto import psi_pb2
from ..transport import JobAborted, ProtocolError, Transport, parse_message
from ..transport.role import ProtocolRole

log = logging.getLogger("secureflhv.vertical.psi")

__all__ = ["PsiResult", "PsiGuest", "PsiHost", "PsiSetTooLarge", "align_ids_guest", "align_ids_host",
           "PROTOCOL_VERSION", "DEFAULT_MAX_IDS", "TAG_HELLO", "TAG_POINTS", "TAG_DOUBLE", "TAG_INTERSECTION"]

PROTOCOL_VERSION = 1  # ECDH-PSI's PsiHello.version (KKRT-PSI has its own: psi_kkrt.PROTOCOL_VERSION)
DEFAULT_MAX_IDS = 10_000_000  # = the default of job.psi_max_ids: the largest set any party may announce
SALT_BYTES = 32
TAG_HELLO = "psi/hello"
TAG_POINTS = "psi/points"
TAG_DOUBLE = "psi/double"
TAG_INTERSECTION = "psi/intersection"
# Default waits grow with the work the peer may still be doing (~60 core-us per ID here, 2x margin
# for a loaded machine): 1M + 1M IDs allow 200 s even if the transport's deadline is shorter.
WAIT_S_PER_ID = 100e-6


class PsiSetTooLarge(ProtocolError):
    """A party announced (or holds) more IDs than the job allows (``job.psi_max_ids``).

    Raised by the receiver of the announcement (never caught by the transport's parse step: the run
    fails and the peers are told). Attributes: ``sender`` (the party that announced the set), ``size``,
    ``limit``.
    """

    def __init__(self, sender: str, size: int, limit: int, what: str):
        super().__init__(f"{what} from {sender!r} announces {size:,} IDs, above this job's limit of {limit:,} "
                         f"(job.psi_max_ids): refused before any work sized by it")
        self.sender, self.size, self.limit = sender, size, limit


@dataclass(frozen=True)
class PsiResult:
    """Outcome of PSI at one party.

    Attributes:
        ids: the IDs common to all parties, sorted by Unicode code point (identical at every party).
        rows: int64 array (len(ids),): ``own_ids[rows[k]] == ids[k]`` for this party's ID list.
        peer_sizes: set sizes this party learned, by party id (guest: every host; host: the guest).
        timings: seconds per phase at this party (ECDH: ``hash_blind``, ``wait``, ``blind_peer``,
            ``match``, ``total``; KKRT: ``hash``, ``base_ot``, ``extend``, ``oprf``, ``send``, ``wait``,
            ``match``, ``total``; ``wait`` is time blocked on peers).
    """

    ids: list[str]
    rows: np.ndarray
    peer_sizes: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)


class _Clock:
    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.timings: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - self.last
        self.last = now

    def done(self) -> dict[str, float]:
        self.timings["total"] = time.perf_counter() - self.start
        return self.timings


def _check_ids(ids: Sequence[str], party: str) -> list[str]:
    ids = list(ids)
    if not all(type(x) is str for x in ids):
        for i, x in enumerate(ids):
            if not isinstance(x, str):
                raise TypeError(f"party {party!r}: ID at row {i} is {type(x).__name__} {x!r}, expected str "
                                f"(convert the ID column to strings first)")
    dup = find_duplicate(ids)
    if dup is not None:
        example, surplus = dup
        raise ValueError(f"party {party!r} has duplicate IDs in its ID column (e.g. {example!r}; "
                         f"{surplus} surplus cop{'y' if surplus == 1 else 'ies'}): PSI needs unique IDs")
    return ids


# ------------------------------------------------------------------------------ parse callbacks
def _hello_parser(sender: str, protocol: str = "ecdh", max_set_size: int | None = None,
                  version: int = PROTOCOL_VERSION):
    """Parse PsiHello; ``protocol``: the PSI protocol this host runs (the guest's must match it), ``version``
    its PsiHello.version; ``max_set_size``: the protocol's own bound (the job's is checked by the role)."""
    def validate(msg: psi_pb2.PsiHello):
        if (msg.protocol or "ecdh") != protocol:
            raise ProtocolError(f"PsiHello from {sender!r}: protocol {msg.protocol!r}, this party runs {protocol!r} "
                                f"(every party needs the same psi_protocol)")
        if max_set_size is not None and msg.set_size > max_set_size:
            raise ProtocolError(f"PsiHello from {sender!r}: set_size {msg.set_size} above {max_set_size}")
        if msg.version != version:
            raise ProtocolError(f"PsiHello from {sender!r}: version {msg.version}, expected {version} (every party "
                                f"needs the same secureflhv release)")
        if len(msg.salt) != SALT_BYTES:
            raise ProtocolError(f"PsiHello from {sender!r}: salt has {len(msg.salt)} bytes, expected {SALT_BYTES}")
        if not MIN_TRUNCATE_BYTES <= msg.truncate_bytes <= POINT_BYTES:
            raise ProtocolError(f"PsiHello from {sender!r}: truncate_bytes {msg.truncate_bytes} outside "
                                f"[{MIN_TRUNCATE_BYTES}, {POINT_BYTES}]")
    return parse_message(psi_pb2.PsiHello, validate)


def _points_parser(sender: str, item_bytes: int, count: int | None, points: bool):
    """Parse PsiPoints into ``items`` bytes; ``points`` = items are 32-byte curve points to check."""
    what = "blinded points" if points else "doubly blinded values"

    def validate(msg: psi_pb2.PsiPoints):
        if msg.item_bytes != item_bytes:
            raise ProtocolError(f"{what} from {sender!r}: item_bytes {msg.item_bytes}, expected {item_bytes}")
        if count is not None and msg.count != count:
            raise ProtocolError(f"{what} from {sender!r}: count {msg.count}, expected {count}")
        if len(msg.items) != msg.count * item_bytes:
            raise ProtocolError(f"{what} from {sender!r}: {len(msg.items)} bytes for {msg.count} items "
                                f"of {item_bytes} bytes")
        if points:
            try:
                check_points(msg.items)
            except ValueError as exc:
                raise ProtocolError(f"{what} from {sender!r}: {exc}") from None
        return msg.items
    return parse_message(psi_pb2.PsiPoints, validate)


def _intersection_parser(sender: str, own_ids: list[str]):
    n = len(own_ids)

    def validate(msg: psi_pb2.PsiIntersection):
        if len(msg.rows) != 8 * msg.count:
            raise ProtocolError(f"intersection from {sender!r}: {len(msg.rows)} bytes for {msg.count} rows")
        rows = np.frombuffer(msg.rows, dtype="<u8")
        if rows.size and int(rows.max()) >= n:
            raise ProtocolError(f"intersection from {sender!r}: row {int(rows.max())} out of range (we have {n} IDs)")
        rows = rows.astype(np.int64)
        ids = [own_ids[r] for r in rows.tolist()]
        if any(a >= b for a, b in zip(ids, ids[1:])):
            raise ProtocolError(f"intersection from {sender!r}: rows are not in the agreed order "
                                f"(common IDs strictly increasing by code point)")
        return rows, ids
    return parse_message(psi_pb2.PsiIntersection, validate)


def _wait(transport: Transport, timeout: float | None, n_items: int) -> float:
    """``timeout`` if given, else the transport deadline stretched to cover ``n_items`` of peer work."""
    return timeout if timeout is not None else max(transport.deadline, WAIT_S_PER_ID * n_items)


# ------------------------------------------------------------------------------ roles
class _PsiRole(ProtocolRole):
    """State shared by both roles: the ID column, the run's round, the X25519 engine and the clock."""

    protocol = "PSI"
    psi_protocol = "ecdh"  # the PsiHello.protocol of this role's runs

    def __init__(self, transport: Transport, ids: Sequence[str], *, round_base: int, workers: int | None,
                 timeout: float | None, max_ids: int = DEFAULT_MAX_IDS):
        super().__init__(transport)
        if int(max_ids) < 1:
            raise ValueError(f"max_ids must be >= 1, got {max_ids}")
        self.ids = ids
        self.max_ids = int(max_ids)
        self.round_base = round_base
        self.workers = workers
        self.timeout = timeout
        self.clock = _Clock()
        self.engine: PsiEngine | None = None

    def _abort_message(self, exc: BaseException) -> str | None:
        """``PSI failed at <party>: <error>``; None (tell nobody) for an abort received from a peer
        (:class:`JobAborted`, not echoed back) and for non-``Exception`` exits (e.g. KeyboardInterrupt)."""
        if not isinstance(exc, Exception) or isinstance(exc, JobAborted):
            return None
        return f"PSI failed at {self.party_id!r}: {exc}"

    def _check_own_ids(self) -> None:
        """Check our ID column (unique str) and its size against ``max_ids``, before anything is sent."""
        self.ids = _check_ids(self.ids, self.party_id)
        if len(self.ids) > self.max_ids:
            raise ValueError(f"party {self.party_id!r} has {len(self.ids):,} IDs, above this job's limit of "
                             f"{self.max_ids:,} (job.psi_max_ids; every party refuses a larger set): raise it at "
                             f"every party")

    def _check_peer_size(self, peer: str, size: int, what: str) -> None:
        """Refuse a set ``peer`` announced above ``max_ids`` (:class:`PsiSetTooLarge`), before any work sized by it."""
        if size > self.max_ids:
            raise PsiSetTooLarge(peer, int(size), self.max_ids, what)

    def _start_engine(self, engine: PsiEngine) -> None:
        """Check the IDs, then spawn the workers (for large sets) while the peers get going."""
        self._check_own_ids()
        self.engine = engine
        if len(self.ids) >= engine.min_parallel:
            engine.start()

    def _send(self, peer: str, tag: str, msg, round: int | None = None) -> None:
        """Send ``msg`` as ``tag`` in ``round`` (default: the run's ``round_base``)."""
        self.t.send(peer, tag, msg, round=self.round_base if round is None else round, timeout=self.timeout)

    def _recv(self, peer: str, tag: str, n_items: int | None, parse, round: int | None = None):
        """Wait for ``tag`` from ``peer`` in ``round`` (default: ``round_base``); ``n_items`` of peer work
        stretch the default wait (None: don't)."""
        timeout = self.timeout if n_items is None else _wait(self.t, self.timeout, n_items)
        return self.t.recv(peer, tag, round=self.round_base if round is None else round, timeout=timeout,
                           parse=parse)

    def blind_own_ids(self, salt: bytes, scalar: bytes) -> bytes:
        """Step 2: H(x)^scalar for every own ID, in row order, as a serialised PsiPoints message.

        Needs the engine started (run via the role's :meth:`run` / ``align_ids_guest`` / ``align_ids_host``).
        """
        mine = self.engine.hash_and_blind(self.ids, hash_context(self.t.job_id, salt), scalar)
        self.clock.lap("hash_blind")
        return psi_pb2.PsiPoints(item_bytes=POINT_BYTES, count=len(self.ids), items=mine).SerializeToString()


class PsiGuest(_PsiRole):
    """The guest's side of ECDH-PSI with every host (module docstring: steps, what each role learns).

    Stages: :meth:`hello` (step 1), :meth:`blind_own_ids` (step 2), :meth:`match_with_host` (step 3,
    per host), :meth:`send_intersection` (step 4); :meth:`run` performs them in order. Run them via
    :func:`align_ids_guest` or :meth:`run`, not one by one: ``run`` checks the IDs and starts the X25519
    engine (``self.engine``) that the stages need, and tells the hosts when a stage fails.
    Arguments and errors as in :func:`align_ids_guest`.
    """

    def __init__(self, transport: Transport, ids: Sequence[str], hosts: Sequence[str], *, round_base: int = 0,
                 workers: int | None = None, truncate_bytes: int = DEFAULT_TRUNCATE_BYTES,
                 timeout: float | None = None, max_ids: int = DEFAULT_MAX_IDS):
        hosts = list(hosts)
        me = transport.party_id
        if not hosts or len(set(hosts)) != len(hosts) or me in hosts:
            raise ValueError(f"hosts must be distinct party ids other than the guest {me!r}, got {hosts}")
        if not MIN_TRUNCATE_BYTES <= truncate_bytes <= POINT_BYTES:
            raise ValueError(f"truncate_bytes must be in [{MIN_TRUNCATE_BYTES}, {POINT_BYTES}], got {truncate_bytes}")
        super().__init__(transport, ids, round_base=round_base, workers=workers, timeout=timeout, max_ids=max_ids)
        self.hosts = hosts
        self.truncate_bytes = truncate_bytes
        self.sizes: dict[str, int] = {}

    def _peers(self) -> list[str]:
        return list(self.hosts)

    def run(self) -> PsiResult:
        """All four steps with every host; the :class:`PsiResult` of :func:`align_ids_guest`."""
        rows = self._guarded(self._align)
        log.info("%s: PSI done: %d common IDs with %d host(s) in %.1fs", self.party_id, rows.size, len(self.hosts),
                 time.perf_counter() - self.clock.start)
        return PsiResult(ids=[self.ids[r] for r in rows.tolist()], rows=rows, peer_sizes=self.sizes,
                         timings=self.clock.done())

    def _align(self) -> np.ndarray:
        with PsiEngine(self.workers) as engine:
            self._start_engine(engine)
            salt = self.hello()
            scalar = new_scalar()
            msg = self.blind_own_ids(salt, scalar)
            for h in self.hosts:
                self._send(h, TAG_POINTS, msg)
            del msg
            self.clock.lap("send")
            in_host = {h: self.match_with_host(h, scalar) for h in self.hosts}
        return self.send_intersection(in_host)

    def hello(self) -> bytes:
        """Step 1: send every host a fresh salt, our set size and the truncation width; return the salt."""
        salt = os.urandom(SALT_BYTES)
        hello = psi_pb2.PsiHello(version=PROTOCOL_VERSION, salt=salt, set_size=len(self.ids),
                                 truncate_bytes=self.truncate_bytes, protocol=self.psi_protocol)
        for h in self.hosts:
            self._send(h, TAG_HELLO, hello)
        return salt

    def match_with_host(self, host: str, scalar: bytes) -> np.ndarray:
        """Step 3 with ``host``: blind its points again, receive our doubly blinded points, match.

        Returns int64 (|X|,): for each guest row its row in ``host``'s list, -1 if absent.
        Needs the engine started (run via :meth:`run` / :func:`align_ids_guest`).
        """
        n, width = len(self.ids), self.truncate_bytes
        theirs = self._recv(host, TAG_POINTS, n, _points_parser(host, POINT_BYTES, None, points=True))
        self._check_peer_size(host, len(theirs) // POINT_BYTES, "blinded points")
        self.sizes[host] = len(theirs) // POINT_BYTES
        self.clock.lap("wait")
        try:
            theirs = self.engine.blind(theirs, scalar, width)
        except LowOrderPointError as exc:
            raise ProtocolError(f"host {host!r} sent a low-order point at item {exc.index}") from None
        self.clock.lap("blind_peer")
        doubled = self._recv(host, TAG_DOUBLE, n + self.sizes[host], _points_parser(host, width, n, points=False))
        self.clock.lap("wait")
        return self.host_rows(host, doubled, theirs, width)

    def host_rows(self, host: str, ours: bytes, theirs: bytes, width: int, per_id: int = 1) -> np.ndarray:
        """int64 (|X|,): each guest row's row in ``host``'s list, or -1, from matching our ``width``-byte
        values against theirs (``per_id`` consecutive values per host row). Raises ProtocolError when
        ``host`` repeated a value (a lying or broken host)."""
        try:
            i_g, i_h = match_positions(ours, theirs, width)
        except ValueError as exc:
            raise ProtocolError(f"PSI with host {host!r}: {exc}") from None
        pos = np.full(len(self.ids), -1, dtype=np.int64)
        pos[i_g] = i_h // per_id
        self.clock.lap("match")
        log.info("%s: %s-PSI with %s: |guest|=%d |host|=%d |pairwise intersection|=%d", self.party_id,
                 self.psi_protocol.upper(), host, len(self.ids), self.sizes[host], i_g.size)
        return pos

    def send_intersection(self, in_host: dict[str, np.ndarray]) -> np.ndarray:
        """Step 4: tell each host the common IDs as its own rows, in the agreed order; return our rows."""
        common = np.ones(len(self.ids), dtype=bool)
        for pos in in_host.values():
            common &= pos >= 0
        rows = np.array(sorted(np.flatnonzero(common).tolist(), key=self.ids.__getitem__), dtype=np.int64)
        for h in self.hosts:
            their_rows = in_host[h][rows].astype("<u8").tobytes()
            self._send(h, TAG_INTERSECTION, psi_pb2.PsiIntersection(count=rows.size, rows=their_rows))
        self.clock.lap("match")
        return rows


class PsiHost(_PsiRole):
    """A host's side of ECDH-PSI with the guest (module docstring: steps, what each role learns).

    Stages: :meth:`receive_hello` (step 1), :meth:`blind_own_ids` (step 2), :meth:`double_blind`
    (step 3), :meth:`receive_intersection` (step 4); :meth:`run` performs them in order. Run them via
    :func:`align_ids_host` or :meth:`run`, not one by one: ``run`` checks the IDs and starts the X25519
    engine (``self.engine``) that the stages need, and tells the guest when a stage fails.
    Arguments and errors as in :func:`align_ids_host`.
    """

    def __init__(self, transport: Transport, ids: Sequence[str], guest: str, *, round_base: int = 0,
                 workers: int | None = None, timeout: float | None = None, max_ids: int = DEFAULT_MAX_IDS):
        super().__init__(transport, ids, round_base=round_base, workers=workers, timeout=timeout, max_ids=max_ids)
        self.guest = guest

    def _peers(self) -> list[str]:
        return [self.guest]

    def run(self) -> PsiResult:
        """All four steps; the :class:`PsiResult` of :func:`align_ids_host`."""
        hello, rows, common = self._guarded(self._align)
        log.info("%s: PSI done: %d common IDs (guest has %d) in %.1fs", self.party_id, len(common), hello.set_size,
                 time.perf_counter() - self.clock.start)
        return PsiResult(ids=common, rows=rows, peer_sizes={self.guest: int(hello.set_size)},
                         timings=self.clock.done())

    def _align(self):
        with PsiEngine(self.workers) as engine:
            self._start_engine(engine)  # spawns the workers while waiting for the guest
            hello = self.receive_hello()
            scalar = new_scalar()
            self._send(self.guest, TAG_POINTS, self.blind_own_ids(hello.salt, scalar))
            self.clock.lap("send")
            self.double_blind(hello, scalar)
        return (hello, *self.receive_intersection(hello))

    def receive_hello(self) -> psi_pb2.PsiHello:
        """Step 1: the guest's salt, set size and truncation width."""
        hello = self._recv(self.guest, TAG_HELLO, None, _hello_parser(self.guest, self.psi_protocol))
        self._check_peer_size(self.guest, hello.set_size, "PsiHello")
        self.clock.lap("wait")
        return hello

    def double_blind(self, hello: psi_pb2.PsiHello, scalar: bytes) -> None:
        """Step 3: blind the guest's points with our scalar, truncate, return them in the guest's order.

        Needs the engine started (run via :meth:`run` / :func:`align_ids_host`).
        """
        theirs = self._recv(self.guest, TAG_POINTS, len(self.ids) + hello.set_size,
                            _points_parser(self.guest, POINT_BYTES, hello.set_size, points=True))
        self.clock.lap("wait")
        try:
            doubled = self.engine.blind(theirs, scalar, hello.truncate_bytes)
        except LowOrderPointError as exc:
            raise ProtocolError(f"guest {self.guest!r} sent a low-order point at item {exc.index}") from None
        del theirs
        self.clock.lap("blind_peer")
        self._send(self.guest, TAG_DOUBLE,
                   psi_pb2.PsiPoints(item_bytes=hello.truncate_bytes, count=hello.set_size, items=doubled))
        self.clock.lap("send")

    def receive_intersection(self, hello: psi_pb2.PsiHello) -> tuple[np.ndarray, list[str]]:
        """Step 4: our rows of the final common IDs and those IDs, in the agreed order."""
        rows, common = self._recv(self.guest, TAG_INTERSECTION, len(self.ids) + hello.set_size,
                                  _intersection_parser(self.guest, self.ids))
        self.clock.lap("wait")
        return rows, common


def align_ids_guest(transport: Transport, ids: Sequence[str], hosts: Sequence[str], *, round_base: int = 0,
                    workers: int | None = None, truncate_bytes: int = DEFAULT_TRUNCATE_BYTES,
                    timeout: float | None = None, max_ids: int = DEFAULT_MAX_IDS) -> PsiResult:
    """Run PSI as the guest with every host; return the IDs common to all parties.

    Args:
        transport: this party's transport.
        ids: this party's ID column (str, unique), in row order.
        hosts: party ids of the hosts (each runs :func:`align_ids_host` at the same time).
        round_base: round id of every message of this run; use a larger one for each later PSI run
            in the same job (rounds per (sender, tag) must increase).
        workers: processes for the X25519 work (``None``: all CPUs; ``1``: in this process).
        truncate_bytes: width of the doubly blinded values (12..32; collision bound in
            :mod:`secureflhv.crypto.ecdh_psi`).
        timeout: seconds to wait for each peer message (default: the transport's deadline, stretched
            by ``WAIT_S_PER_ID`` per ID of the sets involved, so large sets need no tuning).
        max_ids: the largest set any party may hold (``job.psi_max_ids``, the same at every party): a
            larger own set is refused before anything is sent, a larger announced one on arrival.

    Returns:
        :class:`PsiResult` with ``rows`` into ``ids``; ``peer_sizes`` holds each host's set size.

    Raises:
        ValueError/TypeError: duplicate or non-str IDs, or more than ``max_ids`` (nothing is sent; hosts are
            told to abort).
        PsiSetTooLarge: a host announced more than ``max_ids`` IDs (names it; the hosts are told).
        ProtocolError: a host sent a low-order point (after the message was accepted).
        PeerTimeout, JobAborted: from the transport.
    """
    return PsiGuest(transport, ids, hosts, round_base=round_base, workers=workers, truncate_bytes=truncate_bytes,
                    timeout=timeout, max_ids=max_ids).run()


def align_ids_host(transport: Transport, ids: Sequence[str], guest: str, *, round_base: int = 0,
                   workers: int | None = None, timeout: float | None = None,
                   max_ids: int = DEFAULT_MAX_IDS) -> PsiResult:
    """Run PSI as a host with the guest; return the IDs common to all parties and this host's rows.

    Args:
        transport: this party's transport.
        ids: this party's ID column (str, unique), in row order.
        guest: the guest's party id (it runs :func:`align_ids_guest`).
        round_base, workers, timeout, max_ids: as in :func:`align_ids_guest` (same ``round_base`` and
            ``max_ids`` on all parties).

    Returns:
        :class:`PsiResult` with ``rows`` into ``ids``; ``peer_sizes`` holds the guest's set size.

    Raises:
        ValueError/TypeError: duplicate or non-str IDs, or more than ``max_ids`` (the guest is told to abort).
        PsiSetTooLarge: the guest announced more than ``max_ids`` IDs (names it; it is told).
        ProtocolError: the guest sent a low-order point (after the message was accepted).
        PeerTimeout, JobAborted: from the transport.
    """
    return PsiHost(transport, ids, guest, round_base=round_base, workers=workers, timeout=timeout,
                   max_ids=max_ids).run()
