"""Property A: every receiver's real parse callback, fed random bytes, random well-typed messages of its
tag's class and mutations of a real captured message, through a real Mailbox: it either returns a value
or the message is rejected and logged; never a hang (< 1 s) or a large allocation (< 64 MiB), never an
error the mailbox would not treat as a rejection.

The parse callbacks are the receivers' own closures, captured from an honest in-process run of each
protocol (conftest.honest) by a transport that records the ``parse`` argument of ``recv``.
"""
from __future__ import annotations

import logging
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import live_captures
from inventory import INVENTORY
from mutations import messages, mutate, mutation_plans
from secureflhv.transport.base import Mailbox, Message, PeerTimeout

TIME_BOUND_S = 1.0
MEMORY_BOUND = 64 << 20
FATAL = (MemoryError, RecursionError, SystemError)
FUZZ = dict(derandomize=True, database=None, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def feed(capture, payload: bytes):
    """Deliver ``payload`` as (capture.sender, tag, round) to a fresh mailbox of the receiver, take it with the
    receiver's real parse; return ('accepted', value) or ('rejected', exception) after checking the bounds."""
    box = Mailbox(capture.receiver, "fuzz-job", [capture.sender])
    box.deliver(Message("fuzz-job", capture.round, capture.sender, capture.receiver, capture.tag, payload))
    raised = []

    def parse(data):
        try:
            return capture.parse(data)
        except BaseException as exc:
            raised.append(exc)
            raise

    handler = _Records()
    logger = logging.getLogger("secureflhv.transport")
    logger.addHandler(handler)
    tracemalloc.start()
    t0 = time.thread_time()
    try:
        value = box.take(capture.sender, capture.tag, capture.round, 0.0, parse)
        outcome = ("accepted", value)
    except PeerTimeout:
        outcome = ("rejected", raised[-1] if raised else None)
    finally:
        elapsed = time.thread_time() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        logger.removeHandler(handler)
    where = f"{capture.receiver} parsing {capture.tag!r} from {capture.sender} ({len(payload)} bytes: {payload[:48]!r})"
    assert elapsed < TIME_BOUND_S, f"{where}: took {elapsed:.2f}s"
    assert peak < MEMORY_BOUND, f"{where}: allocated {peak >> 20} MiB"
    if outcome[0] == "rejected":
        exc = outcome[1]
        assert exc is not None and isinstance(exc, Exception) and not isinstance(exc, FATAL), f"{where}: {exc!r}"
        assert len(box.rejected) == 1 and box.rejected[0][1].startswith("invalid payload"), box.rejected
        assert any(capture.tag in r and "rejected" in r for r in handler.records), "rejection not logged"
    return outcome


def _targets(tag):
    entry = INVENTORY[tag]
    caps = live_captures(tag, entry.run)
    assert caps, f"no live capture of {tag!r}"
    return entry.cls, caps


TAGS = sorted(INVENTORY)


@pytest.mark.parametrize("tag", TAGS)
def test_parse_random_bytes(tag):
    cls, caps = _targets(tag)

    @settings(max_examples=25, **FUZZ)
    @given(st.sampled_from(caps), st.binary(max_size=300))
    def prop(cap, payload):
        feed(cap, payload)

    prop()


@pytest.mark.parametrize("tag", TAGS)
def test_parse_random_messages(tag):
    cls, caps = _targets(tag)

    @settings(max_examples=30, **FUZZ)
    @given(st.sampled_from(caps), messages(cls))
    def prop(cap, msg):
        feed(cap, msg.SerializeToString())

    prop()


@pytest.mark.parametrize("tag", TAGS)
def test_parse_mutated_real_messages(tag):
    cls, caps = _targets(tag)
    seen = {"rejected": 0, "accepted": 0}

    @settings(max_examples=60, **FUZZ)
    @given(st.sampled_from(caps), mutation_plans())
    def prop(cap, plan):
        bad = mutate(cls, cap.payload, *plan)
        seen[feed(cap, bad)[0]] += 1

    prop()
    assert seen["rejected"] > 0, f"{tag}: no mutation of a real message was ever rejected: {seen}"
