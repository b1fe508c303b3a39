"""Test helpers for the role lifecycle (:mod:`secureflhv.transport.lifecycle`).

The in-process resume tests build their roles through shared harnesses that do not take ``callbacks`` /
``resume`` yet; :func:`give_lifecycle` sets them on a freshly built role before it runs, exactly as the
constructor arguments would (the role's own callbacks, e.g. the vertical LR guest's EarlyStopping, first).
"""
from __future__ import annotations

import json

import numpy as np

from secureflhv.transport.lifecycle import Checkpointer


class _Memory:
    """A ``CheckpointStore`` stand-in: ``saved[step] = (arrays copied, state through JSON)``."""

    def __init__(self, saved: dict):
        self.saved = saved

    def save(self, step, *, arrays, state):
        self.saved[step] = ({k: np.array(v, copy=True) for k, v in arrays.items()}, json.loads(json.dumps(state)))


def recorder(saved: dict) -> Checkpointer:
    """A Checkpointer that records every saved step in ``saved`` (in memory)."""
    return Checkpointer(_Memory(saved))


def give_lifecycle(role, callbacks=(), resume=None) -> None:
    """Add ``callbacks`` after the role's own and set its ``resume`` checkpoint (before it runs)."""
    role._init_lifecycle([*role.callbacks.callbacks, *callbacks], resume)
