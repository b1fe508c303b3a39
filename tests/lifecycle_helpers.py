"""Test helpers for the role lifecycle (:mod:`secureflhv.transport.lifecycle`).

The shared harnesses (``run_fl``, ``run_peers``, ``make_roles``, ``run_vertical_lr``, ``vertical_run``,
``horizontal_run``) take ``callbacks`` / ``resume`` keyed by party id and hand each role its own at
construction (:func:`lifecycle_kwargs`); nothing is set on a role after it is built.
"""
from __future__ import annotations

import json
from typing import Callable, Mapping, Sequence

import numpy as np

from secureflhv.transport.lifecycle import Callback, Checkpoint, Checkpointer


class _Memory:
    """A ``CheckpointStore`` stand-in: ``saved[step] = (arrays copied, state through JSON)``."""

    def __init__(self, saved: dict):
        self.saved = saved

    def save(self, step, *, arrays, state):
        self.saved[step] = ({k: np.array(v, copy=True) for k, v in arrays.items()}, json.loads(json.dumps(state)))


def recorder(saved: dict) -> Checkpointer:
    """A Checkpointer that records every saved step in ``saved`` (in memory)."""
    return Checkpointer(_Memory(saved))


def lifecycle_kwargs(callbacks: Mapping[str, Sequence[Callback]] | None = None,
                     resume: Mapping[str, Checkpoint] | None = None) -> Callable[[str], dict]:
    """``party id -> {"callbacks": ..., "resume": ...}``: the constructor arguments of that party's role.

    ``callbacks`` / ``resume``: {party id: callbacks list} / {party id: (arrays, state)}; a party absent
    from either gets none (no callbacks of the harness's, a fresh start).
    """
    callbacks, resume = callbacks or {}, resume or {}
    return lambda party_id: {"callbacks": list(callbacks.get(party_id, ())), "resume": resume.get(party_id)}
