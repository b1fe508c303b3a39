"""A vertical model's prediction roles at one party, built once from its bundle and kept warm for serving.

The batch prediction job (:mod:`secureflhv.runtime.algorithms.predict`) and the online service
(:mod:`.federation`) score with the same roles and the same exchange, so served scores equal the batch
job's bit for bit. Per family (docs/serving.md says what each role learns):

* ``vertical_lr``: the guest adds the hosts' partial scores ``X_h w_h`` (arbiter mode: encrypted under the
  server's key and decrypted masked, :mod:`secureflhv.vertical.lr_scores`); one request per ``batch_size``
  rows in arbiter mode, one in all in two-party mode;
* ``secureboost_vertical``: the guest routes the rows through the trees, asking the owning host for a
  left/right bit per row at each of its splits (one round trip per level), then releases the hosts;
* ``vertical_nn``: the hosts' bottom-model outputs through the Paillier interactive layer, one request per
  ``predict_batch_size`` rows; each host's key pair is made once, when the service starts.

A host answers exactly the requests the guest's role makes for m rows (:attr:`HostScoring.requests`), computed
from the bundle's config, never from the guest's word; SecureBoost's hosts answer until the guest's stop.
"""
from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...transport import Transport
from ..algorithms.predict import (lr_role, model_arbiter, model_hosts, model_inputs, secureboost_role,
                                  split_nn_role)
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..store.model_bundle import ModelBundle

SERVABLE = ("vertical_lr", "secureboost_vertical", "vertical_nn")
# What a role keeps between requests that belongs to the serving session, not to the model: request counters
# (each peer's mailbox has seen them), the LR arbiter's score key, split NN's interactive-layer key pairs.
SESSION = ("_pred_round", "_route_round", "_score_pub", "_keys", "public_key", "_priv")


def fingerprint(bundle: ModelBundle) -> str:
    """The federation's name for a model: algorithm, training job id and the shared config, hashed (16 hex).
    Every party's bundle of one training run gives the same value (their files differ, their config does not)."""
    doc = json.dumps([bundle.algorithm, bundle.job_id, bundle.manifest.get("config")], sort_keys=True, default=str)
    return hashlib.sha256(doc.encode("utf-8")).hexdigest()[:16]


def input_columns(bundle: ModelBundle) -> list[str]:
    """The raw feature columns the bundle's preprocessing takes, in order (what a feature store must hold)."""
    state = bundle.manifest.get("preprocessing") or {}
    return list(state.get("input_features") or bundle.feature_names)


class Precomputer:
    """Between two steps, tops up the Paillier obfuscators (h_s^alpha, DJN) of the public keys a role encrypts
    under per request (the LR server's score key; a split NN guest's hosts' keys) to ``count`` each, in one
    background thread (:meth:`PublicEngine.precompute`): the next request's encryptions then cost a
    multiplication each. Ciphertexts stay fresh (each obfuscator is used once); answers do not change."""

    def __init__(self, count: int):
        self.count = int(count)
        self._busy = threading.Lock()

    @staticmethod
    def keys(role) -> list:
        """The Paillier public keys ``role`` encrypts under per request."""
        from ...crypto.homomorphic.paillier import PublicKey

        state = getattr(role, "__dict__", {})
        found = [state.get("_score_pub"), *(state.get("_keys") or {}).values()]
        return [k for k in found if isinstance(k, PublicKey)]

    def top_up(self, role) -> None:
        """Start topping up ``role``'s keys unless a top-up still runs."""
        keys = self.keys(role)
        if not keys or not self._busy.acquire(blocking=False):
            return

        def work() -> None:
            from ...crypto.homomorphic.paillier_engine import public_engine
            try:
                for key in keys:
                    public_engine(key.n).precompute(self.count)
            finally:
                self._busy.release()

        threading.Thread(target=work, name="paillier-precompute", daemon=True).start()


def carry_session(old, new) -> None:
    """Give the role ``new`` (a swapped-in model) the serving session of ``old``: :data:`SESSION` attributes it
    has, so the next request continues the same rounds under the same keys (no new handshake)."""
    for name in SESSION:
        if name in vars(old):
            setattr(new, name, getattr(old, name))


@dataclass
class GuestScoring:
    """The guest's side: ``score(X_raw)`` -> scores (m,) or (m, K) for m rows of raw guest features."""

    bundle: ModelBundle
    role: object
    predict: Callable[[np.ndarray], np.ndarray]
    finish: Callable[[], None]   # after each request (SecureBoost: release the hosts' routing loop)
    close: Callable[[], None]    # at shutdown (LR arbiter mode: release the server)

    def score(self, X_raw: np.ndarray) -> np.ndarray:
        """Scores of the rows X_raw (m, d_g raw inputs; NaN = missing); ValueError for a wrong width."""
        out = self.predict(model_inputs(np.asarray(X_raw, dtype=np.float64), self.bundle))
        self.finish()
        return out


