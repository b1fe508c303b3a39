"""The role lifecycle contract (secureflhv/transport/lifecycle.py): callback order, stop, checkpoint, early stopping."""
from __future__ import annotations

import pytest

from secureflhv.transport.lifecycle import Callback, CallbackList, Checkpointer, EarlyStopping, Lifecycle, StepState


class _Store:
    def __init__(self):
        self.saved = {}

    def save(self, step, *, arrays, state):
        self.saved[step] = (arrays, state)


class _Log(Callback):
    def __init__(self, name, seen, stop=False):
        self.name, self.seen, self.stop = name, seen, stop

    def after_step(self, step, state):
        self.seen.append((self.name, step, state.stop))
        return self.stop


def test_callback_list_runs_every_callback_in_order_and_ors_the_stop():
    seen = []
    cbs = CallbackList([_Log("a", seen, stop=True), _Log("b", seen)])
    assert cbs.after_step(3, StepState()) is True
    assert seen == [("a", 3, False), ("b", 3, True)]  # b still runs and knows a asked to stop
    with pytest.raises(TypeError, match="not a Callback"):
        CallbackList([object()])


def test_early_stopping_patience_min_delta_and_last_step():
    es = EarlyStopping(patience=2, min_delta=0.1, last_step=5)
    stops = [es.after_step(i + 1, StepState({"loss": v})) for i, v in enumerate([1.0, 0.95, 0.5, 0.45, 0.44])]
    # 0.95 and 0.45/0.44 are not better by more than 0.1; the patience runs out at step 5 = last_step
    assert stops == [False, False, False, False, False] and (es.best, es.best_index, es.bad) == (0.5, 2, 2)
    again = EarlyStopping(patience=2, min_delta=0.1).replay([1.0, 0.95, 0.5, 0.45])
    assert again.update(0.44) is True
    tracking = EarlyStopping(None).replay([3.0, 1.0, 2.0])
    assert (tracking.best_index, tracking.bad, tracking.update(5.0)) == (1, 1, False)


def test_checkpointer_saves_the_lazy_snapshot_and_skips_a_stopping_tree_round():
    store, calls = _Store(), []

    def snap(state):
        calls.append(state.stop)
        return {"x": 1}, {"stopped": state.stop}

    Checkpointer(store, extra_state={"job_digest": "d"}).after_step(1, StepState(snapshot=snap))
    stopping = StepState(snapshot=snap, save_when_stopping=False)
    stopping.stop = True
    Checkpointer(store).after_step(2, stopping)
    Checkpointer(store, every=2).after_step(3, StepState(snapshot=snap))
    assert store.saved == {1: ({"x": 1}, {"stopped": False, "job_digest": "d"})} and calls == [False]


class _Role(Lifecycle):
    step_key, family, list_arrays = "epochs_done", "toy", True

    def __init__(self, callbacks=(), resume=None):
        self._init_lifecycle(callbacks, resume)


def test_restore_checks_the_step_count_and_arrays():
    assert _Role()._restored(3) == (0, {}, {})
    assert _Role(resume=({"w": 1}, {"epochs_done": 2}))._restored(3, ("w",))[0] == 2
    for bad in [({"w": 1}, {"epochs_done": 4}), ({}, {"epochs_done": 1}), ({"w": 1}, {"rounds_done": 1})]:
        with pytest.raises(ValueError, match=r"not a toy checkpoint of this configuration \("):
            _Role(resume=bad)._restored(3, ("w",))
    store = _Store()
    role = _Role([Checkpointer(store)])
    assert role._after_step(1, lambda s: ({"w": 0}, {"k": 1})) is False
    assert store.saved == {1: ({"w": 0}, {"epochs_done": 1, "k": 1})}
