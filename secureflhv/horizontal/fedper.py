"""FedPer: federated learning with personalisation layers (Arivazhagan, Aggarwal, Singh, Choudhary 2019;
the "personalisation layers" family of Zhu et al., "Federated learning on non-IID data: a survey",
section 5), with the shared base aggregated through secure aggregation.

The model is split into *base* layers (every parameter before the last ``personal_layers``
``nn.Linear`` layers) and a *personal head* (those last layers). Each round a selected client loads the
global base and its own head (the global head, the first time), runs local SGD on both, keeps the
trained head, and sends the base update Δ with weight n_i — the head's coordinates set to zero — so
the server's FedAvg step moves only the base: w_base ← w_base + Σ n_i Δ_i / Σ n_i. The server's head
stays at its initialisation (what a new client starts from). Evaluation: each client evaluates the
global base with its own head on its own test split (the FL server reports the per-client accuracies
and the worst client, :class:`~secureflhv.horizontal.fl.RoundRecord`).

What each role learns: as FedAvg for the base; nothing about any head — a client's head never leaves
it (its coordinates in the aggregated vector are exact zeros, masked like every other input).
"""
from __future__ import annotations

import numpy as np
from torch import nn

from .models import fl_entries
from .strategies import Strategy


def personal_mask(model: nn.Module, personal_layers: int) -> np.ndarray:
    """Boolean (n_params,) mask of the flat vector (:func:`~.user_model.fl_entries`): True for the last
    ``personal_layers`` ``nn.Linear`` layers' weights and biases. Raises ValueError when the model has fewer linear layers than that, or
    when nothing would be left to share."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if personal_layers > len(linears):
        raise ValueError(f"FedPer: {personal_layers} personal layers, the model has {len(linears)} linear layers")
    head = {id(p) for m in linears[len(linears) - personal_layers:] for p in m.parameters()}
    mask = np.concatenate([np.full(p.numel(), id(p) in head) for _, p in fl_entries(model)])
    if mask.all():
        raise ValueError(f"FedPer: {personal_layers} personal layers leave no shared base")
    return mask


class FedPer(Strategy):
    """FedPer with a personal head of ``personal_layers`` final linear layers (see the module docstring)."""

    name = "fedper"
    state_names = ("head",)

    def __init__(self, personal_layers: int = 1):
        if int(personal_layers) != personal_layers or personal_layers < 1:
            raise ValueError(f"FedPer needs personal_layers >= 1, got {personal_layers}")
        self.personal_layers = int(personal_layers)
        self.head: np.ndarray | None = None   # client: its personal head (float32), once trained
        self._mask: np.ndarray | None = None

    def hyperparameters(self) -> dict:
        """``{"personal_layers": ...}`` for the model bundle's metadata."""
        return {"personal_layers": self.personal_layers}

    def _state_length(self, name, dim):
        return None  # the head: the personal coordinates only

    def mask(self, model: nn.Module) -> np.ndarray:
        """The bool mask (dim,) of the personal head's coordinates in the flat parameter vector (computed once)."""
        if self._mask is None:
            self._mask = personal_mask(model, self.personal_layers)
        return self._mask

    def personalised(self, model: nn.Module, global_vec: np.ndarray) -> np.ndarray:
        """The global base with this client's head (the global head until it has trained one)."""
        vec = np.asarray(global_vec, dtype=np.float32).copy()
        if self.head is not None:
            vec[self.mask(model)] = self.head
        return vec

    def client_update(self, model, global_vec, X, y, cfg, rng, extras=None):
        """Train from the global body with this client's own head; the head's part of the update is kept here
        (its coordinates are sent as zeros), the body's delta goes to the server.
        """
        start = self.personalised(model, global_vec)
        upd = super().client_update(model, start, X, y, cfg, rng, extras)
        mask = self.mask(model)
        delta, weight = upd.parts["model"]
        self.head = (start[mask].astype(np.float64) + delta[mask]).astype(np.float32)
        delta = delta.copy()
        delta[mask] = 0.0  # the head stays here
        upd.parts["model"] = (delta, weight)
        return upd

    def eval_vector(self, model, global_vec, extras, X, y):
        """The global body with this client's personal head."""
        return self.personalised(model, global_vec)
