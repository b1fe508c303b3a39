"""IFCA, the Iterative Federated Clustering Algorithm (Ghosh, Chung, Yin, Ramchandran, "An Efficient
Framework for Clustered Federated Learning", NeurIPS 2020, Alg. 1 with model averaging), under secure
aggregation.

The server keeps k cluster models θ_1..θ_k (differently initialised). Each round every selected client
i receives all k, estimates its cluster ĵ_i = argmin_j F_i(θ_j) (its mean training loss; ties go to the
lowest j), runs local SGD from θ_ĵ, and the server sets, for every cluster j that some client chose,
θ_j ← Σ_i s_ij θ̃_i / Σ_i s_ij (s_ij = 1 if i chose j, else 0 — the paper's unweighted average over the
cluster's clients); a cluster nobody chose keeps its model.

**Secure form.** The client sends its update Δ_i = θ̃_i − θ_ĵ to *every* one of the k aggregations
(parts ``cluster0``..``cluster{k-1}``): Δ_i with weight 1 to its own cluster, zeros with weight 0 to
the others. Secure aggregation masks every input, so each of the server's k inputs from a client is a
uniformly random word vector of the same size whatever the choice; the server learns each cluster's
sum Σ_i s_ij Δ_i and count Σ_i s_ij — not who chose which. (Weighting by sample counts n_i would let a
server that knows the n_i solve the subset sums; the paper's indicator weights reveal only the
cluster sizes.) ``train_n`` in ``fl.metrics`` is the same whichever cluster a client picks.

What each role learns, beyond the FedAvg family: the server learns the k cluster sums and sizes; a
client learns all k cluster models. The global model the FL server reports and saves is the cluster
with the most clients in the last round; each client evaluates the cluster model with its lowest
training loss.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .models import get_flat, set_flat
from .strategies import ClientUpdate, Strategy


def cluster_part(j: int) -> str:
    """The aggregation part (and checkpoint array) name of cluster ``j``: ``cluster<j>``."""
    return f"cluster{j}"


class IFCA(Strategy):
    """IFCA with ``k`` clusters (see the module docstring). Raises ValueError for k < 2."""

    name = "ifca"
    zero_weight_parts = True    # a cluster nobody chose sums to zeros with weight 0
    sample_weighted_parts = ()  # indicator weights (the paper's average): contribution factors do not apply

    def __init__(self, k: int = 2):
        if int(k) != k or k < 2:
            raise ValueError(f"IFCA needs k >= 2 clusters, got {k}")
        self.k = int(k)
        self.parts = tuple(cluster_part(j) for j in range(self.k))
        self.n_models = self.k
        self.clusters: list[np.ndarray] = []   # server: θ_j (float32)
        self.choice: int | None = None          # client: ĵ of the last round (never sent)

    def hyperparameters(self) -> dict:
        """``{"clusters": k}`` for the model bundle's metadata."""
        return {"clusters": self.k}

    def state_arrays(self):
        """Server: the k cluster models ``cluster<j>`` (a client's choice is made afresh every round)."""
        return {cluster_part(j): np.asarray(v) for j, v in enumerate(self.clusters)}

    def load_state(self, arrays, dim):
        """Restore the k cluster models from a checkpoint (server; a client has none). ValueError when the
        checkpoint does not hold exactly ``cluster0 .. cluster<k-1>``.
        """
        want = {cluster_part(j) for j in range(self.k)}
        if not arrays:  # a client: nothing carries over
            return
        if set(arrays) != want:
            raise ValueError(f"checkpoint: IFCA needs {sorted(want)}, found {sorted(arrays)}")
        self.state_names = tuple(sorted(want))
        super().load_state(arrays, dim)
        self.clusters = [np.array(arrays[cluster_part(j)]) for j in range(self.k)]

    def part_dims(self, dim):
        """One part of ``dim`` coordinates per cluster."""
        return {p: dim for p in self.parts}

    # ---------------------------------------------------------------- server half
    def server_init(self, dim, initial=None):
        """Take the k initial cluster models (float32 (dim,) each); ValueError for another count."""
        if initial is None or len(initial) != self.k:
            raise ValueError(f"IFCA needs {self.k} initial models, got {0 if initial is None else len(initial)}")
        self.clusters = [np.asarray(v, dtype=np.float32).copy() for v in initial]

    def broadcast(self):
        """The k cluster models, one part each, sent with the global model."""
        return {p: v for p, v in zip(self.parts, self.clusters)}

    eval_extras = broadcast

    def server_update(self, global_vec, results):
        """Average each chosen cluster's deltas into it (the paper's unweighted mean over the clients that chose
        it; a cluster nobody chose stays); returns the most chosen cluster as the global model.
        """
        sizes = []
        for j, part in enumerate(self.parts):
            res = results[part]
            sizes.append(res.weight)
            if res.weight > 0.5:  # at least one client chose j (weights are 0/1 counts)
                self.clusters[j] = (self.clusters[j].astype(np.float64) + res.total / res.weight).astype(np.float32)
        return self.clusters[int(np.argmax(sizes))].copy()

    # ---------------------------------------------------------------- client half
    def _models(self, extras) -> list[np.ndarray]:
        missing = [p for p in self.parts if extras is None or p not in extras]
        if missing:
            raise ValueError(f"IFCA needs every cluster model with the global model; missing {missing}")
        return [np.asarray(extras[p], dtype=np.float32) for p in self.parts]

    def choose(self, model: nn.Module, models: list[np.ndarray], X: np.ndarray, y: np.ndarray) -> int:
        """ĵ = argmin_j mean loss of θ_j on (X, y) (Ghosh et al., Alg. 1, cluster estimation; the user's
        ``evaluate`` when the job names one)."""
        losses = []
        for vec in models:
            set_flat(model, vec)
            losses.append(self.evaluate_rows(model, X, y)["loss"])
        return int(np.argmin(losses))

    def client_update(self, model, global_vec, X, y, cfg, rng, extras=None):
        """Pick the cluster of least loss on the local data (never sent), train it, and send its delta with
        weight 1 in that cluster's part and zeros with weight 0 in the others.
        """
        models = self._models(extras)
        j = self.choice = self.choose(model, models, X, y)
        set_flat(model, models[j])
        steps, loss = self.local_train(model, X, y, cfg, rng)
        delta = get_flat(model).astype(np.float64) - models[j].astype(np.float64)
        zeros = np.zeros_like(delta)
        parts = {p: (delta, 1.0) if i == j else (zeros, 0.0) for i, p in enumerate(self.parts)}
        return ClientUpdate(parts, len(y), steps, loss)

    @torch.no_grad()
    def eval_vector(self, model, global_vec, extras, X, y):
        """The cluster model this client would choose on ``X, y`` (the global model when no clusters came)."""
        if not extras:
            return global_vec
        models = self._models(extras)
        return models[self.choose(model, models, X, y)]