@dataclass
class HostScoring:
    """A host's side: ``answer(X_raw)`` serves the guest's requests for those m rows of raw host features."""

    bundle: ModelBundle
    role: object
    requests: Callable[[int], int | None]   # requests the guest makes for m rows (None: until it stops)

    def answer(self, X_raw: np.ndarray) -> int:
        """Serve the guest's requests for the rows X_raw (m, d_h raw; NaN rows for unknown ids); returns how
        many were answered. PeerTimeout when the guest goes silent."""
        X = model_inputs(np.asarray(X_raw, dtype=np.float64), self.bundle)
        return self.role.serve_predictions(X, max_requests=self.requests(len(X)))


def _lr(cfg: JobConfig, party: PartySpec, t: Transport, bundle: ModelBundle, max_rows: int):
    from ...vertical.lr import VerticalLRArbiter, VerticalLRConfig

    config, arbiter = VerticalLRConfig(**bundle.config), model_arbiter(bundle)
    if party.role == "server":
        role = VerticalLRArbiter(t, cfg.guest.id, model_hosts(bundle), config)
        return role, lambda idle_s: role.serve_predictions(max_rows=max_rows * _classes(bundle, config), idle_s=idle_s)
    role = lr_role(cfg, party, t, bundle)
    if party.role == "guest":
        return GuestScoring(bundle, role, role.predict_proba, lambda: None, role.end_prediction)
    k = _classes(bundle, config)

    def requests(m: int) -> int:  # the guest's request count for m rows (VerticalLRGuest._predict / _encrypted_scores)
        return 1 if arbiter is None else math.ceil(m / max((config.batch_size or m) // k, 1))

    return HostScoring(bundle, role, requests)


def _classes(bundle: ModelBundle, config) -> int:
    """Scores per row: K for a multiclass model (from its weights; the server's config-only bundle: extra)."""
    if config.task != "multiclass":
        return 1
    w = np.asarray(bundle.file("weights.npy")) if "weights.npy" in bundle.files else None
    return int(w.shape[1]) if w is not None and w.ndim == 2 else int(bundle.extra.get("n_classes") or 1)


def _secureboost(cfg: JobConfig, party: PartySpec, t: Transport, bundle: ModelBundle):
    from ...tree.params import transform

    role = secureboost_role(cfg, party, t, bundle, len(bundle.feature_names))
    if party.role == "host":
        return HostScoring(bundle, role, lambda m: None)
    return GuestScoring(bundle, role, lambda X: transform(role.predict_margin(X), role.model.params),
                        role.end_prediction, lambda: None)


def _split_nn(cfg: JobConfig, party: PartySpec, t: Transport, bundle: ModelBundle, session_from=None):
    one_row = np.zeros((1, len(bundle.feature_names)))  # the setup's row count: the rows come per request
    role = split_nn_role(cfg, party, t, bundle, one_row)
    _start(role, session_from)
    if party.role == "host":
        return HostScoring(bundle, role, lambda m: math.ceil(m / role.config.predict_batch_size))
    return GuestScoring(bundle, role, role.predict_proba, lambda: None, role.end_prediction)


def _start(role, session_from) -> None:
    """Split NN: the setup and key exchange, once per session (a swapped-in model keeps the session's keys)."""
    if session_from is None:
        role.start_prediction()


def build_scoring(cfg: JobConfig, party: PartySpec, t: Transport, bundle: ModelBundle, *, max_rows: int,
                  session_from=None):
    """This party's warm roles for ``bundle`` (a guest: :class:`GuestScoring`; a host: :class:`HostScoring`; an
    LR arbiter: (role, serve callable)). ``max_rows``: the most rows of one request; ``session_from``: the role
    of the model being replaced (hot swap: its session continues, :func:`carry_session`). JobConfigError for a
    bundle that cannot be served or does not fit the job (naming ``params.model_dir``)."""
    where = f"params.model_dir (party {party.id!r}): {bundle.path}"
    if bundle.algorithm not in SERVABLE:
        raise JobConfigError(f"{where}: a {bundle.algorithm!r} model is not served online (vertical models only: "
                             f"{', '.join(SERVABLE)}); score it with the predict job or secureflhv.load_model")
    try:
        if bundle.algorithm == "vertical_lr":
            built = _lr(cfg, party, t, bundle, max_rows)
        elif bundle.algorithm == "secureboost_vertical":
            built = _secureboost(cfg, party, t, bundle)
        else:
            built = _split_nn(cfg, party, t, bundle, session_from)
    except (ValueError, KeyError, TypeError) as exc:
        raise JobConfigError(f"{where}: {exc}") from None
    if session_from is not None:
        carry_session(session_from, built.role)
    return built
