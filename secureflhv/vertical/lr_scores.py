"""Vertical LR prediction in arbiter mode: the guest gets each row's total score, no host's part in the clear.

With an arbiter (the data-less key holder of ``mode="arbiter"``), prediction keeps the training's
promise that host values reach the guest only encrypted. For every prediction request of k rows
(:mod:`secureflhv.vertical.prediction` sends the row indices to the hosts; the guest asks for at most
``batch_size`` rows at a time, so every party's work between two messages is that of a training batch
and the job's deadline fits)::

    arbiter -> guest, hosts : public key pk                      (once; a fresh key pair, or the training one)
    host h  -> guest        : [[u_h]] = Enc_pk(X_h[rows] w_h)    (k,)  at exponent -precision_bits
                              (two or more hosts: [[enc(u_h) + m_h]], zero-sum masks over the hosts keyed by
                              the host's request counter and the row index, :mod:`.host_masks`)
    guest                   : [[s]] = sum_h [[u_h]] + (X_g[rows] w_g + b)
    guest   -> arbiter      : [[s + r]]   r fresh per row, uniform in Z_n (OU: statistical, 2^40 wider)
    arbiter -> guest        : s + r mod n                         guest removes r -> s (float64, (k,))
    guest   -> arbiter      : stop                                (:meth:`ScoreGuest.end_score_service`)

Tags ``vlr.pred_key`` (PaillierPublicKey), ``vlr.pred_enc`` (EncryptedTensor), ``vlr.pred_dec`` (Bundle:
``encrypted["s"]``, or ``scalars["stop"]``), ``vlr.pred_total`` (MaskedValues); round = the guest's request
counter, the same at every party.

Numbers: every u_h and the guest's part are rounded to p = ``precision_bits`` fraction bits, so
the total differs from the float64 sum by at most (hosts + 1) * 2**-(p + 1) (~1e-12 for one host at p = 40), the
probability by a quarter of that. Encoding is deterministic: the same rows give bit-identical scores
in a training job's held-out prediction and in a later prediction job with the same bundles.

Validation: the guest takes each [[u_h]] only at exactly (k,), the agreed exponent, under the arbiter's
key (fingerprint) with every ciphertext in Z*_{n^2}; the arbiter takes [[s + r]] only at shape (k,) with
1 <= k <= ``max_rows``, the agreed exponent and its own key; the guest takes the arbiter's answer only at
(k,), its key, every value in Z_n; every party takes the key only from the arbiter, at or above the job's
minimum size. Anything else is a :class:`~secureflhv.transport.ProtocolError` in the parse callback:
rejected, logged, and the receiver keeps waiting until its deadline, which then names the peer.

What each role learns (semi-honest, the arbiter does not collude with the guest: docs/security.md):
    guest: the total score s_i of every row it asks about, hence sum_h u_h,i (with one host that is the
        host's u_h,i itself: inherent to the guest learning the score). With several hosts, no single
        host's u_h: each arrives encrypted under a key it does not hold, and masked so that a guest asking
        the arbiter to decrypt one host's part (or parts of different rows) gets noise.
    host: the row indices asked about and the public key; nothing about the guest, other hosts or scores.
    arbiter: the number of requests and rows per request; each value it decrypts carries a fresh
        uniform mask (Paillier; OU: statistically hiding), so nothing about scores, weights or data.
"""
from __future__ import annotations

from functools import reduce

import numpy as np

from ..proto import messages_pb2
from ..transport import ProtocolError, parse_message
from .host_masks import encrypt_masked

TAG_PRED_KEY = "vlr.pred_key"
TAG_PRED_ENC = "vlr.pred_enc"
TAG_PRED_DEC = "vlr.pred_dec"
TAG_PRED_TOTAL = "vlr.pred_total"
_STOP = "stop"  # what the arbiter's parser returns for the guest's stop message


class _ScoreKey:
    """The arbiter's prediction key, received once from the arbiter (mixin of a vertical LR role)."""

    _score_pub = None

    def _score_key(self):
        if self._score_pub is None:
            self._score_pub = self.t.recv(self.arbiter_id, TAG_PRED_KEY, round=0,
                                          parse=self._pubkey_parser())
        return self._score_pub


