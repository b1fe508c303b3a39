"""The sum of a client's per-record clipped gradients at one model: the input of record-level DP-GD.

For records (x_r, y_r), r = 1..n, and the model's aggregated tensors w (:func:`~.user_model.fl_entries`, in the
flat-vector order), returns G = Σ_r clip_C(∇_w ℓ(w; x_r, y_r)) with clip_C(g) = g · min(1, C / ‖g‖₂) over all
aggregated tensors together (Abadi et al., CCS 2016, Algorithm 1, "clip gradient"). Removing or adding one record
moves G by at most C in L2, whatever the other records: that is the sensitivity the DP layer relies on
(:mod:`.dp_record_sum`).

Per-record gradients come from ``torch.func`` (``vmap`` over ``grad`` of ``functional_call``), in chunks of
``chunk`` records. The model runs in ``eval`` mode: a record's loss must not depend on the other records of its
batch (batch norm's batch statistics would couple them; dropout is off). Tensors outside the aggregated ones
(a user model's frozen backbone, buffers) are held fixed.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .local_data import Rows, input_batch
from .models import label_tensor, model_device, task_loss
from .user_model import fl_entries


def clipped_gradient_sum(model: nn.Module, X: Rows, y: np.ndarray, clip: float, chunk: int = 256) -> np.ndarray:
    """G = Σ_r clip_C(∇ℓ_r) (module docstring) at ``model``'s current weights.

    Args:
        model: the client's model (built-in or the user's; ``torch.func`` must support its forward).
        X: the records' inputs, (n, ...) rows (numpy float32 or a dataset view). y: (n,) labels.
        clip: C > 0, the per-record L2 clip.
        chunk: records per vectorised batch (memory: chunk × d floats).

    Returns:
        float64, shape (d,): the sum, in the flat-vector order of :func:`~.models.get_flat`.

    Raises:
        ValueError: no records, clip not positive, or a per-record gradient that is not finite.
    """
    n = len(y)
    if n < 1 or not clip > 0:
        raise ValueError(f"clipped_gradient_sum needs records and clip > 0, got {n} records, clip {clip}")
    from torch.func import functional_call, grad, vmap

    entries = fl_entries(model)
    names = [name for name, _ in entries]
    weights = {name: t.detach() for name, t in entries}
    fixed = {k: v.detach() for k, v in model.state_dict(keep_vars=True).items() if k not in weights}
    device, labels = model_device(model), label_tensor(model, y)

    def loss_of_one(w, x, target):
        out = functional_call(model, {**fixed, **w}, (x.unsqueeze(0),))
        return task_loss(model, out, target.unsqueeze(0))

    per_record = vmap(grad(loss_of_one), in_dims=(None, 0, 0))
    total = torch.zeros(sum(t.numel() for t in weights.values()), dtype=torch.float64, device=device)
    was_training = model.training
    model.train(False)  # eval mode (module docstring)
    try:
        for start in range(0, n, chunk):
            xb = input_batch(X, start, min(n, start + chunk)).to(device)
            g = per_record(weights, xb, labels[start:start + chunk].to(device))
            flat = torch.cat([g[name].reshape(len(xb), -1) for name in names], dim=1)
            norms = torch.linalg.vector_norm(flat, dim=1, keepdim=True, dtype=torch.float64)
            if not bool(torch.isfinite(norms).all()):
                raise ValueError("a record's gradient is not finite (lower learning_rate?)")
            # the factor in float64 then float32: a clipped record's norm is C within float32's 6e-8 relative
            factor = torch.clamp(clip / norms.clamp_min(1e-300), max=1.0) * (1 - 2.0 ** -22)
            total += (flat * factor.to(flat.dtype)).sum(dim=0, dtype=torch.float64)
    finally:
        model.train(was_training)
    return total.cpu().numpy()
