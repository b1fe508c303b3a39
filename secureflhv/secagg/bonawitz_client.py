"""Client role of secure aggregation (Bonawitz et al., CCS 2017, Fig. 4/5; see :mod:`.bonawitz`).

:meth:`SecAggClient.submit` runs the client's rounds in order, one method per stage of the paper:
:meth:`~SecAggClient.advertise_keys`, :meth:`~SecAggClient.share_keys`,
:meth:`~SecAggClient.masked_input_collection`, :meth:`~SecAggClient.consistency_check`,
:meth:`~SecAggClient.unmasking`. What the client reveals: its public keys, t-1 or fewer shares of its
secrets to each other client, its masked input y_u, and (only when listed among the survivors U3)
shares of b_v for v ∈ U3 and of s_v^SK for v ∈ U2 \\ U3 — never both for one v.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..crypto import shamir
from ..crypto.quantise import QuantParams, quantise, rounding_rng
from ..crypto.secagg_primitives import (InvalidTag, KeyPair, SigningKey, decrypt_share, encrypt_share, new_seed,
                                        private_to_int, prg, share_ad, verify_signature)
from ..proto import secagg_pb2 as pb
from ..transport.base import PeerTimeout, ProtocolError, TransportError, parse_message
from ..transport.codec import tensor_to_proto
from .bonawitz import (SHARE_PLAINTEXT, STAGE_NAMES, TAG_ADVERTISE, TAG_MASKED, TAG_SHARE, TAG_SIGN, TAG_UNMASK,
                       PeerKeys, advert_bytes, mask_seed, share_key, share_points, survivors_bytes)
from .config import AggregationConfig
from .exchange import STAGES, TAG_SERVER, check_participants, round_check
from .result import AggregationError
from .roles import AggregationClient

log = logging.getLogger("secureflhv.secagg.bonawitz")


class _Vanished(Exception):
    """Test hook: raised by :meth:`SecAggClient._on_stage` overrides to simulate a crash."""


@dataclass
class _HeldShares:
    """This client's Shamir shares of another client v's secrets: of b_v and of s_v^SK."""

    b: int
    s: int


@dataclass
class _ClientRound:
    """One client's state of one round (paper notation: U1 advertised keys, U2 shared, U3 survived)."""

    round_id: int
    parts: list[str]
    t: int
    qp: QuantParams
    words: np.ndarray | None            # quantised x_u (with weight and clipped count), until masked
    points: dict[str, int]               # Shamir x-coordinate per participant
    ck: KeyPair = field(default_factory=KeyPair)          # (c_u^PK, c_u^SK): share encryption
    sk: KeyPair = field(default_factory=KeyPair)          # (s_u^PK, s_u^SK): pairwise masks
    signer: SigningKey | None = None
    keys: dict[str, PeerKeys] = field(default_factory=dict)   # U1's public keys
    b_seed: bytes = b""                                   # self-mask seed b_u
    held: dict[str, _HeldShares] = field(default_factory=dict)
    u2: set[str] = field(default_factory=set)
    u3: list[str] = field(default_factory=list)


