"""Send to every peer / collect from every peer, with an explicit dropout policy.

After NVFlare's ``broadcast_and_wait``: :func:`broadcast` and :func:`gather` run one transport call per
peer and return a :class:`Collected` — the peers' values and the peers that dropped, each with its
reason. ``on_failure`` says what a peer's failure does:

* ``"raise"``: the first failing peer (in ``peers`` order) ends the collective with its error (a
  sequential collective stops there; a concurrent broadcast lets the sends in flight finish first);
* ``"drop"``: the peer is listed in :attr:`Collected.dropped` and the others go on.

What counts as a peer's failure is ``failures`` (exception types; :class:`JobAborted` never: a peer's
abort ends the job). A ``gather`` ``deadline`` is shared by all peers unless ``shared=False`` (each peer
then gets the whole deadline, as a sequence of plain ``recv`` calls would). Peers are served in
``peers`` order; see docs/architecture.md, "Transport collectives and round keys".
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Generic, Literal, Mapping, Sequence, TypeVar

from .base import JobAborted, PeerTimeout, Transport, TransportError

T = TypeVar("T")
OnFailure = Literal["raise", "drop"]
MAX_SENDERS = 16   # threads of a concurrent broadcast
MIN_WAIT_S = 0.01  # a peer whose turn comes after a shared deadline still gets one look at its mailbox


@dataclass(frozen=True)
class Dropout:
    """A peer that failed a collective: ``reason`` is one line (error type and message), ``error`` the error."""

    peer: str
    reason: str
    error: BaseException


@dataclass
class Collected(Generic[T]):
    """What a collective got: ``values`` peer -> parsed message (:func:`gather`) or ``None`` (delivered,
    :func:`broadcast`), in ``peers`` order, and ``dropped`` peer -> :class:`Dropout` (``on_failure="drop"``)."""

    values: dict[str, T] = field(default_factory=dict)
    dropped: dict[str, Dropout] = field(default_factory=dict)

    @property
    def ok(self) -> list[str]:
        """The peers that succeeded, in ``peers`` order."""
        return list(self.values)


def _check_policy(on_failure: str) -> None:
    if on_failure not in ("raise", "drop"):
        raise ValueError(f"on_failure must be 'raise' or 'drop', got {on_failure!r}")


def _outcome(peers: Sequence[str], results: dict[str, tuple[bool, object]], on_failure: str,
             wrap: Callable[[str, BaseException], BaseException] | None = None) -> Collected:
    """Fold per-peer (ok, value-or-error) into a :class:`Collected`; raise the first failure under "raise"."""
    out = Collected()
    for p in peers:
        if p not in results:
            continue
        ok, value = results[p]
        if ok:
            out.values[p] = value
        elif on_failure == "raise":
            raise (wrap(p, value) if wrap is not None else value) from None
        else:
            out.dropped[p] = Dropout(p, f"{type(value).__name__}: {value}", value)
    return out


def broadcast(transport: Transport, peers: Sequence[str], tag: str, payload, key: int,
              deadline: float | Callable[[str], float] | None = None, on_failure: OnFailure = "raise", *,
              concurrent: bool = False, failures: tuple[type[BaseException], ...] = (TransportError,)) -> Collected:
    """Send ``tag`` round ``key`` to each of ``peers``.

    Args:
        payload: one message (bytes or protobuf) for all, or a callable ``peer -> message``.
        key: the transport round (an int; a :class:`~secureflhv.transport.round_layout.RoundLayout` packs one).
        deadline: seconds to keep trying to deliver to one peer (a callable: per peer); None: the
            transport's default.
        on_failure: ``"raise"`` or ``"drop"`` (module docstring).
        concurrent: send from up to :data:`MAX_SENDERS` threads (one peer alone is sent inline).
        failures: errors that count as the peer's failure (others propagate).

    Returns:
        :class:`Collected` with ``values`` peer -> None for the peers reached.

    Raises:
        The failing peer's error under ``"raise"``, as ``type(err)("<me>: cannot deliver <tag> (round <key>)
        to <peer>: <err>")``; ValueError for an unknown ``on_failure``.
    """
    _check_policy(on_failure)
    peers = list(peers)
    results: dict[str, tuple[bool, object]] = {}

    def send(p: str) -> bool:
        msg = payload(p) if callable(payload) else payload
        timeout = deadline(p) if callable(deadline) else deadline
        try:
            transport.send(p, tag, msg, round=key, timeout=timeout)
            results[p] = (True, None)
        except JobAborted:
            raise
        except failures as exc:
            results[p] = (False, exc)
            return False
        return True

    if concurrent and len(peers) > 1:
        with ThreadPoolExecutor(max_workers=min(MAX_SENDERS, len(peers))) as pool:
            for f in [pool.submit(send, p) for p in peers]:
                f.result()
    else:
        for p in peers:
            if not send(p) and on_failure == "raise":
                break

    def wrap(p: str, exc: BaseException) -> BaseException:
        return type(exc)(f"{transport.party_id}: cannot deliver {tag!r} (round {key}) to {p!r}: {exc}")
    return _outcome(peers, results, on_failure, wrap)


def gather(transport: Transport, peers: Sequence[str], tag: str, key: int, deadline: float | None = None,
           on_failure: OnFailure = "raise", parse: Callable[[bytes], T] | Mapping[str, Callable] | None = None, *,
           shared: bool = True, failures: tuple[type[BaseException], ...] = (PeerTimeout,)) -> Collected[T]:
    """Receive ``tag`` round ``key`` from each of ``peers``, one after the other in ``peers`` order.

    Args:
        key: the transport round.
        deadline: seconds; with ``shared`` one budget for all peers (a peer whose turn comes late gets
            at least :data:`MIN_WAIT_S`), else each peer's own. None: the transport's default.
        on_failure: ``"raise"`` or ``"drop"`` (module docstring).
        parse: the ``parse`` of :meth:`Transport.recv` (a payload it refuses is rejected and the wait goes
            on), or a mapping peer -> parse.
        failures: errors that count as the peer's failure (others propagate; :class:`JobAborted` always).

    Returns:
        :class:`Collected` with ``values`` peer -> ``parse(payload)`` (the bytes without ``parse``).

    Raises:
        The first failing peer's error, unchanged (a :class:`PeerTimeout` names the peer), under ``"raise"``.
    """
    _check_policy(on_failure)
    budget = transport.deadline if deadline is None else deadline
    end = time.monotonic() + budget
    results: dict[str, tuple[bool, object]] = {}
    for p in peers:
        timeout = max(end - time.monotonic(), MIN_WAIT_S) if shared else budget
        parser = parse.get(p) if isinstance(parse, Mapping) else parse
        try:
            results[p] = (True, transport.recv(p, tag, key, timeout=timeout, parse=parser))
        except JobAborted:
            raise
        except failures as exc:
            results[p] = (False, exc)
            if on_failure == "raise":
                break
    return _outcome(list(peers), results, on_failure)
