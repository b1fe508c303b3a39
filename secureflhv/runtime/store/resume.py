"""Step agreement at start-up: from which checkpoint the parties of a job resume.

``secureflhv run JOB --resume`` / ``party --resume`` ask for a resume: ``run_party`` passes ``resume``
to the job's run function, which calls :func:`role_lifecycle` before it builds its role; that calls
:func:`agree_step` with the steps its :class:`~.checkpoint.CheckpointStore` holds (empty without
``--resume``, so a party started without it makes everyone start from scratch rather than hang).
Two rounds, tag ``resume.steps``, payload a protobuf ``Bundle`` (at most 1 KiB) with
``text["steps"]`` = comma-separated step numbers:

* round 0: every party sends every peer the steps it can load (at most :data:`MAX_ANNOUNCED`);
  each computes the newest step every party holds (``None``: start from scratch);
* round 1: every party sends its choice; all must be equal (a peer that told different parties
  different lists is caught here: :class:`ProtocolError`, naming it).

What a peer learns: how many steps the others completed. A lying peer can only move everyone to an
earlier common step (or to scratch), or make the job fail with a clear error; a malformed announcement
is rejected and logged by the mailbox (the honest one may follow until the deadline).
"""
from __future__ import annotations

import logging
import re
from typing import Iterable

from ...proto import messages_pb2
from ...transport import ProtocolError, Transport
from ...transport.lifecycle import Checkpointer
from .checkpoint import CHECKPOINT_DIR, MAX_STEP, CheckpointError, CheckpointStore

log = logging.getLogger("secureflhv.resume")

TAG_STEPS = "resume.steps"
MAX_ANNOUNCED = 16
_MAX_BYTES = 1024
_LIST = re.compile(r"^(\d{1,8}(,\d{1,8}){0,15})?$")


def _encode(steps: Iterable[int]) -> messages_pb2.Bundle:
    return messages_pb2.Bundle(text={"steps": ",".join(str(int(s)) for s in steps)})


def parse_steps(payload: bytes) -> list[int]:
    """``parse`` callback: the announced steps, sorted; ProtocolError unless at most 16 distinct ints in
    [0, MAX_STEP]."""
    if len(payload) > _MAX_BYTES:
        raise ProtocolError(f"{TAG_STEPS}: {len(payload)} bytes, at most {_MAX_BYTES}")
    text = messages_pb2.Bundle.FromString(payload).text.get("steps")
    if text is None or not _LIST.match(text):
        raise ProtocolError(f"{TAG_STEPS}: not a list of at most {MAX_ANNOUNCED} step numbers")
    steps = [int(s) for s in text.split(",")] if text else []
    if len(set(steps)) != len(steps) or any(not 0 <= s <= MAX_STEP for s in steps):
        raise ProtocolError(f"{TAG_STEPS}: repeated or out-of-range step numbers")
    return sorted(steps)


def agree_step(transport: Transport, peers: Iterable[str], available: Iterable[int]) -> int | None:
    """Agree with ``peers`` on the step to resume from: the newest one every party holds, or ``None``.

    ``available``: the steps this party can load (verified). Raises ProtocolError when the parties'
    choices differ, PeerTimeout/TransportError when a peer does not answer within the deadline.
    """
    peers = sorted(peers)
    mine = sorted(set(int(s) for s in available))[-MAX_ANNOUNCED:]
    for p in peers:
        transport.send(p, TAG_STEPS, _encode(mine), round=0)
    common = set(mine)
    for p in peers:
        theirs = transport.recv(p, TAG_STEPS, round=0, parse=parse_steps)
        log.info("%s: %s holds checkpoint steps %s", transport.party_id, p, theirs or "none")
        common &= set(theirs)
    choice = max(common) if common else None
    for p in peers:
        transport.send(p, TAG_STEPS, _encode([] if choice is None else [choice]), round=1)
    for p in peers:
        theirs = transport.recv(p, TAG_STEPS, round=1, parse=parse_steps)
        if theirs != ([] if choice is None else [choice]):
            raise ProtocolError(f"{transport.party_id}: {p} resumes from step {theirs or 'none'}, "
                                f"this party from {choice if choice is not None else 'none'}")
    log.info("%s: %s", transport.party_id,
             f"resuming after checkpoint step {choice}" if choice is not None else "starting from scratch")
    return choice


def _usable(store: CheckpointStore, digest: str, party_id: str) -> dict[int, tuple[dict, dict]]:
    """step -> (arrays, state) of every stored step that verifies and was written under ``digest``."""
    loaded = {}
    for step in store.steps():
        try:
            arrays, state = store.load(step)
        except CheckpointError as exc:
            log.warning("%s: checkpoint step %d not usable: %s", party_id, step, exc)
            continue
        if state.get("job_digest") == digest:
            loaded[step] = (arrays, state)
    return loaded


def role_lifecycle(cfg, party, transport: Transport, resume: bool, peers: Iterable[str] | None = None) -> dict:
    """The ``callbacks`` and ``resume`` constructor arguments of this party's role (``Role(..., **these)``).

    Agrees on the checkpoint step with ``peers`` (default: every other party of the job), offering the
    verified steps of ``<output_dir>/<party>/checkpoints`` when ``resume`` (``--resume``) is set and none
    otherwise. ``resume``: the agreed step's ``(arrays, state)`` or None (the store is then cleared);
    ``callbacks``: a :class:`~secureflhv.transport.lifecycle.Checkpointer` saving every step with the job
    digest. Checkpoints that fail their hashes or were written under another job description
    (:func:`~..process.rendezvous.job_digest`) are not offered.
    """
    from ..process.rendezvous import job_digest

    store = CheckpointStore(cfg.output_dir(party.id) / CHECKPOINT_DIR, job_id=cfg.job.id, party_id=party.id)
    digest = job_digest(cfg)
    loaded = _usable(store, digest, party.id) if resume else {}
    if peers is None:
        peers = [p.id for p in cfg.parties if p.id != party.id]
    step = agree_step(transport, peers, loaded)
    if step is None:
        store.clear()
    return {"callbacks": [Checkpointer(store, extra_state={"job_digest": digest})],
            "resume": None if step is None else loaded[step]}
