"""How aggregation roles move messages: participant checks, per-stage collection and sending.

Transport tags start with ``"agg."``; envelope rounds are ``round_id * STAGES + stage``, so round ids
must strictly increase from one call to the next (the transport rejects stale rounds). A peer that
misses a stage deadline, or cannot be reached, is logged and counted as dropped by the caller.
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

from ..transport.base import ProtocolError
from ..transport.collectives import broadcast, gather
from ..transport.round_layout import RoundLayout
from .config import AggregationConfig
from .result import AggregationError

log = logging.getLogger("secureflhv.secagg")

STAGES = 16  # envelope round = round_id * STAGES + stage
ENVELOPE_ROUNDS = RoundLayout("secure aggregation envelope", (("round_id", None), ("stage", STAGES)))

TAG_PLAIN = "agg.plain"
TAG_SERVER = "agg.server"


def envelope_round(round_id: int, stage: int) -> int:
    """The transport round of ``stage`` of aggregation round ``round_id`` (ValueError out of range)."""
    return ENVELOPE_ROUNDS.pack(round_id=round_id, stage=stage)


def check_participants(participants: Sequence[str], me: str | None = None) -> list[str]:
    """The sorted participant ids; ValueError on duplicates or when ``me`` is not among them."""
    parts = [str(p) for p in participants]
    if len(set(parts)) != len(parts):
        raise ValueError(f"participants contain duplicates: {parts}")
    if me is not None and me not in parts:
        raise ValueError(f"{me!r} is not among this round's participants {parts}")
    return sorted(parts)


def check_round(participants: Sequence[str], config: AggregationConfig, *, me: str | None = None,
                server_id: str | None = None) -> tuple[list[str], int]:
    """The sorted participants of a round and its threshold t, from the job's settings, never the server's word.

    A client calls it on the list the server announced (``me`` and ``server_id`` given), the server on
    its own selection. The list must name distinct clients of ``config.job_clients`` (when the job's
    clients are known), never the aggregation server, include ``me``, and hold at least
    ``config.smallest_round()`` clients; t comes from ``config`` (:meth:`AggregationConfig.resolve_threshold`).
    Without these checks a server could list itself (or an outsider it controls) as the second of two
    clients and unmask the first one's update.

    Raises:
        AggregationError: a list naming the server, an outsider or a duplicate, one without ``me``, or a
            round too small for the job's ``min_clients`` / ``max_colluders`` (the message names what was
            refused and why).
    """
    who = me or "server"
    parts = [str(p) for p in participants]
    dup = sorted({p for p in parts if parts.count(p) > 1})
    if dup:
        raise AggregationError(f"{who}: refusing the participant list {parts}: {dup} listed more than once")
    if server_id is not None and server_id in parts:
        raise AggregationError(f"{who}: refusing the participant list {parts}: it names the aggregation server "
                               f"{server_id!r}, which would then hold a client's masks")
    outsiders = sorted(set(parts) - set(config.job_clients)) if config.job_clients else []
    if outsiders:
        raise AggregationError(f"{who}: refusing the participant list {parts}: {outsiders} not among the job's "
                               f"clients {list(config.job_clients)}")
    if me is not None and me not in parts:
        raise AggregationError(f"{who}: is not among this round's participants {parts}")
    try:
        t = config.resolve_threshold(len(parts))
    except ValueError as exc:
        raise AggregationError(f"{who}: refusing round of {len(parts)} participant(s) {sorted(parts)}: {exc}") from None
    return sorted(parts), t


def round_check(msg, round_id: int, what: str) -> None:
    """ProtocolError unless the payload's own ``round_id`` is ``round_id`` (a replayed payload)."""
    if msg.round_id != round_id:
        raise ProtocolError(f"{what}: payload is for round {msg.round_id}, expected {round_id} (replay?)")


def collect_each(transport, senders: Sequence[str], tag: str, round: int, timeout: float,
                 parse_for: Callable[[str], Callable[[bytes], object]]) -> dict[str, object]:
    """Receive ``tag``/``round`` from each sender (parsed by ``parse_for(sender)``) within one shared
    deadline. Dropout policy "drop": senders missing it are logged and omitted (the caller counts them as
    dropped at this stage); a peer's abort still ends the round."""
    got = gather(transport, senders, tag, round, timeout, "drop", {s: parse_for(s) for s in senders})
    for s in got.dropped:
        log.warning("%s: no valid %r (round %d) from %s within the stage deadline: counted as dropped",
                    transport.party_id, tag, round, s)
    return got.values


def collect(transport, senders: Sequence[str], tag: str, round: int, timeout: float,
            parse: Callable[[bytes], object]) -> dict[str, object]:
    """:func:`collect_each` with the same ``parse`` for every sender."""
    return collect_each(transport, senders, tag, round, timeout, lambda _sender: parse)


def send_all(transport, receivers: Sequence[str], tag: str, round: int, payloads, timeout: float) -> list[str]:
    """Send to each receiver in turn (``payloads`` is one message or a dict); return those that failed.
    Dropout policy "drop": an unreachable receiver is logged and counted as dropped by the caller."""
    message = (lambda r: payloads[r]) if isinstance(payloads, dict) else payloads
    sent = broadcast(transport, receivers, tag, message, round, timeout, "drop")
    for r, drop in sent.dropped.items():
        log.warning("%s: could not send %r to %s: %s: counted as dropped", transport.party_id, tag, r, drop.error)
    return list(sent.dropped)