class ScoreGuest(_ScoreKey):
    """Guest side (mixin of :class:`~secureflhv.vertical.lr.VerticalLRGuest`): needs ``host_ids``,
    ``arbiter_id`` and the :class:`~secureflhv.vertical.common.VerticalRole` helpers."""

    def _encrypted_total(self, own: np.ndarray, rnd: int) -> np.ndarray:
        """float64 (k,) total scores: own (k,) plus every host's encrypted part, decrypted masked."""
        pub, k, e = self._score_key(), own.shape[0], self._exponent()
        parts = [self.t.recv(h, TAG_PRED_ENC, round=rnd,
                             parse=self._enc_parser(pub, (k,), f"{TAG_PRED_ENC} from {h}", e)) for h in self.host_ids]
        masked, mask = self.he.mask(pub, reduce(lambda a, b: a + b, parts) + own)
        msg = messages_pb2.Bundle()
        msg.encrypted["s"].CopyFrom(self.wire.to_proto(masked))
        self.t.send(self.arbiter_id, TAG_PRED_DEC, msg, round=rnd)
        return self._take_decrypted(pub, mask, self.arbiter_id, TAG_PRED_TOTAL, rnd, (k,))

    def end_score_service(self, rnd: int) -> None:
        """Tell the arbiter to leave :meth:`ScoreArbiter.serve_scores` (round ``rnd``: the guest's last)."""
        self.t.send(self.arbiter_id, TAG_PRED_DEC, messages_pb2.Bundle(scalars={"stop": 1.0}), round=rnd)


class ScoreHost(_ScoreKey):
    """Host side: its partial scores go to the guest only encrypted under the arbiter's key."""

    def _send_encrypted_scores(self, u: np.ndarray, rnd: int, masks: list[int] | None = None) -> None:
        """Send [[u]] (k,), or with ``masks`` (two or more hosts) [[enc(u) + masks]]: zero-sum over the
        hosts (:mod:`~secureflhv.vertical.host_masks`), so only the guest's total decrypts to scores."""
        pub = self._score_key()
        enc = self.he.encrypt(pub, u) if masks is None else encrypt_masked(self.he, pub, u, masks)
        self.t.send(self.guest_id, TAG_PRED_ENC, self.wire.to_proto(enc), round=rnd)


class ScoreArbiter:
    """Arbiter side (mixin of :class:`~secureflhv.vertical.lr.VerticalLRArbiter`)."""

    def serve_scores(self, max_rows: int, keypair=None, idle_s: float | None = None) -> int:
        """Decrypt the guest's masked total scores until it stops.

        Args:
            max_rows: most rows per request (a larger request is rejected as a lie).
            keypair: (public, private) to use (default: a fresh one of ``config.key_bits``).
            idle_s: wait this long for the next request while the guest is reachable (an online service idles
                between requests; :meth:`Transport.recv_while_reachable`); default: the transport deadline.
        Returns: number of requests served. Raises PeerTimeout when the guest goes silent.
        """
        return self._guarded(self._serve_scores, int(max_rows), keypair, idle_s)

    def _serve_scores(self, max_rows: int, keypair, idle_s=None) -> int:
        cfg, t = self.config, self.t
        pub, priv = keypair or self.he.generate_keypair(cfg.key_bits, cfg.insecure_test_key)
        key = self.wire.public_key_to_proto(pub)
        for p in [self.guest_id] + self.host_ids:
            t.send(p, TAG_PRED_KEY, key, round=0)
        parse = self._score_request_parser(pub, max_rows)
        served = rnd = 0
        while True:
            rnd += 1
            if idle_s is None:
                enc = t.recv(self.guest_id, TAG_PRED_DEC, round=rnd, parse=parse)
            else:
                enc = t.recv_while_reachable(self.guest_id, TAG_PRED_DEC, round=rnd, timeout=idle_s, parse=parse)
            if isinstance(enc, str) and enc == _STOP:
                return served
            self._send_decrypted(priv, enc, self.guest_id, TAG_PRED_TOTAL, rnd)
            served += 1

    def _score_request_parser(self, pub, max_rows: int):
        e, what = self._exponent(), f"{TAG_PRED_DEC} from {self.guest_id}"

        def validate(m: messages_pb2.Bundle):
            if set(m.scalars) == {"stop"} and not m.encrypted and not m.tensors:
                return _STOP
            if set(m.encrypted) != {"s"} or m.scalars or m.tensors:
                raise ProtocolError(f"{what}: needs encrypted 's' or scalar 'stop' only")
            shape = list(m.encrypted["s"].shape)
            if len(shape) != 1 or not 1 <= shape[0] <= max_rows:
                raise ProtocolError(f"{what}: shape {shape}, expected (k,) with 1 <= k <= {max_rows}")
            return self.wire.from_proto(m.encrypted["s"], pub, (shape[0],), what, exponent=e)

        return parse_message(messages_pb2.Bundle, validate)
