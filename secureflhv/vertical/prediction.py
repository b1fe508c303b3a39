"""Federated prediction shared by the vertical families (logistic regression, split NN).

The guest holds the labels' side of the model, every host its own features and its share of the
model; a prediction set is aligned row by row across parties (PSI) like the training set. The guest
asks for rows by index, each host answers for exactly those rows, the guest combines::

    guest -> hosts   RowsRequest(n_rows, rows)   round = the guest's prediction counter
    hosts -> guest   the algorithm's answer      (LR: the partial scores X_h[rows] @ w_h,
                                                  encrypted in arbiter mode: lr_scores;
                                                  split NN: the interactive-layer exchange)
    guest -> hosts   RowsRequest(stop=True)      (:meth:`PredictionGuest.end_prediction`)

What a host learns: which row indices the guest asks about, nothing else (the answer is computed
from its own data). What the guest learns: each algorithm's answer (documented there).

Errors: a request for another number of rows or an index out of range is rejected
(ProtocolError in the parse callback, logged; the host keeps waiting); a silent guest makes the
host's wait end with PeerTimeout.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Sequence

import numpy as np

from ..proto import messages_pb2
from ..transport import ProtocolError, parse_message
from ..data.dataset import check_matrix
from .common import VerticalRole


class _PredictionRole(VerticalRole):
    """What both prediction sides share: the request tag, the round counter, the feature check."""

    pred_request_tag: str
    _pred_round = 0  # prediction rounds so far (per instance once incremented)

    @staticmethod
    def _prediction_features(X, n_features: int) -> np.ndarray:
        """Checked float64 (m, n_features) prediction features; ValueError for a wrong feature count."""
        X = check_matrix(X, "X")
        if X.shape[1] != n_features:
            raise ValueError(f"X: {X.shape[1]} features, the model has {n_features}")
        return X


class PredictionGuest(_PredictionRole):
    """Guest side: row selection, requests, and ending the hosts' service.

    Subclasses set ``pred_request_tag`` and have ``host_ids``; ``_pred_round`` counts requests.
    """

    def _prediction_rows(self, X, n_features: int, rows: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
        """Checked (X, selected row indices); ValueError for a wrong feature count or index."""
        X = self._prediction_features(X, n_features)
        m = X.shape[0]
        sel = np.arange(m) if rows is None else np.asarray(rows, dtype=np.int64)
        if sel.size and (sel.min() < 0 or sel.max() >= m):
            raise ValueError(f"rows: indices must be in [0, {m})")
        return X, sel

    def _request_rows(self, n_rows: int, rows: list[int]) -> int:
        """Ask every host for ``rows`` of its ``n_rows`` prediction rows (empty: all); returns the round."""
        self._pred_round += 1
        req = messages_pb2.RowsRequest(n_rows=n_rows, rows=rows)
        for h in self.host_ids:
            self.t.send(h, self.pred_request_tag, req, round=self._pred_round)
        return self._pred_round

    def end_prediction(self) -> None:
        """Tell the hosts to leave ``serve_predictions``."""
        self._pred_round += 1
        for h in self.host_ids:
            self.t.send(h, self.pred_request_tag, messages_pb2.RowsRequest(stop=True), round=self._pred_round)


class PredictionHost(_PredictionRole):
    """Host side: answer the guest's row requests until it ends prediction.

    Subclasses set ``pred_request_tag``, have ``guest_id``, and implement :meth:`_prediction_matrix`
    (usually with :meth:`_prediction_features`) and :meth:`_answer`; ``max_request_rows`` (None: an
    empty request means all rows) bounds a request.
    """

    @property
    def max_request_rows(self) -> int | None:
        """Most rows per request (None: no bound, and an empty request means all rows)."""
        return None

    def serve_predictions(self, X, max_requests: int | None = None) -> int:
        """Answer the guest's prediction requests until it ends prediction.

        Args:
            X: float64 (m, d_h) features of the prediction set, aligned with the guest's.
            max_requests: return after this many requests (default: until the guest's ``end_prediction``).
        Returns: number of requests answered. Raises PeerTimeout when the guest goes silent.
        """
        return self._guarded(self._serve, X, max_requests)

    @abstractmethod
    def _prediction_matrix(self, X) -> np.ndarray:
        """The checked prediction features (ValueError / RuntimeError before any request is served)."""

    @abstractmethod
    def _answer(self, X: np.ndarray, rows: np.ndarray, rnd: int) -> None:
        """Send the answer for ``rows`` of X to the guest (request round ``rnd``)."""

    def _recv_request(self, rnd: int, parse):
        return self.t.recv(self.guest_id, self.pred_request_tag, round=rnd, parse=parse)

    def _request_parser(self, m: int):
        cap = self.max_request_rows

        def validate(req: messages_pb2.RowsRequest):
            if req.stop:
                return req
            if req.n_rows != m:
                raise ProtocolError(f"prediction request for {req.n_rows} rows, this host holds {m}")
            if any(r >= m for r in req.rows) or (cap is not None and not 0 < len(req.rows) <= cap):
                need = "row indices" if cap is None else f"1..{cap} row indices"
                raise ProtocolError(f"prediction request: need {need} in [0, {m})")
            return req

        return parse_message(messages_pb2.RowsRequest, validate)

    def _serve(self, X, max_requests):
        X = self._prediction_matrix(X)
        m = X.shape[0]
        parse = self._request_parser(m)
        served = 0
        while max_requests is None or served < max_requests:
            self._pred_round += 1
            req = self._recv_request(self._pred_round, parse)
            if req.stop:
                break
            rows = np.asarray(req.rows, dtype=np.int64) if len(req.rows) else np.arange(m)
            self._answer(X, rows, self._pred_round)
            served += 1
        return served
