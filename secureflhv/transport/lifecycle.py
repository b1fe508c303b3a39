"""One role lifecycle for every protocol role: callbacks passed in at construction, resume passed in too.

After XGBoost's ``TrainingCallback`` (``xgboost/callback.py``): a role calls its :class:`CallbackList`
``before_training`` once, ``before_step`` / ``after_step`` around every step (an epoch, a boosting round, a
federated round; steps count from 1 = "steps done"), and ``after_training`` at the end. The
:class:`Lifecycle` mixin fires them: ``_trained`` wraps the role's training, ``before_step`` fires at each
step boundary it knows (after the resume point is read, and after a step that does not stop the training
while steps remain). ``after_step`` returns
True to stop the training after this step. Checkpointing (:class:`Checkpointer`) and early stopping
(:class:`EarlyStopping`) are callbacks; a checkpoint to continue from arrives as the constructor argument
``resume=(arrays, state)`` and is read back by :meth:`Lifecycle._restored` (the one restore path of every
role family). Nothing is assigned to a role from outside after construction. See docs/architecture.md,
"Role lifecycle and callbacks".
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Sequence

Checkpoint = tuple[dict, dict]  # (arrays: name -> numpy array, state: JSON-able dict)


class StepState:
    """What a role reports after a step: its metrics and, built only when a callback asks, its checkpoint.

    Args:
        metrics: e.g. ``{"loss": 0.31}`` (training loss of an epoch) or ``{"val_loss": ...}``.
        snapshot: ``snapshot(step_state)`` returns ``(arrays, state)`` of this step, the same pair ``resume=``
            takes back; called at most once (the result is cached), after the callbacks before it have run
            (so it can read ``step_state.stop``).
        save_when_stopping: whether a step that stops the training is still checkpointed (the trees drop
            the stopping round and save nothing; the vertical roles save it, flagged ``stopped``).
    """

    def __init__(self, metrics: Mapping[str, float] | None = None,
                 snapshot: Callable[[StepState], Checkpoint] | None = None, *, save_when_stopping: bool = True):
        self.metrics = dict(metrics or {})
        self._snapshot = snapshot
        self._cached: Checkpoint | None = None
        self.save_when_stopping = save_when_stopping
        self.stop = False  # set by the CallbackList once a callback asked to stop after this step

    def checkpoint(self) -> Checkpoint | None:
        """``(arrays, state)`` of this step, or None when the role has nothing to checkpoint."""
        if self._cached is None and self._snapshot is not None:
            self._cached = self._snapshot(self)
        return self._cached


class Callback:
    """Base class: override what you need. Hooks run in the order of the role's callbacks list."""

    def before_training(self, role: Any) -> None:
        """Once, when the role's training starts (before its resume checkpoint is read)."""

    def after_training(self, role: Any) -> None:
        """Once, after the last step (not after a failure)."""

    def before_step(self, step: int) -> None:
        """Before step ``step`` (1-based: the step that will be done after it)."""

    def after_step(self, step: int, state: StepState) -> bool:
        """After step ``step`` (steps done); True asks the role to stop after it."""
        return False


class CallbackList:
    """Runs callbacks in order. ``after_step`` calls every one (as XGBoost does) and returns True when any
    asked to stop; ``state.stop`` tells the later ones that an earlier one did."""

    def __init__(self, callbacks: Iterable[Callback] = ()):
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks: {type(cb).__name__} is not a Callback")

    def before_training(self, role: Any) -> None:
        """Call every callback's :meth:`Callback.before_training`, in order."""
        for cb in self.callbacks:
            cb.before_training(role)

    def after_training(self, role: Any) -> None:
        """Call every callback's :meth:`Callback.after_training`, in order."""
        for cb in self.callbacks:
            cb.after_training(role)

    def before_step(self, step: int) -> None:
        """Call every callback's :meth:`Callback.before_step`, in order."""
        for cb in self.callbacks:
            cb.before_step(step)

    def after_step(self, step: int, state: StepState) -> bool:
        """Call every callback's :meth:`Callback.after_step` (all of them, in order); True when any asked to stop
        (``state.stop`` tells the later ones).
        """
        for cb in self.callbacks:
            if cb.after_step(step, state):
                state.stop = True
        return state.stop


class Checkpointer(Callback):
    """Saves every ``every``-th step: ``store.save(step, arrays=..., state={**state, **extra_state})``.

    ``store``: anything with that ``save`` (the runtime's ``CheckpointStore``: atomic, hashed, JSON and
    ``.npy`` only). ``extra_state``: merged into every saved state (the runtime adds ``job_digest``).
    A step that stops the training is skipped when its :class:`StepState` says ``save_when_stopping=False``.
    """

    def __init__(self, store: Any, every: int = 1, extra_state: Mapping[str, Any] | None = None):
        if every < 1:
            raise ValueError("every must be >= 1")
        self.store, self.every, self.extra_state = store, int(every), dict(extra_state or {})

    def after_step(self, step: int, state: StepState) -> bool:
        """Save the step's checkpoint every ``every`` steps (not a stopping step unless the role saves those);
        never asks to stop.
        """
        if step % self.every or (state.stop and not state.save_when_stopping):
            return False
        snap = state.checkpoint()
        if snap is not None:
            arrays, st = snap
            self.store.save(step, arrays=arrays, state={**st, **self.extra_state})
        return False


