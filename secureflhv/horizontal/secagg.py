"""Secure aggregation: Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning", CCS 2017 — the protocol of Fig. 4 (semi-honest) with the ConsistencyCheck round of Fig. 5
(Ed25519 signatures of the survivor set, ``AggregationConfig.consistency_check``).

Stages (envelope round = round_id * 16 + stage; client -> server tags ``agg.advertise``,
``agg.share``, ``agg.masked``, ``agg.sign``, ``agg.unmask``; server -> client tag ``agg.server``):

0. AdvertiseKeys — each client u makes two X25519 key pairs, (c_u^PK, c_u^SK) for share encryption
   and (s_u^PK, s_u^SK) for pairwise masks (plus an Ed25519 key when consistency_check is on, which
   signs the two public keys). The server waits for >= t clients: U1, and sends U1's keys to U1.
1. ShareKeys — u draws the self-mask seed b_u (256 bits) and Shamir-shares b_u and s_u^SK t-of-|U1|
   over GF(2^521 - 1) (:mod:`secureflhv.crypto.shamir`); the share pair for v is encrypted with
   AES-256-GCM under HKDF(X25519(c_u^SK, c_v^PK)), associated data (job, round, u, v). The server
   forwards to each v the ciphertexts addressed to it: U2 = clients whose shares arrived.
2. MaskedInputCollection — u sends y_u = x_u + PRG(b_u) + Σ_{v∈U2, u<v} PRG(s_uv) − Σ_{v∈U2, u>v}
   PRG(s_uv) mod 2^k, s_uv = HKDF(X25519(s_u^SK, s_v^PK)); PRG = AES-256-CTR (see
   :mod:`secureflhv.crypto.secagg_primitives`). x_u is the quantised weighted update with the weight and
   the clipped count appended (:mod:`secureflhv.crypto.quantise`). U3 = clients whose y arrived.
3. ConsistencyCheck (optional) — the server sends U3; each client signs (job, round, U3); the server
   forwards the signatures of U4 ⊆ U3, which every client verifies (>= t valid) before unmasking, so
   a server cannot show different survivor sets to different clients.
4. Unmasking — each responding client sends its shares of b_v for v ∈ U3 and of s_v^SK for
   v ∈ U2 \\ U3. The *client* computes these sets itself, answers one unmask request per round only,
   and checks U3 ⊆ U2, |U3| >= t, so it never reveals both shares of one client. The server
   reconstructs b_v (v ∈ U3) and s_v^SK (v dropped, checked against s_v^PK), removes PRG(b_v) and the
   dropped clients' pairwise masks, and obtains Σ_{u∈U3} x_u mod 2^k.

Dropout: any client may vanish at any stage (the server detects it by the per-stage deadline, or a
failed send); the round completes as long as >= t clients remain at every stage, else
:class:`~secureflhv.horizontal.aggregation.AggregationError` names the stage and who dropped where.
Unlike Flower's SecAgg+ implementation, a drop during key set-up does not abort the round.

What each role learns (threat model: semi-honest server colluding with < t clients, Bonawitz
Sec. 4 / Thm. 6.3): the server learns the participants' public keys, who dropped at which stage,
the sum Σ_{u∈U3} (weight_u · clip(x_u)) quantised, Σ weight_u and the total number of clipped
coordinates — and nothing else about an individual x_u: each y_u is uniformly random in Z_{2^k}^d
given the server's view because b_u (for u ∈ U3) stays hidden and the pairwise masks of dropped clients
are removed only after y is fixed. A client learns the other clients' public keys, U2, U3 (and U4),
and t-1 or fewer shares of each other client's secrets, which reveal nothing. Colluding with < t
clients does not change this; >= t colluders can reconstruct b_u and s_u and so x_u.
Not covered: active attacks beyond ConsistencyCheck (Ed25519 keys are generated per round and are
only as authentic as the server's relay; bind them to the TLS identities for a malicious server),
and the stochastic-rounding noise is not differential privacy.

Parameters: t defaults to ceil(2n/3); field p = 2^521 − 1 (> 2^256, holds every secret); k from
:func:`secureflhv.crypto.quantise.choose_k_bits`; PRG AES-256-CTR keyed by a full 256-bit seed.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..crypto import shamir
from ..crypto.quantise import EXTRA_COORDS, QuantParams, dequantise, quantise, rounding_rng
from ..crypto.secagg_primitives import (InvalidTag, KeyPair, SigningKey, agree, decrypt_share, derive_key,
                                        encrypt_share, new_seed, private_from_int, private_to_int, prg, share_ad,
                                        verify_signature)
from ..proto import secagg_pb2 as pb
from ..transport.base import PeerTimeout, ProtocolError, TransportError, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto
from .aggregation import (STAGES, TAG_SERVER, AggregateResult, AggregationClient, AggregationConfig,
                          AggregationError, AggregationServer, _round_check, check_participants, collect,
                          fail_message, send_all)

log = logging.getLogger("secureflhv.horizontal.secagg")

TAG_ADVERTISE = "agg.advertise"
TAG_SHARE = "agg.share"
TAG_MASKED = "agg.masked"
TAG_SIGN = "agg.sign"
TAG_UNMASK = "agg.unmask"

STAGE_NAMES = ("AdvertiseKeys", "ShareKeys", "MaskedInputCollection", "ConsistencyCheck", "Unmasking")
SHARE_PLAINTEXT = 2 * shamir.SHARE_BYTES
SHARE_CIPHERTEXT = SHARE_PLAINTEXT + 16  # GCM tag


# ---------------------------------------------------------------------------------- shared helpers
def _advert_bytes(job: str, round_id: int, client: str, c_pk: bytes, s_pk: bytes) -> bytes:
    return f"secagg-advertise|{job}|{round_id}|{client}|".encode() + c_pk + s_pk


def _survivors_bytes(job: str, round_id: int, survivors: Sequence[str]) -> bytes:
    return "|".join(["secagg-survivors", job, str(round_id), *sorted(survivors)]).encode()


def _share_key(private, peer_pk: bytes, job: str, round_id: int, a: str, b: str) -> bytes:
    return derive_key(agree(private, peer_pk), "secagg-share-enc", job, round_id, *sorted((a, b)))


def _mask_seed(private, peer_pk: bytes, job: str, round_id: int, a: str, b: str) -> bytes:
    return derive_key(agree(private, peer_pk), "secagg-pairwise-mask", job, round_id, *sorted((a, b)))


def share_points(participants: Sequence[str]) -> dict[str, int]:
    """Shamir x-coordinate of each participant: 1 + its index in the sorted participant list."""
    return {p: i + 1 for i, p in enumerate(sorted(participants))}


@dataclass
class _Keys:
    c_pk: bytes
    s_pk: bytes
    signing_pk: bytes


class _Vanished(Exception):
    """Test hook: raised by :meth:`SecAggClient._on_stage` overrides to simulate a crash."""


# ---------------------------------------------------------------------------------- client
class SecAggClient(AggregationClient):
    """Client role of Bonawitz et al. Fig. 4 (see the module docstring for what it reveals).

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

    def _on_stage(self, stage: int) -> None:
        """Called before this client sends its stage ``stage`` message (tests override it to vanish)."""

    def _reject(self, stage: int, reason: str) -> None:
        self.rejected.append((STAGE_NAMES[stage], reason))
        log.warning("%s: rejected at %s: %s", self.client_id, STAGE_NAMES[stage], reason)

    def _from_server(self, round_id: int, stage: int, field: str):
        def validate(msg):
            _round_check(msg, round_id, "server message")
            which = msg.WhichOneof("body")
            if msg.stage != stage or which not in (field, "abort"):
                raise ProtocolError(f"expected {field!r} for stage {stage}, got {which!r} for stage {msg.stage}")
            return msg
        try:
            msg = self.transport.recv(self.server_id, TAG_SERVER, round_id * STAGES + stage,
                                      timeout=self.config.client_timeout_s, parse=parse_message(pb.ServerMessage,
                                                                                                validate))
        except PeerTimeout as exc:
            raise AggregationError(f"{self.client_id}: server {self.server_id!r} silent before "
                                   f"{STAGE_NAMES[min(stage, 4)]}: {exc}") from None
        if msg.WhichOneof("body") == "abort":
            raise AggregationError(f"{self.client_id}: server aborted round {round_id}: {msg.abort}")
        return getattr(msg, field)

    def _send(self, round_id: int, stage: int, tag: str, msg) -> None:
        self._on_stage(stage)
        try:
            self.transport.send(self.server_id, tag, msg, round=round_id * STAGES + stage,
                                timeout=self.config.client_timeout_s)
        except TransportError as exc:
            raise AggregationError(f"{self.client_id}: could not send {STAGE_NAMES[stage]} to the server: {exc}") \
                from None

    def submit(self, round_id: int, participants: Sequence[str], vector: np.ndarray, weight: float) -> None:
        """Run the client side of one round. ``vector``: float (d,); ``weight``: in (0, max_weight]."""
        cfg, me, job = self.config, self.client_id, self.transport.job_id
        parts = check_participants(participants, me)
        n = len(parts)
        t = cfg.resolve_threshold(n)
        x = np.asarray(vector, dtype=np.float64).ravel()
        qp = cfg.quant_params(n, x.size)
        words, self.last_n_clipped = quantise(x, weight, qp, rounding_rng(cfg.seed, round_id, me), me)
        self.included = False
        pts = share_points(parts)

        # Stage 0: AdvertiseKeys
        ck, sk = KeyPair(), KeyPair()
        signer = SigningKey() if cfg.consistency_check else None
        adv = pb.AdvertiseKeys(round_id=round_id, c_pk=ck.public, s_pk=sk.public)
        if signer is not None:
            adv.signing_pk = signer.public
            adv.signature = signer.sign(_advert_bytes(job, round_id, me, ck.public, sk.public))
        self._send(round_id, 0, TAG_ADVERTISE, adv)

        keylist = self._from_server(round_id, 1, "keys")
        keys = self._check_keys(keylist, parts, t, round_id, ck.public, sk.public)
        u1 = sorted(keys)

        # Stage 1: ShareKeys
        b_seed = new_seed()
        b_sh = shamir.split(int.from_bytes(b_seed, "big"), [pts[v] for v in u1], t)
        s_sh = shamir.split(private_to_int(sk.private), [pts[v] for v in u1], t)
        out = pb.ShareKeys(round_id=round_id)
        for v in u1:
            if v == me:
                continue
            key = _share_key(ck.private, keys[v].c_pk, job, round_id, me, v)
            plain = shamir.to_bytes(b_sh[pts[v]]) + shamir.to_bytes(s_sh[pts[v]])
            nonce, ct = encrypt_share(key, plain, share_ad(job, round_id, me, v))
            out.shares.add(sender=me, recipient=v, nonce=nonce, ciphertext=ct)
        self._send(round_id, 1, TAG_SHARE, out)

        # Stage 2: MaskedInputCollection
        sharelist = self._from_server(round_id, 2, "shares")
        held: dict[str, tuple[int, int]] = {me: (b_sh[pts[me]], s_sh[pts[me]])}
        u2 = {me}
        for e in sharelist.shares:
            v = e.sender
            if e.recipient != me or v not in keys or v == me or v in u2:
                raise AggregationError(f"{me}: server forwarded an invalid share entry (sender {v!r}, "
                                       f"recipient {e.recipient!r})")
            u2.add(v)  # v shared: v masks with us, whatever happens to its ciphertext
            try:
                key = _share_key(ck.private, keys[v].c_pk, job, round_id, v, me)
                plain = decrypt_share(key, e.nonce, e.ciphertext, share_ad(job, round_id, v, me))
                if len(plain) != SHARE_PLAINTEXT:
                    raise ValueError(f"{len(plain)} plaintext bytes")
                held[v] = (shamir.from_bytes(plain[:shamir.SHARE_BYTES]),
                           shamir.from_bytes(plain[shamir.SHARE_BYTES:]))
            except (InvalidTag, ValueError) as exc:
                self._reject(2, f"share from {v!r} failed authentication/decoding "
                                f"({type(exc).__name__}); it is ignored, others' shares suffice to recover {v!r}")
        if len(u2) < t:
            raise AggregationError(f"{me}: only {len(u2)} clients shared keys (U2), fewer than t={t}")
        # Arithmetic in machine words of qp.word_dtype: mod 2^32 (or 2^64) is mod 2^k once masked, and
        # 32-bit words halve the PRG output and memory traffic. Client and server expand the PRG alike.
        wd = qp.word_dtype
        y = words.astype(wd)
        y += prg(b_seed, y.size, wd)
        for v in sorted(u2 - {me}):
            p = prg(_mask_seed(sk.private, keys[v].s_pk, job, round_id, me, v), y.size, wd)
            if me < v:
                y += p
            else:
                y -= p
        y &= wd.type(qp.modulus_mask)
        self._send(round_id, 2, TAG_MASKED, pb.MaskedInput(round_id=round_id, k_bits=qp.k_bits,
                                                           y=tensor_to_proto(y)))
        del y, words

        # Stage 3: ConsistencyCheck (optional)
        u3 = list(self._from_server(round_id, 3, "survivors").clients)
        if len(set(u3)) != len(u3) or not set(u3) <= u2:
            raise AggregationError(f"{me}: survivor list {u3} is not a subset of U2 {sorted(u2)}")
        if len(u3) < t:
            raise AggregationError(f"{me}: survivor list has {len(u3)} clients, fewer than t={t}")
        if me not in u3:
            log.warning("%s: the server lists this client as dropped in round %d; stopping", me, round_id)
            return
        self.included = True
        if signer is not None:
            self._send(round_id, 3, TAG_SIGN, pb.ConsistencySignature(
                round_id=round_id, signature=signer.sign(_survivors_bytes(job, round_id, u3))))
            sigs = self._from_server(round_id, 4, "signatures")
            good = [v for v, sig in sigs.signatures.items()
                    if v in u3 and verify_signature(keys[v].signing_pk, sig, _survivors_bytes(job, round_id, u3))]
            if len(good) < t or sorted(sigs.survivors) != sorted(u3):
                raise AggregationError(f"{me}: consistency check failed: {len(good)} valid signatures of the "
                                       f"survivor set (t={t}), or the server changed the survivor set")

        # Stage 4: Unmasking — b-shares of survivors, s-shares of dropped clients, never both.
        if round_id in self._unmasked_rounds:
            raise AggregationError(f"{me}: refusing a second unmask request for round {round_id}")
        self._unmasked_rounds.add(round_id)
        alive, dropped = set(u3), u2 - set(u3)
        assert not alive & dropped
        resp = pb.UnmaskResponse(round_id=round_id)
        for v in sorted(alive):
            if v in held:
                resp.b_shares.add(owner=v, value=shamir.to_bytes(held[v][0]))
        for v in sorted(dropped):
            if v in held:
                resp.s_shares.add(owner=v, value=shamir.to_bytes(held[v][1]))
        self._send(round_id, 4, TAG_UNMASK, resp)

    def _check_keys(self, keylist, parts, t, round_id, my_c, my_s) -> dict[str, _Keys]:
        me, job = self.client_id, self.transport.job_id
        keys: dict[str, _Keys] = {}
        seen: set[bytes] = set()
        for k in keylist.keys:
            if k.client_id not in parts or k.client_id in keys:
                raise AggregationError(f"{me}: key list names {k.client_id!r} twice or outside the participants")
            if len(k.c_pk) != 32 or len(k.s_pk) != 32 or k.c_pk in seen or k.s_pk in seen or k.c_pk == k.s_pk:
                raise AggregationError(f"{me}: public keys of {k.client_id!r} are malformed or reused")
            if self.config.consistency_check and not verify_signature(
                    k.signing_pk, k.signature, _advert_bytes(job, round_id, k.client_id, k.c_pk, k.s_pk)):
                raise AggregationError(f"{me}: keys of {k.client_id!r} carry an invalid signature")
            seen.update((k.c_pk, k.s_pk))
            keys[k.client_id] = _Keys(k.c_pk, k.s_pk, k.signing_pk)
        if me not in keys or keys[me].c_pk != my_c or keys[me].s_pk != my_s:
            raise AggregationError(f"{me}: the server's key list does not carry this client's keys")
        if len(keys) < t:
            raise AggregationError(f"{me}: only {len(keys)} clients advertised keys, fewer than t={t}")
        return keys