class SecAggClient(AggregationClient):
    """Client role of Bonawitz et al. Fig. 4 (see :mod:`.bonawitz` for what it reveals).

    ``submit`` raises :class:`AggregationError` when the server aborts the round, stops answering, or
    breaks the protocol (too few survivors, a second unmask request, bad signatures).

    Attributes:
        rejected: (stage, reason) of every input this client refused (e.g. a share failing AES-GCM).
        included: whether the server listed this client among the survivors of the last round.
    """

    def __init__(self, transport, server_id: str, config: AggregationConfig):
        super().__init__(transport, server_id, config)
        self.rejected: list[tuple[str, str]] = []
        self.included = False
        self._unmasked_rounds: set[int] = set()

    def submit(self, round_id: int, participants: Sequence[str], vector: np.ndarray, weight: float) -> None:
        """Run the client side of one round. ``vector``: float (d,); ``weight``: in (0, max_weight]."""
        cfg, me = self.config, self.party_id
        parts = check_participants(participants, me)
        x = np.asarray(vector, dtype=np.float64).ravel()
        qp = cfg.quant_params(len(parts), x.size)
        words, self.last_n_clipped = quantise(x, weight, qp, rounding_rng(cfg.seed, round_id, me), me)
        self.included = False
        rnd = _ClientRound(round_id, parts, cfg.resolve_threshold(len(parts)), qp, words, share_points(parts))
        self.advertise_keys(rnd)
        self.share_keys(rnd)
        self.masked_input_collection(rnd)
        if self.consistency_check(rnd):
            self.unmasking(rnd)

    # ------------------------------------------------------------------------------ stages
    def advertise_keys(self, rnd: _ClientRound) -> None:
        """Stage 0: send c_u^PK, s_u^PK (signed with a fresh Ed25519 key when consistency_check is on)."""
        if self.config.consistency_check:
            rnd.signer = SigningKey()
        adv = pb.AdvertiseKeys(round_id=rnd.round_id, c_pk=rnd.ck.public, s_pk=rnd.sk.public)
        if rnd.signer is not None:
            adv.signing_pk = rnd.signer.public
            adv.signature = rnd.signer.sign(advert_bytes(self.t.job_id, rnd.round_id, self.party_id,
                                                         rnd.ck.public, rnd.sk.public))
        self._send(rnd.round_id, 0, TAG_ADVERTISE, adv)

    def share_keys(self, rnd: _ClientRound) -> None:
        """Stage 1: check U1's key list; Shamir-share b_u and s_u^SK t-of-|U1|; send each v its pair, AES-GCM."""
        me, job = self.party_id, self.t.job_id
        rnd.keys = self._check_keys(self._from_server(rnd.round_id, 1, "keys"), rnd)
        u1 = sorted(rnd.keys)
        rnd.b_seed = new_seed()
        b_sh = shamir.split(int.from_bytes(rnd.b_seed, "big"), [rnd.points[v] for v in u1], rnd.t)
        s_sh = shamir.split(private_to_int(rnd.sk.private), [rnd.points[v] for v in u1], rnd.t)
        rnd.held = {me: _HeldShares(b_sh[rnd.points[me]], s_sh[rnd.points[me]])}
        out = pb.ShareKeys(round_id=rnd.round_id)
        for v in u1:
            if v == me:
                continue
            key = share_key(rnd.ck.private, rnd.keys[v].c_pk, job, rnd.round_id, me, v)
            plain = shamir.to_bytes(b_sh[rnd.points[v]]) + shamir.to_bytes(s_sh[rnd.points[v]])
            nonce, ct = encrypt_share(key, plain, share_ad(job, rnd.round_id, me, v))
            out.shares.add(sender=me, recipient=v, nonce=nonce, ciphertext=ct)
        self._send(rnd.round_id, 1, TAG_SHARE, out)

    def masked_input_collection(self, rnd: _ClientRound) -> None:
        """Stage 2: keep the shares addressed to us (U2 = who shared); send y_u = x_u + PRG(b_u) ± PRG(s_uv)."""
        self._receive_shares(rnd, self._from_server(rnd.round_id, 2, "shares"))
        if len(rnd.u2) < rnd.t:
            raise AggregationError(f"{self.party_id}: only {len(rnd.u2)} clients shared keys (U2), "
                                   f"fewer than t={rnd.t}")
        y = self._mask(rnd)
        rnd.words = None
        self._send(rnd.round_id, 2, TAG_MASKED, pb.MaskedInput(round_id=rnd.round_id, k_bits=rnd.qp.k_bits,
                                                               y=tensor_to_proto(y)))

    def consistency_check(self, rnd: _ClientRound) -> bool:
        """Stage 3: check the survivor list U3; sign it and verify >= t signatures when the check is on.

        Returns whether this client is among the survivors (a dropped one stops here, unmasking nothing).
        """
        me, t, job = self.party_id, rnd.t, self.t.job_id
        rnd.u3 = u3 = list(self._from_server(rnd.round_id, 3, "survivors").clients)
        if len(set(u3)) != len(u3) or not set(u3) <= rnd.u2:
            raise AggregationError(f"{me}: survivor list {u3} is not a subset of U2 {sorted(rnd.u2)}")
        if len(u3) < t:
            raise AggregationError(f"{me}: survivor list has {len(u3)} clients, fewer than t={t}")
        if me not in u3:
            log.warning("%s: the server lists this client as dropped in round %d; stopping", me, rnd.round_id)
            return False
        self.included = True
        if rnd.signer is not None:
            signed = survivors_bytes(job, rnd.round_id, u3)
            self._send(rnd.round_id, 3, TAG_SIGN, pb.ConsistencySignature(round_id=rnd.round_id,
                                                                          signature=rnd.signer.sign(signed)))
            sigs = self._from_server(rnd.round_id, 4, "signatures")
            good = [v for v, sig in sigs.signatures.items()
                    if v in u3 and verify_signature(rnd.keys[v].signing_pk, sig, signed)]
            if len(good) < t or sorted(sigs.survivors) != sorted(u3):
                raise AggregationError(f"{me}: consistency check failed: {len(good)} valid signatures of the "
                                       f"survivor set (t={t}), or the server changed the survivor set")
        return True

    def unmasking(self, rnd: _ClientRound) -> None:
        """Stage 4: b-shares of survivors, s-shares of dropped clients, never both; once per round."""
        if rnd.round_id in self._unmasked_rounds:
            raise AggregationError(f"{self.party_id}: refusing a second unmask request for round {rnd.round_id}")
        self._unmasked_rounds.add(rnd.round_id)
        alive, dropped = set(rnd.u3), rnd.u2 - set(rnd.u3)
        resp = pb.UnmaskResponse(round_id=rnd.round_id)
        for v in sorted(alive):
            if v in rnd.held:
                resp.b_shares.add(owner=v, value=shamir.to_bytes(rnd.held[v].b))
        for v in sorted(dropped):
            if v in rnd.held:
                resp.s_shares.add(owner=v, value=shamir.to_bytes(rnd.held[v].s))
        self._send(rnd.round_id, 4, TAG_UNMASK, resp)

    # ------------------------------------------------------------------------------ helpers
    def _receive_shares(self, rnd: _ClientRound, sharelist) -> None:
        """Decrypt the share pairs forwarded by the server into ``rnd.held``; U2 = us + every sender."""
        me, job = self.party_id, self.t.job_id
        rnd.u2 = {me}
        for e in sharelist.shares:
            v = e.sender
            if e.recipient != me or v not in rnd.keys or v == me or v in rnd.u2:
                raise AggregationError(f"{me}: server forwarded an invalid share entry (sender {v!r}, "
                                       f"recipient {e.recipient!r})")
            rnd.u2.add(v)  # v shared: v masks with us, whatever happens to its ciphertext
            try:
                key = share_key(rnd.ck.private, rnd.keys[v].c_pk, job, rnd.round_id, v, me)
                plain = decrypt_share(key, e.nonce, e.ciphertext, share_ad(job, rnd.round_id, v, me))
                if len(plain) != SHARE_PLAINTEXT:
                    raise ValueError(f"{len(plain)} plaintext bytes")
                rnd.held[v] = _HeldShares(shamir.from_bytes(plain[:shamir.SHARE_BYTES]),
                                          shamir.from_bytes(plain[shamir.SHARE_BYTES:]))
            except (InvalidTag, ValueError) as exc:
                self._reject(2, f"share from {v!r} failed authentication/decoding "
                                f"({type(exc).__name__}); it is ignored, others' shares suffice to recover {v!r}")

    def _mask(self, rnd: _ClientRound) -> np.ndarray:
        """y_u = x_u + PRG(b_u) + Σ_{v∈U2, u<v} PRG(s_uv) − Σ_{v∈U2, u>v} PRG(s_uv) mod 2^k.

        Arithmetic in machine words of qp.word_dtype: mod 2^32 (or 2^64) is mod 2^k once masked, and
        32-bit words halve the PRG output and memory traffic. Client and server expand the PRG alike.
        """
        me, wd = self.party_id, rnd.qp.word_dtype
        y = rnd.words.astype(wd)
        y += prg(rnd.b_seed, y.size, wd)
        for v in sorted(rnd.u2 - {me}):
            p = prg(mask_seed(rnd.sk.private, rnd.keys[v].s_pk, self.t.job_id, rnd.round_id, me, v), y.size, wd)
            if me < v:
                y += p
            else:
                y -= p
        y &= wd.type(rnd.qp.modulus_mask)
        return y

    def _check_keys(self, keylist, rnd: _ClientRound) -> dict[str, PeerKeys]:
        """U1's keys from the server's list; AggregationError if malformed, reused, unsigned or < t."""
        me, job = self.party_id, self.t.job_id
        keys: dict[str, PeerKeys] = {}
        seen: set[bytes] = set()
        for k in keylist.keys:
            if k.client_id not in rnd.parts or k.client_id in keys:
                raise AggregationError(f"{me}: key list names {k.client_id!r} twice or outside the participants")
            if len(k.c_pk) != 32 or len(k.s_pk) != 32 or k.c_pk in seen or k.s_pk in seen or k.c_pk == k.s_pk:
                raise AggregationError(f"{me}: public keys of {k.client_id!r} are malformed or reused")
            if self.config.consistency_check and not verify_signature(
                    k.signing_pk, k.signature, advert_bytes(job, rnd.round_id, k.client_id, k.c_pk, k.s_pk)):
                raise AggregationError(f"{me}: keys of {k.client_id!r} carry an invalid signature")
            seen.update((k.c_pk, k.s_pk))
            keys[k.client_id] = PeerKeys(k.c_pk, k.s_pk, k.signing_pk)
        if me not in keys or keys[me].c_pk != rnd.ck.public or keys[me].s_pk != rnd.sk.public:
            raise AggregationError(f"{me}: the server's key list does not carry this client's keys")
        if len(keys) < rnd.t:
            raise AggregationError(f"{me}: only {len(keys)} clients advertised keys, fewer than t={rnd.t}")
        return keys

    def _on_stage(self, stage: int) -> None:
        """Called before this client sends its stage ``stage`` message (tests override it to vanish)."""

    def _reject(self, stage: int, reason: str) -> None:
        self.rejected.append((STAGE_NAMES[stage], reason))
        log.warning("%s: rejected at %s: %s", self.party_id, STAGE_NAMES[stage], reason)

    def _from_server(self, round_id: int, stage: int, body: str):
        """The server's stage ``stage`` message (its ``body`` field); AggregationError on abort or silence."""
        def validate(msg):
            round_check(msg, round_id, "server message")
            which = msg.WhichOneof("body")
            if msg.stage != stage or which not in (body, "abort"):
                raise ProtocolError(f"expected {body!r} for stage {stage}, got {which!r} for stage {msg.stage}")
            return msg
        try:
            msg = self.t.recv(self.server_id, TAG_SERVER, round_id * STAGES + stage,
                              timeout=self.config.client_timeout_s, parse=parse_message(pb.ServerMessage, validate))
        except PeerTimeout as exc:
            raise AggregationError(f"{self.party_id}: server {self.server_id!r} silent before "
                                   f"{STAGE_NAMES[min(stage, 4)]}: {exc}") from None
        if msg.WhichOneof("body") == "abort":
            raise AggregationError(f"{self.party_id}: server aborted round {round_id}: {msg.abort}")
        return getattr(msg, body)

    def _send(self, round_id: int, stage: int, tag: str, msg) -> None:
        self._on_stage(stage)
        try:
            self.t.send(self.server_id, tag, msg, round=round_id * STAGES + stage, timeout=self.config.client_timeout_s)
        except TransportError as exc:
            raise AggregationError(f"{self.party_id}: could not send {STAGE_NAMES[stage]} to the server: {exc}") \
                from None
