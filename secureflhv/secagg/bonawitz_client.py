"""Client role of secure aggregation (Bonawitz et al., CCS 2017, Fig. 4/5; see :mod:`.bonawitz`).

:meth:`SecAggClient.submit` runs the client's rounds in order, one method per stage of the paper:
:meth:`~SecAggClient.advertise_keys`, :meth:`~SecAggClient.share_keys`,
:meth:`~SecAggClient.masked_input_collection`, :meth:`~SecAggClient.consistency_check`,
:meth:`~SecAggClient.unmasking`. What the client reveals: its public keys, t-1 or fewer shares of its
secrets to each other client, its masked input y_u, and (only when listed among the survivors U3)
shares of b_v for v ∈ U3 and of s_v^SK for v ∈ U2 \\ U3 — never both for one v.

Checks against a malicious server (Bonawitz et al. Sec. 6): every relayed advertisement must carry a
valid signature by the named client's CA-issued certificate (when this client has an identity) and
keys of large order, distinct across clients — otherwise the round is aborted with
:class:`AggregationError` naming that client: the server validates advertisements itself, so a bad
relayed key means the server is lying, and going on with a partial view would give clients
inconsistent masks. A share whose plaintext does not match the dealer's commitment is refused (the
dealer is logged; the others' shares recover its secrets). Before sending y_u the client requires
max(t, min_clients) clients in U1 and U2; before unmasking it requires U3 ⊆ U2, |U3| >= t, and (with
the ConsistencyCheck) >= t valid signatures of that same U3; it answers one unmask request per round.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..crypto import shamir
from ..crypto.quantise import QuantParams
from ..crypto.secagg_primitives import (InvalidTag, KeyPair, SigningKey, decrypt_share, encrypt_share,
                                        new_seed, private_to_int, prg, verify_signature)
from ..proto import secagg_pb2 as pb
from ..transport.base import PeerTimeout, ProtocolError, TransportError, parse_message
from ..transport.codec import tensor_to_proto
from .bonawitz import (SHARE_PLAINTEXT, STAGE_NAMES, TAG_ADVERTISE, TAG_MASKED, TAG_SHARE, TAG_SIGN,
                       TAG_UNMASK, advert_bytes, check_advert, mask_seed, seed_commitment, share_commitment,
                       share_key, share_pair_ad, share_points, survivors_bytes, warn_unauthenticated)
from .config import AggregationConfig
from .exchange import TAG_SERVER, check_round, envelope_round, round_check
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
    need: int                            # max(t, min_clients): the fewest clients U1, U2, U3 may hold
    qp: QuantParams
    words: np.ndarray | None            # quantised x_u (with weight and clipped count), until masked
    points: dict[str, int]               # Shamir x-coordinate per participant
    ck: KeyPair = field(default_factory=KeyPair)          # (c_u^PK, c_u^SK): share encryption
    sk: KeyPair = field(default_factory=KeyPair)          # (s_u^PK, s_u^SK): pairwise masks
    signer: SigningKey = field(default_factory=SigningKey)  # Ed25519 key of this round's ConsistencyCheck
    keys: dict[str, pb.AdvertiseKeys] = field(default_factory=dict)   # U1's (verified) advertisements
    b_seed: bytes = b""                                   # self-mask seed b_u
    mine: pb.AdvertiseKeys | None = None                  # this client's advertisement
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
        """Run the client side of one round. ``vector``: float (d,); ``weight``: in [0, max_weight].

        Raises:
            AggregationError: a participant list the job does not allow (the server, an outsider, a
                duplicate, too few clients for ``min_clients`` / ``max_colluders``:
                :func:`~.exchange.check_round`), a server abort or silence, or a failed check (see the
                module docstring; the error names the offending client or the server).
            ValueError: a bad ``weight``.
        """
        cfg, me = self.config, self.party_id
        parts, t = check_round(participants, cfg, me=me, server_id=self.server_id)
        x = np.asarray(vector, dtype=np.float64).ravel()
        qp = cfg.quant_params(len(parts), x.size)
        words = self._encode(x, weight, qp, round_id)
        self.included = False
        rnd = _ClientRound(round_id, parts, t, max(t, cfg.min_clients), qp, words, share_points(parts))
        self.advertise_keys(rnd)
        self.share_keys(rnd)
        self.masked_input_collection(rnd)
        if self.consistency_check(rnd):
            self.unmasking(rnd)

    # ------------------------------------------------------------------------------ stages
    def advertise_keys(self, rnd: _ClientRound) -> None:
        """Stage 0: draw b_u; send c_u^PK, s_u^PK, the Ed25519 ConsistencyCheck key and a commitment to b_u,
        signed with this party's certificate key (unsigned, with a warning, without an identity)."""
        me, job = self.party_id, self.t.job_id
        rnd.b_seed = new_seed()
        adv = pb.AdvertiseKeys(round_id=rnd.round_id, c_pk=rnd.ck.public, s_pk=rnd.sk.public,
                               signing_pk=rnd.signer.public,
                               b_commit=seed_commitment(job, rnd.round_id, me, rnd.b_seed))
        identity = self.t.identity
        if identity is None:
            warn_unauthenticated(me)
        else:
            adv.certificate = identity.certificate
            adv.signature = identity.sign(advert_bytes(job, rnd.round_id, me, adv))
        rnd.mine = adv
        self._send(rnd.round_id, 0, TAG_ADVERTISE, adv)

    def share_keys(self, rnd: _ClientRound) -> None:
        """Stage 1: check U1's key list; Shamir-share b_u and s_u^SK t-of-|U1|; send each v its pair, AES-GCM."""
        me, job = self.party_id, self.t.job_id
        rnd.keys = self._check_keys(self._from_server(rnd.round_id, 1, "keys"), rnd)
        u1 = sorted(rnd.keys)
        b_sh = shamir.split(int.from_bytes(rnd.b_seed, "big"), [rnd.points[v] for v in u1], rnd.t)
        s_sh = shamir.split(private_to_int(rnd.sk.private), [rnd.points[v] for v in u1], rnd.t)
        rnd.held = {me: _HeldShares(b_sh[rnd.points[me]], s_sh[rnd.points[me]])}
        out = pb.ShareKeys(round_id=rnd.round_id, own=self._commit(rnd, me, rnd.held[me]))
        for v in u1:
            if v == me:
                continue
            pair = _HeldShares(b_sh[rnd.points[v]], s_sh[rnd.points[v]])
            commit = self._commit(rnd, v, pair)
            key = share_key(rnd.ck.private, rnd.keys[v].c_pk, job, rnd.round_id, me, v)
            nonce, ct = encrypt_share(key, shamir.to_bytes(pair.b) + shamir.to_bytes(pair.s),
                                      share_pair_ad(job, rnd.round_id, me, v, commit))
            out.shares.add(sender=me, recipient=v, nonce=nonce, ciphertext=ct, commit=commit)
        self._send(rnd.round_id, 1, TAG_SHARE, out)

    def masked_input_collection(self, rnd: _ClientRound) -> None:
        """Stage 2: keep the shares addressed to us (U2 = who shared); send y_u = x_u + PRG(b_u) ± PRG(s_uv)."""
        self._receive_shares(rnd, self._from_server(rnd.round_id, 2, "shares"))
        self._require(rnd, len(rnd.u2), "clients shared keys (U2)")
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
        self._require(rnd, len(u3), "clients in the survivor list (U3)")
        if me not in u3:
            log.warning("%s: the server lists this client as dropped in round %d; stopping", me, rnd.round_id)
            return False
        self.included = True
        if self.config.consistency_check:
            signed = survivors_bytes(job, rnd.round_id, u3)
            self._send(rnd.round_id, 3, TAG_SIGN, pb.ConsistencySignature(round_id=rnd.round_id,
                                                                          signature=rnd.signer.sign(signed)))
            sigs = self._from_server(rnd.round_id, 4, "signatures")
            good = [v for v, sig in sigs.signatures.items()
                    if v in u3 and verify_signature(rnd.keys[v].signing_pk, sig, signed)]
            if sorted(sigs.survivors) != sorted(u3):
                raise AggregationError(f"{me}: consistency check failed: the server changed the survivor set from "
                                       f"{sorted(u3)} to {sorted(sigs.survivors)}")
            if len(good) < t:
                bad = sorted(set(sigs.signatures) - set(good))
                raise AggregationError(f"{me}: consistency check failed: {len(good)} valid signatures of the "
                                       f"survivor set {sorted(u3)}, fewer than t={t} (invalid: {bad}); the "
                                       f"server may be showing clients different survivor sets")
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
    def _commit(self, rnd: _ClientRound, holder: str, pair: _HeldShares) -> pb.ShareCommit:
        """The commitments to ``holder``'s share pair of this client's secrets."""
        me, job = self.party_id, self.t.job_id
        return pb.ShareCommit(b=share_commitment("b", job, rnd.round_id, me, holder, pair.b),
                              s=share_commitment("s", job, rnd.round_id, me, holder, pair.s))

    def _require(self, rnd: _ClientRound, count: int, what: str) -> None:
        """AggregationError unless ``count`` >= max(t, min_clients)."""
        if count < rnd.need:
            raise AggregationError(f"{self.party_id}: only {count} {what}, fewer than t={rnd.t} or min_clients="
                                   f"{self.config.min_clients}; refusing to go on with round {rnd.round_id}")

    def _receive_shares(self, rnd: _ClientRound, sharelist) -> None:
        """Decrypt the share pairs forwarded by the server into ``rnd.held``; U2 = us + every sender.

        A pair failing AES-GCM (its AD binds the dealer's commitments) or not matching the commitments
        is refused and logged: the dealer dealt badly (or the server tampered); we hold no share of it."""
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
                plain = decrypt_share(key, e.nonce, e.ciphertext, share_pair_ad(job, rnd.round_id, v, me, e.commit))
                if len(plain) != SHARE_PLAINTEXT:
                    raise ValueError(f"{len(plain)} plaintext bytes")
                pair = _HeldShares(shamir.from_bytes(plain[:shamir.SHARE_BYTES]),
                                   shamir.from_bytes(plain[shamir.SHARE_BYTES:]))
                if (share_commitment("b", job, rnd.round_id, v, me, pair.b) != e.commit.b
                        or share_commitment("s", job, rnd.round_id, v, me, pair.s) != e.commit.s):
                    raise ValueError(f"the shares do not match {v!r}'s commitments")
                rnd.held[v] = pair
            except (InvalidTag, ValueError) as exc:
                self._reject(2, f"share from {v!r} failed authentication/decoding "
                                f"({type(exc).__name__}: {exc}); it is ignored, others' shares suffice to "
                                f"recover {v!r}")

    def _mask(self, rnd: _ClientRound) -> np.ndarray:
        """y_u = x_u + PRG(b_u) + Σ_{v∈U2, u<v} PRG(s_uv) − Σ_{v∈U2, u>v} PRG(s_uv) mod 2^k.

        Arithmetic in machine words of qp.word_dtype: mod 2^16, 2^32 (or 2^64) is mod 2^k once masked, and
        shorter words cut the PRG output and memory traffic. Client and server expand the PRG alike.
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

    def _check_keys(self, keylist, rnd: _ClientRound) -> dict[str, pb.AdvertiseKeys]:
        """U1's advertisements from the server's list, each verified (:func:`~.bonawitz.check_advert`).

        Raises:
            AggregationError: an entry outside the participants or twice, an invalid key or signature,
                a key also advertised by another client (each names the client), our own advertisement
                altered, or fewer than max(t, min_clients) clients.
        """
        me, job = self.party_id, self.t.job_id
        identity = self.t.identity
        verifier = identity.verifier if identity is not None else None
        keys: dict[str, pb.AdvertiseKeys] = {}
        owner: dict[bytes, str] = {}
        for k in keylist.keys:
            c, adv = k.client_id, k.advert
            if c not in rnd.parts or c in keys:
                raise AggregationError(f"{me}: key list names {c!r} twice or outside the participants")
            try:
                check_advert(job, rnd.round_id, c, adv, verifier)
            except ValueError as exc:
                raise AggregationError(f"{me}: the server relayed an invalid advertisement of {c!r} ({exc}); the "
                                       f"server must refuse those itself, so it is faulty or malicious: "
                                       f"aborting round {rnd.round_id}") from None
            for pk in (adv.c_pk, adv.s_pk):
                if pk in owner:
                    raise AggregationError(f"{me}: {c!r} advertises a public key of {owner[pk]!r}: aborting "
                                           f"round {rnd.round_id}")
                owner[pk] = c
            keys[c] = adv
        if keys.get(me) != rnd.mine:
            raise AggregationError(f"{me}: the server's key list does not carry this client's advertisement")
        self._require(rnd, len(keys), "clients advertised keys (U1)")
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
            # the server may rightly take longer than the deadline (it outwaits slow clients), but a dead
            # server is named within about one deadline
            msg = self.t.recv_while_reachable(self.server_id, TAG_SERVER, envelope_round(round_id, stage),
                                              timeout=self.config.client_timeout_s,
                                              parse=parse_message(pb.ServerMessage, validate))
        except PeerTimeout as exc:
            raise AggregationError(f"{self.party_id}: server {self.server_id!r} silent before "
                                   f"{STAGE_NAMES[min(stage, 4)]}: {exc}") from exc
        if msg.WhichOneof("body") == "abort":
            raise AggregationError(f"{self.party_id}: server aborted round {round_id}: {msg.abort}")
        return getattr(msg, body)

    def _send(self, round_id: int, stage: int, tag: str, msg) -> None:
        self._on_stage(stage)
        try:
            # the server's mailbox takes a message at any stage: the job deadline bounds a delivery, as
            # everywhere else, and an unreachable server is not retried past it
            self.t.send(self.server_id, tag, msg, round=envelope_round(round_id, stage))
        except TransportError as exc:
            # chained: the runtime's blame names the unreachable server as the root cause
            raise AggregationError(f"{self.party_id}: could not send {STAGE_NAMES[stage]} to the server: {exc}") \
                from exc