# ---------------------------------------------------------------------------------- server
class SecAggServer(AggregationServer):
    """Server role of Bonawitz et al. Fig. 4/5. ``aggregate`` returns Σ over U3 or raises AggregationError.

    Attributes:
        last_timings: seconds spent per stage in the last round (``"unmask"`` = reconstruction + PRGs).
    """

    def __init__(self, transport, config: AggregationConfig):
        super().__init__(transport, config)
        self.last_timings: dict[str, float] = {}

    def aggregate(self, round_id: int, participants: Sequence[str], dim: int) -> AggregateResult:
        cfg, job, tr = self.config, self.transport.job_id, self.transport
        parts = check_participants(participants)
        n = len(parts)
        t = cfg.resolve_threshold(n)
        if t <= n // 2:
            log.warning("secagg threshold t=%d <= n/2=%d: a server colluding with t clients learns inputs; "
                        "Bonawitz et al. recommend t > n/2", t, n // 2)
        qp = cfg.quant_params(n, dim)
        pts = share_points(parts)
        base = round_id * STAGES
        dropped_at: dict[str, str] = {}
        timings: dict[str, float] = {}
        self.last_timings = timings
        clock = time.perf_counter()

        def lap(name):
            nonlocal clock
            now = time.perf_counter()
            timings[name] = now - clock
            clock = now

        def survive(expected: Sequence[str], got, stage: int) -> list[str]:
            alive = sorted(c for c in expected if c in got)
            for c in expected:
                if c not in got:
                    dropped_at.setdefault(c, STAGE_NAMES[stage])
            if len(alive) < t:
                reason = fail_message(STAGE_NAMES[stage], parts, alive, t, dropped_at)
                log.error("round %d: %s", round_id, reason)
                send_all(tr, alive, TAG_SERVER, base + stage + 1,
                         pb.ServerMessage(round_id=round_id, stage=stage + 1, abort=reason), cfg.stage_timeout_s)
                raise AggregationError(reason)
            return alive

        def broadcast(receivers, stage, msgs, next_stage) -> list[str]:
            failed = send_all(tr, receivers, TAG_SERVER, base + stage, msgs, cfg.stage_timeout_s)
            for c in failed:
                dropped_at.setdefault(c, STAGE_NAMES[next_stage])
            return [c for c in receivers if c not in failed]

        # Stage 0: AdvertiseKeys
        def v_adv(m):
            _round_check(m, round_id, "AdvertiseKeys")
            if len(m.c_pk) != 32 or len(m.s_pk) != 32:
                raise ProtocolError("X25519 public keys must be 32 bytes")
            return m
        adv = collect(tr, parts, TAG_ADVERTISE, base + 0, cfg.input_timeout_s, parse_message(pb.AdvertiseKeys, v_adv))
        u1 = survive(parts, adv, 0)
        keylist = pb.KeyList(keys=[pb.ClientKeys(client_id=c, c_pk=adv[c].c_pk, s_pk=adv[c].s_pk,
                                                 signing_pk=adv[c].signing_pk, signature=adv[c].signature)
                                   for c in u1])
        u1_live = broadcast(u1, 1, pb.ServerMessage(round_id=round_id, stage=1, keys=keylist), 1)
        lap("advertise")

        # Stage 1: ShareKeys
        def v_share(sender):
            def check(m):
                _round_check(m, round_id, "ShareKeys")
                to = [e.recipient for e in m.shares]
                if sorted(to) != sorted(set(u1) - {sender}) or any(e.sender != sender for e in m.shares):
                    raise ProtocolError(f"shares must go from {sender!r} to each other client of U1 once")
                if any(len(e.nonce) != 12 or len(e.ciphertext) != SHARE_CIPHERTEXT for e in m.shares):
                    raise ProtocolError("share ciphertext or nonce has the wrong length")
                return m
            return parse_message(pb.ShareKeys, check)
        shares = self._collect_per_sender(u1_live, TAG_SHARE, base + 1, v_share)
        u2 = survive(u1, shares, 1)
        per_recipient = {v: pb.ServerMessage(round_id=round_id, stage=2, shares=pb.ShareList(
            shares=[e for u in u2 if u != v for e in shares[u].shares if e.recipient == v])) for v in u2}
        u2_live = broadcast(u2, 2, per_recipient, 2)
        lap("share_keys")

        # Stage 2: MaskedInputCollection
        def v_masked(m):
            _round_check(m, round_id, "MaskedInput")
            if m.k_bits != qp.k_bits:
                raise ProtocolError(f"k_bits {m.k_bits}, expected {qp.k_bits}")
            return tensor_from_proto(m.y, dtype=qp.word_dtype.str, shape=(dim + EXTRA_COORDS,), what="masked input")
        masked = collect(tr, u2_live, TAG_MASKED, base + 2, cfg.stage_timeout_s, parse_message(pb.MaskedInput, v_masked))
        u3 = survive(u2, masked, 2)
        wd = qp.word_dtype  # the clients' word size (see the client's MaskedInputCollection)
        acc = np.zeros(dim + EXTRA_COORDS, dtype=wd)
        for c in u3:
            acc += masked[c]
        del masked
        # U2 \ U3 also get the list, so a client whose input was refused stops at once
        unreachable = send_all(tr, u2_live, TAG_SERVER, base + 3, pb.ServerMessage(
            round_id=round_id, stage=3, survivors=pb.ClientList(clients=u3)), cfg.stage_timeout_s)
        responders = [c for c in u3 if c not in unreachable]
        lap("masked_input")

        # Stage 3: ConsistencyCheck
        late: dict[str, str] = {}  # inputs in the sum, client gone later (for logs only)
        if cfg.consistency_check:
            msg_bytes = _survivors_bytes(job, round_id, u3)

            def v_sig(sender):
                def check(m):
                    _round_check(m, round_id, "ConsistencySignature")
                    if not verify_signature(adv[sender].signing_pk, m.signature, msg_bytes):
                        raise ProtocolError(f"invalid signature of the survivor set from {sender!r}")
                    return m.signature
                return parse_message(pb.ConsistencySignature, check)
            sigs = self._collect_per_sender(responders, TAG_SIGN, base + 3, v_sig)
            for c in responders:
                if c not in sigs:
                    late[c] = STAGE_NAMES[3]
            u4 = sorted(sigs)
            if len(u4) < t:
                self._fail_late(round_id, 3, u4, parts, t, dropped_at, late)
            responders = broadcast(u4, 4, pb.ServerMessage(round_id=round_id, stage=4, signatures=pb.SignatureList(
                signatures=sigs, survivors=u3)), 4)
            lap("consistency")

        # Stage 4: Unmasking
        u3_set, dropped2 = set(u3), set(u2) - set(u3)

        def v_unmask(m):
            _round_check(m, round_id, "UnmaskResponse")
            b = {e.owner: shamir.from_bytes(e.value) for e in m.b_shares}
            s = {e.owner: shamir.from_bytes(e.value) for e in m.s_shares}
            if len(b) != len(m.b_shares) or len(s) != len(m.s_shares):
                raise ProtocolError("duplicate share owners")
            if not set(b) <= u3_set or not set(s) <= dropped2:
                raise ProtocolError("b-shares must be of survivors and s-shares of dropped clients only")
            return b, s
        resp = collect(tr, responders, TAG_UNMASK, base + 4, cfg.stage_timeout_s,
                       parse_message(pb.UnmaskResponse, v_unmask))
        for c in responders:
            if c not in resp:
                late[c] = STAGE_NAMES[4]
        if len(resp) < t:
            self._fail_late(round_id, 4, sorted(resp), parts, t, dropped_at, late)
        lap("collect_unmask")
        self._unmask(acc, resp, u3, sorted(dropped2), adv, pts, t, job, round_id, qp)
        lap("unmask")
        total, weight, n_clipped = dequantise(acc, qp)
        if late:
            log.info("round %d: clients %s left after sending their input (still in the sum)", round_id, late)
        res = AggregateResult(total, weight, u3, sorted(dropped_at), cfg.clip, cfg.scale, qp.k_bits, n_clipped,
                              dict(dropped_at))
        self._log_result(round_id, res)
        return res

    def _collect_per_sender(self, senders, tag, round, make_parse):
        deadline = time.monotonic() + self.config.stage_timeout_s
        got = {}
        for s in senders:
            try:
                got[s] = self.transport.recv(s, tag, round, timeout=max(deadline - time.monotonic(), 0.001),
                                             parse=make_parse(s))
            except PeerTimeout:
                log.warning("%s: no valid %r from %s within the stage deadline: counted as dropped",
                            self.transport.party_id, tag, s)
        return got

    def _fail_late(self, round_id, stage, alive, parts, t, dropped_at, late):
        reason = fail_message(STAGE_NAMES[stage], parts, alive, t, {**dropped_at, **late})
        log.error("round %d: %s", round_id, reason)
        if stage == 3:  # the signers wait for the signature list
            send_all(self.transport, alive, TAG_SERVER, round_id * STAGES + 4,
                     pb.ServerMessage(round_id=round_id, stage=4, abort=reason), self.config.stage_timeout_s)
        raise AggregationError(reason)

    def _unmask(self, acc, resp, u3, dropped, adv, pts, t, job, round_id, qp: QuantParams) -> None:
        """Remove self masks of U3 and pairwise masks of dropped clients from ``acc`` (in place)."""
        d, wd = acc.size, acc.dtype

        def shares_of(owner, which):
            return {pts[c]: resp[c][which][owner] for c in resp if owner in resp[c][which]}

        for v in u3:
            sh = shares_of(v, 0)
            if len(sh) < t:
                raise AggregationError(f"cannot unmask {v!r}: {len(sh)} b-shares received, t={t} needed")
            b = shamir.reconstruct(sh, t)
            if b >= 1 << 256:
                raise AggregationError(f"reconstructed self-mask seed of {v!r} is out of range (bad shares)")
            acc -= prg(b.to_bytes(32, "big"), d, wd)
        for v in dropped:
            sh = shares_of(v, 1)
            if len(sh) < t:
                raise AggregationError(f"cannot remove masks of dropped {v!r}: {len(sh)} s-shares, t={t} needed")
            try:
                s_v = private_from_int(shamir.reconstruct(sh, t))
            except ValueError as exc:
                raise AggregationError(f"reconstructed mask key of {v!r} is invalid: {exc}") from None
            if s_v.public_key().public_bytes_raw() != adv[v].s_pk:
                raise AggregationError(f"reconstructed mask key of dropped {v!r} does not match its public key")
            for u in u3:
                p = prg(_mask_seed(s_v, adv[u].s_pk, job, round_id, u, v), d, wd)
                if u < v:  # u added +PRG(s_uv)
                    acc -= p
                else:
                    acc += p
        acc &= wd.type(qp.modulus_mask)