class EarlyStopping(Callback):
    """Stop when ``metric`` has not improved for ``patience`` steps in a row (the one early-stopping rule).

    A value improves when it is below the best so far by more than ``min_delta`` (XGBoost's
    ``EarlyStopping``; Keras' ``min_delta``). ``patience=None`` only tracks the best. No stop is asked at
    ``last_step`` (the training ends there anyway; the vertical LR's "stopped" flag stays false).
    The job files keep their names: vertical LR ``early_stopping`` / ``patience`` / ``tol``, the trees
    ``early_stopping_rounds`` (min_delta 0).

    Attributes: ``best`` (inf before any value), ``best_index`` (0-based position of the best value among
    those seen, None before any), ``bad`` (values in a row without improvement).
    """

    def __init__(self, patience: int | None, min_delta: float = 0.0, metric: str = "loss",
                 last_step: int | None = None):
        if patience is not None and patience < 1:
            raise ValueError("patience must be >= 1")
        self.patience, self.min_delta, self.metric, self.last_step = patience, float(min_delta), metric, last_step
        self.best, self.best_index, self.bad, self.seen = math.inf, None, 0, 0

    def update(self, value: float) -> bool:
        """Record the next value; True when the patience is used up (whatever ``last_step``)."""
        if value < self.best - self.min_delta:
            self.best, self.best_index, self.bad = value, self.seen, 0
        else:
            self.bad += 1
        self.seen += 1
        return self.patience is not None and self.bad >= self.patience

    def replay(self, values: Iterable[float]) -> EarlyStopping:
        """Feed ``values`` (the history a checkpoint holds) as if they had just been seen; returns self."""
        for v in values:
            self.update(v)
        return self

    def after_step(self, step: int, state: StepState) -> bool:
        """Update with ``state.metrics[metric]``; True when patience ran out before ``last_step``."""
        out_of_patience = self.update(state.metrics[self.metric])
        return out_of_patience and (self.last_step is None or step < self.last_step)


class Lifecycle:
    """Mixin of every role: ``callbacks`` and ``resume`` from the constructor, and the one restore path.

    ``step_key``: the state field that counts the steps of a checkpoint (``rounds_done`` / ``epochs_done``);
    ``family``: the words of the error message ("a vertical LR checkpoint").
    """

    step_key = "rounds_done"
    family = "protocol"
    list_arrays = False  # name the checkpoint's arrays in the error message

    def _init_lifecycle(self, callbacks: Iterable[Callback] = (), resume: Checkpoint | None = None) -> None:
        self.callbacks = callbacks if isinstance(callbacks, CallbackList) else CallbackList(callbacks)
        self._resume = resume
        self._n_steps: int | None = None  # known once the resume point is read (:meth:`_steps_begin`)

    def _trained(self, fn: Callable, *args):
        """``fn(*args)`` (the role's training) between the callbacks' ``before_training`` and
        ``after_training`` (the latter not after a failure)."""
        self.callbacks.before_training(self)
        out = fn(*args)
        self.callbacks.after_training(self)
        return out

    def _steps_begin(self, done: int, n_steps: int) -> None:
        """The training runs steps ``done + 1 .. n_steps``: fire ``before_step`` of the first one."""
        self._n_steps = int(n_steps)
        if done < self._n_steps:
            self.callbacks.before_step(done + 1)

    def _restored(self, n_steps: int, needed: Sequence[str] = (), check: Callable[[int, dict, dict], bool]
                  = lambda done, arrays, state: True) -> tuple[int, dict, dict]:
        """(steps done, arrays, state) of the ``resume`` checkpoint, ``(0, {}, {})`` without one.

        Raises ValueError ("checkpoint: not a <family> checkpoint of this configuration") unless the state's
        ``step_key`` is an int in [1, n_steps], the ``needed`` arrays are present and ``check`` holds.
        """
        if self._resume is None:
            self._steps_begin(0, n_steps)
            return 0, {}, {}
        arrays, state = self._resume
        done = state.get(self.step_key)
        if not isinstance(done, int) or not 1 <= done <= n_steps or set(needed) - set(arrays) \
                or not check(done, arrays, state):
            names = f" ({sorted(arrays)})" if self.list_arrays else ""
            raise ValueError(f"checkpoint: not a {self.family} checkpoint of this configuration{names}")
        if not state.get("stopped"):  # a run that had stopped early resumes with no step left
            self._steps_begin(done, n_steps)
        return done, arrays, state

    def _after_step(self, done: int, snapshot: Callable[[StepState], Checkpoint] | None = None,
                    metrics: Mapping[str, float] | None = None, *, stopping: bool = False,
                    save_when_stopping: bool = True) -> bool:
        """Run the callbacks after step ``done``; True when the training stops after it.

        ``snapshot(step_state)`` returns (arrays, state) without ``step_key`` (added here); ``stopping``: the role has
        already decided to stop (the trees' early stopping lives in their model record, ``val_losses``).
        """
        def full(step_state: StepState) -> Checkpoint:
            arrays, state = snapshot(step_state)
            return arrays, {self.step_key: done, **state}

        state = StepState(metrics, full if snapshot is not None else None, save_when_stopping=save_when_stopping)
        state.stop = bool(stopping)
        stop = self.callbacks.after_step(done, state)
        if not stop and self._n_steps is not None and done < self._n_steps:
            self.callbacks.before_step(done + 1)
        return stop
