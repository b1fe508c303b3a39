"""User-defined torch modules as the bottom and top models of the split NN (:mod:`.split_nn`).

A job may name, instead of an MLP width list, a factory of the consortium's code
(:class:`secureflhv.params.FactoryRef`) for each host's bottom, the guest's bottom and the guest's top
model. Each party imports and calls it locally (no code travels), as
``factory(**kwargs, in_features=d, out_features=k)``: ``d`` the width of its own input (its preprocessed
feature columns; the top: ``interactive_units``), ``k`` the output width the job file declares
(``host_bottom_output_width`` / ``guest_bottom_output_width``; the top: the task's outputs, 1 for two
classes or regression, else one per class).

Initialisation depends only on the job's seed: the call runs with torch's global generator seeded
``seed`` (:func:`seeded_module`; the previous generator state is restored after), under a lock, since
in-process parties share that generator. The module is then cast to float64, the split NN's dtype
(floating-point parameters and buffers), so it receives each party's rows as float64 (batch, d).

Before any split NN message, each party checks its modules with a probe forward pass on a few of its own
rows (:func:`check_output`): the output must be a (batch, k) tensor. Every failure is a
:class:`~secureflhv.params.FactoryError` (a ValueError) naming the party and the job-file field.
What a peer learns: nothing (the probe is local); the declared widths are in the job file every party
validated, never taken from a peer.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import numpy as np
import torch

from ..params import FactoryError, FactoryRef

DTYPE = torch.float64
PROBE_ROWS = 4  # rows of the probe forward pass (fewer when the party has fewer)

# torch's global generator is shared by every thread of the process (in-process parties build at once)
_SEED_LOCK = threading.Lock()


def seeded_module(ref: FactoryRef, field: str, party: str, seed: int, in_features: int,
                  out_features: int) -> torch.nn.Module:
    """``ref``'s module, built with torch's global generator seeded ``seed``, cast to float64.

    Args:
        ref: the factory; called as ``factory(**kwargs, in_features=..., out_features=...)``.
        field: the job-file field of ``ref`` (``params.host_bottom_factory``).
        party: this party's id (named in errors).
        seed: the seed of the initial weights (the job's ``init_seed`` rule, :mod:`.split_nn`).
    Raises FactoryError naming ``party`` and ``<field>.factory``: not importable, the call raised, or it did
    not return a ``torch.nn.Module``.
    """
    where = f"{field}.factory"
    with _SEED_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        try:
            module = ref.call(where, in_features=int(in_features), out_features=int(out_features))
        except FactoryError as exc:
            raise exc.at(party) from exc.__cause__
    if not isinstance(module, torch.nn.Module):
        raise FactoryError(where, f"{ref.factory} returned a {type(module).__name__}, not a torch.nn.Module", party)
    return module.to(DTYPE)


def probe_rows(X: np.ndarray, n: int = PROBE_ROWS) -> np.ndarray:
    """The first ``n`` rows of ``X`` (n_rows, d) for the probe pass; zeros (2, d) when ``X`` has none."""
    X = np.asarray(X, dtype=np.float64)
    return X[:n] if X.shape[0] else np.zeros((2, X.shape[1]))


def check_output(module: torch.nn.Module, rows: np.ndarray, width: int, *, factory_field: str, width_field: str,
                 party: str, why: str | None = None) -> None:
    """Run ``module`` on ``rows`` (b, d) float64 in inference mode, without gradients, and check the result
    is a (b, ``width``) floating-point tensor. The module's mode is restored after; nothing is updated
    (inference mode: batch-norm statistics stay as they are).

    Raises FactoryError naming ``party`` and ``factory_field`` (the forward pass raised) or ``width_field``
    (the output's shape is not the declared one; ``why`` says where the width comes from, default
    ``<width_field> = <width>``).
    """
    x = torch.as_tensor(np.asarray(rows, dtype=np.float64), dtype=DTYPE)
    with inference(module):
        try:
            out = module(x)
        except Exception as exc:  # noqa: BLE001 - user code: any failure becomes one clear error
            raise FactoryError(f"{factory_field}.factory", f"the module's forward pass on float64 rows of shape "
                                                          f"{tuple(x.shape)} raised {type(exc).__name__}: {exc}",
                               party) from exc
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if shape != (x.shape[0], width) or not out.is_floating_point():
        raise FactoryError(width_field, f"the module of {factory_field} maps rows of shape {tuple(x.shape)} to "
                                        f"{shape if isinstance(shape, str) else f'{out.dtype} {shape}'}, not to a "
                                        f"floating-point ({x.shape[0]}, {width}) as "
                                        f"{why or f'{width_field} = {width}'} requires", party)


@contextlib.contextmanager
def inference(*modules: torch.nn.Module | None) -> Iterator[None]:
    """Put ``modules`` (None skipped) in inference mode (``train(False)``: dropout off, batch-norm running
    statistics used) for the block, then restore each one's mode."""
    mods = [m for m in modules if m is not None]
    modes = [m.training for m in mods]
    for m in mods:
        m.train(False)
    try:
        yield
    finally:
        for m, mode in zip(mods, modes):
            m.train(mode)
