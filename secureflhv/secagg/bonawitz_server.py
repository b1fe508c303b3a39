"""Server role of secure aggregation (Bonawitz et al., CCS 2017, Fig. 4/5; see :mod:`.bonawitz`).

:meth:`SecAggServer.aggregate` runs the stages in order, one method each:
:meth:`~SecAggServer.advertise_keys` (U1), :meth:`~SecAggServer.share_keys` (U2),
:meth:`~SecAggServer.masked_input_collection` (U3), :meth:`~SecAggServer.consistency_check` (U4,
optional) and :meth:`~SecAggServer.unmasking`. Each stage waits for the clients it expects up to its
deadline, counts the silent or unreachable ones as dropped at that stage, and, when fewer than
max(t, min_clients) remain, tells the remaining clients (``ServerMessage.abort``) and raises
:class:`AggregationError`. Checks against dishonest clients (Bonawitz et al. Sec. 6): each
advertisement is validated on arrival (:func:`~.bonawitz.check_advert`: key order, certificate
signature when the server has an identity) and keys duplicated across clients or reused from the
last rounds are refused — such a client is an offender dropped at AdvertiseKeys; each share
submitted at Unmasking must match its dealer's commitment — a holder whose share does not is an
offender whose shares are all dropped; each reconstructed secret must match its commitment (b_v) or
public key (s_v^SK) — else the error names the dealer. What the server learns: see :mod:`.bonawitz`.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..crypto import shamir
from ..crypto.quantise import EXTRA_COORDS, QuantParams, dequantise
from ..crypto.secagg_primitives import private_from_int, prg, verify_signature
from ..proto import secagg_pb2 as pb
from ..transport.base import ProtocolError, parse_message
from ..transport.codec import tensor_from_proto
from .bonawitz import (SHARE_CIPHERTEXT, STAGE_NAMES, TAG_ADVERTISE, TAG_MASKED, TAG_SHARE, TAG_SIGN,
                       TAG_UNMASK, check_advert, mask_seed, seed_commitment, share_commitment, share_points,
                       survivors_bytes, warn_unauthenticated)
from .bounds import check_sum
from .config import AggregationConfig
from .exchange import TAG_SERVER, check_round, collect, collect_each, envelope_round, round_check, send_all
from .result import AggregateResult, AggregationError, fail_message
from .roles import AggregationServer

log = logging.getLogger("secureflhv.secagg.bonawitz")

KEY_MEMORY_ROUNDS = 100  # public keys of this many past rounds are remembered and refused if re-advertised


@dataclass
class _UnmaskShares:
    """One client's Unmasking answer: its shares of b_v (v ∈ U3) and of s_v^SK (v ∈ U2 \\ U3), by owner v."""

    b: dict[str, int]
    s: dict[str, int]


class _Stopwatch:
    """Seconds per named lap (``laps`` is the dict the server exposes as ``last_timings``)."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self._last
        self._last = now


@dataclass
class _ServerRound:
    """The server's state of one round (paper notation: U1 ⊇ U2 ⊇ U3 ⊇ U4)."""

    round_id: int
    parts: list[str]
    t: int
    need: int   # max(t, min_clients): the fewest clients a stage may keep
    qp: QuantParams
    dim: int
    clock: _Stopwatch
    dropped_at: dict[str, str] = field(default_factory=dict)  # lost before its input was fixed
    late: dict[str, str] = field(default_factory=dict)        # input in the sum, client gone later (logs)
    offenders: dict[str, str] = field(default_factory=dict)   # client -> what it did wrong
    adv: dict[str, pb.AdvertiseKeys] = field(default_factory=dict)
    commits: dict[tuple[str, str], pb.ShareCommit] = field(default_factory=dict)  # (owner, holder) -> commit
    u1: list[str] = field(default_factory=list)
    u2: list[str] = field(default_factory=list)
    u3: list[str] = field(default_factory=list)
    acc: np.ndarray | None = None  # Σ_{u∈U3} y_u in words of qp.word_dtype

    def envelope(self, stage: int) -> int:
        """The transport round of ``stage`` of this aggregation round."""
        return envelope_round(self.round_id, stage)


class SecAggServer(AggregationServer):
    """Server role of Bonawitz et al. Fig. 4/5. ``aggregate`` returns Σ over U3 or raises AggregationError.

    Attributes:
        last_timings: seconds spent per stage in the last round (``"unmask"`` = reconstruction + PRGs,
            ``"bounds"`` = the check of the unmasked sum, :mod:`.bounds`).
    """

    def __init__(self, transport, config: AggregationConfig):
        super().__init__(transport, config)
        self.last_timings: dict[str, float] = {}
        self._past_keys: deque[set[bytes]] = deque(maxlen=KEY_MEMORY_ROUNDS)

    def aggregate(self, round_id: int, participants: Sequence[str], dim: int) -> AggregateResult:
        """Run the five stages of round ``round_id``; returns Σ_{u∈U3} (dequantised) with who dropped where.

        Raises:
            AggregationError: a selection the job does not allow, or too few clients left at a stage.
            OutOfRangeRound: the unmasked sum breaks the bounds of honest, clipped inputs (:mod:`.bounds`).
        """
        cfg = self.config
        parts, t = check_round(participants, cfg, server_id=self.party_id)
        n = len(parts)
        rnd = _ServerRound(round_id, parts, t, max(t, cfg.min_clients), cfg.quant_params(n, dim), dim, _Stopwatch())
        self.last_timings = rnd.clock.laps
        live = self.advertise_keys(rnd)
        live = self.share_keys(rnd, live)
        live = self.masked_input_collection(rnd, live)
        live = self.consistency_check(rnd, live)
        self.unmasking(rnd, live)
        check_sum(rnd.acc, rnd.qp, len(rnd.u3), round_id, zero_weight_ok=cfg.zero_weight_ok)
        rnd.clock.lap("bounds")
        total, weight, n_clipped = dequantise(rnd.acc, rnd.qp)
        if rnd.late:
            log.info("round %d: clients %s left after sending their input (still in the sum)", round_id, rnd.late)
        res = AggregateResult(total, weight, rnd.u3, sorted(rnd.dropped_at), rnd.qp.clip, rnd.qp.scale, rnd.qp.k_bits,
                              n_clipped, dict(rnd.dropped_at), dict(rnd.offenders))
        self._log_result(round_id, res)
        return res

    # ------------------------------------------------------------------------------ stages
    def advertise_keys(self, rnd: _ServerRound) -> list[str]:
        """Stage 0: collect every participant's advertisement, refuse the invalid ones (offenders, dropped
        here), and send U1's advertisements, verbatim, to U1.

        Returns the clients of U1 the key list reached.
        """
        rnd.adv = collect(self.t, rnd.parts, TAG_ADVERTISE, rnd.envelope(0), self.config.input_timeout_s,
                          parse_message(pb.AdvertiseKeys, lambda m: round_check(m, rnd.round_id, "AdvertiseKeys")))
        refused = self._refuse_bad_adverts(rnd)
        send_all(self.t, refused, TAG_SERVER, rnd.envelope(1), {c: pb.ServerMessage(  # they stop now, not at a deadline
            round_id=rnd.round_id, stage=1, abort=f"your AdvertiseKeys was refused: {rnd.offenders[c]}")
            for c in refused}, self.config.stage_timeout_s)
        rnd.u1 = self._survive(rnd, rnd.parts, rnd.adv, 0)
        keylist = pb.KeyList(keys=[pb.ClientKeys(client_id=c, advert=rnd.adv[c]) for c in rnd.u1])
        live = self._broadcast(rnd, rnd.u1, 1, pb.ServerMessage(round_id=rnd.round_id, stage=1, keys=keylist))
        rnd.clock.lap("advertise")
        return live

    def share_keys(self, rnd: _ServerRound, live: list[str]) -> list[str]:
        """Stage 1: collect each client's encrypted shares (U2) and forward to each v those addressed to v.

        Returns the clients of U2 their shares reached.
        """
        def parse_for(sender):
            def check(m):
                round_check(m, rnd.round_id, "ShareKeys")
                to = [e.recipient for e in m.shares]
                if sorted(to) != sorted(set(rnd.u1) - {sender}) or any(e.sender != sender for e in m.shares):
                    raise ProtocolError(f"shares must go from {sender!r} to each other client of U1 once")
                if any(len(e.nonce) != 12 or len(e.ciphertext) != SHARE_CIPHERTEXT for e in m.shares):
                    raise ProtocolError("share ciphertext or nonce has the wrong length")
                if any(len(c.b) != 32 or len(c.s) != 32 for c in [m.own, *(e.commit for e in m.shares)]):
                    raise ProtocolError("share commitments must be 32 bytes")
                return m
            return parse_message(pb.ShareKeys, check)
        shares = collect_each(self.t, live, TAG_SHARE, rnd.envelope(1), self.config.stage_timeout_s, parse_for)
        rnd.u2 = u2 = self._survive(rnd, rnd.u1, shares, 1)
        to_each: dict[str, list] = {v: [] for v in u2}   # in sender order (u2), one pass over all shares
        for u in u2:
            rnd.commits[(u, u)] = shares[u].own
            for e in shares[u].shares:
                rnd.commits[(u, e.recipient)] = e.commit
                if e.recipient != u and e.recipient in to_each:
                    to_each[e.recipient].append(e)
        per_recipient = {v: pb.ServerMessage(round_id=rnd.round_id, stage=2, shares=pb.ShareList(shares=to_each[v]))
                         for v in u2}
        live = self._broadcast(rnd, u2, 2, per_recipient)
        rnd.clock.lap("share_keys")
        return live

    def masked_input_collection(self, rnd: _ServerRound, live: list[str]) -> list[str]:
        """Stage 2: collect y_u (U3), sum them into ``rnd.acc``, send U3 to every client of U2.

        Returns the clients of U3 the survivor list reached (they are asked to unmask).
        """
        qp, dim = rnd.qp, rnd.dim

        def check(m):
            round_check(m, rnd.round_id, "MaskedInput")
            if m.k_bits != qp.k_bits:
                raise ProtocolError(f"k_bits {m.k_bits}, expected {qp.k_bits}")
            return tensor_from_proto(m.y, dtype=qp.word_dtype.str, shape=(dim + EXTRA_COORDS,), what="masked input")
        masked = collect(self.t, live, TAG_MASKED, rnd.envelope(2), self.config.stage_timeout_s,
                         parse_message(pb.MaskedInput, check))
        rnd.u3 = self._survive(rnd, rnd.u2, masked, 2)
        rnd.acc = np.zeros(dim + EXTRA_COORDS, dtype=qp.word_dtype)  # the clients' word size (see _mask)
        for c in rnd.u3:
            rnd.acc += masked[c]
        del masked
        # U2 \ U3 also get the list, so a client whose input was refused stops at once
        unreachable = send_all(self.t, live, TAG_SERVER, rnd.envelope(3), pb.ServerMessage(
            round_id=rnd.round_id, stage=3, survivors=pb.ClientList(clients=rnd.u3)), self.config.stage_timeout_s)
        rnd.clock.lap("masked_input")
        return [c for c in rnd.u3 if c not in unreachable]

    def consistency_check(self, rnd: _ServerRound, live: list[str]) -> list[str]:
        """Stage 3 (only with ``config.consistency_check``): collect signatures of U3 (U4), forward them.

        Returns the clients asked to unmask: U4 reached by the signatures (``live`` when the check is off).
        """
        if not self.config.consistency_check:
            return live
        signed = survivors_bytes(self.t.job_id, rnd.round_id, rnd.u3)

        def parse_for(sender):
            def check(m):
                round_check(m, rnd.round_id, "ConsistencySignature")
                if not verify_signature(rnd.adv[sender].signing_pk, m.signature, signed):
                    raise ProtocolError(f"invalid signature of the survivor set from {sender!r}")
                return m.signature
            return parse_message(pb.ConsistencySignature, check)
        sigs = collect_each(self.t, live, TAG_SIGN, rnd.envelope(3), self.config.stage_timeout_s, parse_for)
        for c in live:
            if c not in sigs:
                rnd.late[c] = STAGE_NAMES[3]
        u4 = sorted(sigs)
        if len(u4) < rnd.need:
            self._fail_late(rnd, 3, u4)
        live = self._broadcast(rnd, u4, 4, pb.ServerMessage(round_id=rnd.round_id, stage=4, signatures=pb.SignatureList(
            signatures=sigs, survivors=rnd.u3)))
        rnd.clock.lap("consistency")
        return live

    def unmasking(self, rnd: _ServerRound, live: list[str]) -> None:
        """Stage 4: collect shares of b_v (v ∈ U3) and s_v^SK (v ∈ U2 \\ U3), drop those of holders whose
        shares do not match the dealers' commitments; remove every mask from ``rnd.acc``."""
        u3_set, dropped = set(rnd.u3), set(rnd.u2) - set(rnd.u3)

        def check(m):
            round_check(m, rnd.round_id, "UnmaskResponse")
            b = {e.owner: shamir.from_bytes(e.value) for e in m.b_shares}
            s = {e.owner: shamir.from_bytes(e.value) for e in m.s_shares}
            if len(b) != len(m.b_shares) or len(s) != len(m.s_shares):
                raise ProtocolError("duplicate share owners")
            if not set(b) <= u3_set or not set(s) <= dropped:
                raise ProtocolError("b-shares must be of survivors and s-shares of dropped clients only")
            return _UnmaskShares(b, s)
        resp = collect(self.t, live, TAG_UNMASK, rnd.envelope(4), self.config.stage_timeout_s,
                       parse_message(pb.UnmaskResponse, check))
        for c in live:
            if c not in resp:
                rnd.late[c] = STAGE_NAMES[4]
        self._drop_uncommitted_shares(rnd, resp)
        if len(resp) < rnd.t:
            self._fail_late(rnd, 4, sorted(resp))
        rnd.clock.lap("collect_unmask")
        points = share_points(rnd.parts)
        b_shares = {v: {points[c]: r.b[v] for c, r in resp.items() if v in r.b} for v in rnd.u3}
        s_shares = {v: {points[c]: r.s[v] for c, r in resp.items() if v in r.s} for v in sorted(dropped)}
        self._remove_self_masks(rnd, b_shares)
        self._remove_pairwise_masks(rnd, s_shares)
        rnd.acc &= rnd.acc.dtype.type(rnd.qp.modulus_mask)
        rnd.clock.lap("unmask")

    # ------------------------------------------------------------------------------ helpers
    def _survive(self, rnd: _ServerRound, expected: Sequence[str], got, stage: int) -> list[str]:
        """The clients of ``expected`` in ``got``; the others dropped at ``stage``; abort below t."""
        alive = sorted(c for c in expected if c in got)
        for c in expected:
            if c not in got:
                rnd.dropped_at.setdefault(c, STAGE_NAMES[stage])
        if len(alive) < rnd.need:
            reason = self._fail_reason(rnd, stage, alive, rnd.dropped_at)
            log.error("round %d: %s", rnd.round_id, reason)
            abort = pb.ServerMessage(round_id=rnd.round_id, stage=stage + 1, abort=reason)
            send_all(self.t, alive, TAG_SERVER, rnd.envelope(stage + 1), abort, self.config.stage_timeout_s)
            raise AggregationError(reason)
        return alive

    def _refuse_bad_adverts(self, rnd: _ServerRound) -> list[str]:
        """Drop (as offenders at AdvertiseKeys) clients whose advertisement is invalid, or whose public keys
        another client of this round also advertised, or that were advertised in the last rounds.

        Returns the refused clients."""
        identity = self.t.identity
        if identity is None:
            warn_unauthenticated(self.party_id)
        verifier = identity.verifier if identity is not None else None
        for c, m in list(rnd.adv.items()):
            try:
                check_advert(self.t.job_id, rnd.round_id, c, m, verifier)
            except ValueError as exc:
                self._offend(rnd, c, 0, f"invalid AdvertiseKeys: {exc}")
        owners: dict[bytes, set[str]] = {}
        for c, m in rnd.adv.items():
            for key in (m.c_pk, m.s_pk):
                owners.setdefault(key, set()).add(c)
        past = set().union(*self._past_keys)
        self._past_keys.append(set(owners))
        for key, holders in owners.items():
            if len(holders) > 1 or key in past:
                for c in sorted(holders):
                    self._offend(rnd, c, 0, f"public key {key[:8].hex()}... " + (
                        f"advertised by {sorted(holders)}" if len(holders) > 1 else "reused from an earlier round"))
        for c in rnd.offenders:
            rnd.adv.pop(c, None)
        return sorted(rnd.offenders)

    def _drop_uncommitted_shares(self, rnd: _ServerRound, resp: dict[str, _UnmaskShares]) -> None:
        """Remove from ``resp`` every holder with a share that does not match its dealer's commitment
        (the holder checked that commitment when it accepted the share, so the holder is the offender)."""
        job, rid = self.t.job_id, rnd.round_id
        for c, r in list(resp.items()):
            bad = sorted({u for kind, shares in (("b", r.b), ("s", r.s)) for u, value in shares.items()
                          if (u, c) not in rnd.commits
                          or share_commitment(kind, job, rid, u, c, value) != getattr(rnd.commits[(u, c)], kind)})
            if bad:
                self._offend(rnd, c, 4, f"submitted shares of {bad} that do not match their dealers' "
                                        f"commitments; all its shares are ignored")
                del resp[c]

    def _offend(self, rnd: _ServerRound, client: str, stage: int, reason: str) -> None:
        """Record ``client`` as an offender (first reason kept); before its input was fixed it drops here."""
        rnd.offenders.setdefault(client, reason)
        if stage < 2:
            rnd.dropped_at.setdefault(client, STAGE_NAMES[stage])
        log.warning("round %d: client %s refused at %s: %s", rnd.round_id, client, STAGE_NAMES[stage], reason)

    @staticmethod
    def _offender_note(rnd: _ServerRound) -> str:
        return f" (shares of offenders ignored: {rnd.offenders})" if rnd.offenders else ""

    def _broadcast(self, rnd: _ServerRound, receivers: list[str], stage: int, msgs) -> list[str]:
        """Send the stage-``stage`` server message(s); the unreachable drop at ``stage``. Returns the reached."""
        failed = send_all(self.t, receivers, TAG_SERVER, rnd.envelope(stage), msgs, self.config.stage_timeout_s)
        for c in failed:
            rnd.dropped_at.setdefault(c, STAGE_NAMES[stage])
        return [c for c in receivers if c not in failed]

    def _fail_late(self, rnd: _ServerRound, stage: int, alive: list[str]) -> None:
        """Raise AggregationError for fewer than t answers after U3 was fixed (signers are told first)."""
        reason = self._fail_reason(rnd, stage, alive, {**rnd.dropped_at, **rnd.late})
        log.error("round %d: %s", rnd.round_id, reason)
        if stage == 3:  # the signers wait for the signature list
            send_all(self.t, alive, TAG_SERVER, rnd.envelope(4),
                     pb.ServerMessage(round_id=rnd.round_id, stage=4, abort=reason), self.config.stage_timeout_s)
        raise AggregationError(reason)

    def _fail_reason(self, rnd: _ServerRound, stage: int, alive: list[str], dropped: dict[str, str]) -> str:
        """The error text of a round left with too few clients at ``stage`` (with the offenders, if any)."""
        reason = fail_message(STAGE_NAMES[stage], rnd.parts, alive, rnd.t, dropped, self.config.min_clients)
        return reason + (f"; offenders: {rnd.offenders}" if rnd.offenders else "")

    def _remove_self_masks(self, rnd: _ServerRound, b_shares: dict[str, dict[int, int]]) -> None:
        """Reconstruct b_v for each v ∈ U3 from >= t shares and subtract PRG(b_v) from ``rnd.acc``."""
        job = self.t.job_id
        for v in rnd.u3:
            sh = b_shares[v]
            if len(sh) < rnd.t:
                raise AggregationError(f"cannot unmask {v!r}: {len(sh)} valid b-shares received, t={rnd.t} "
                                       f"needed{self._offender_note(rnd)}")
            b = shamir.reconstruct(sh, rnd.t)
            seed = b.to_bytes(32, "big") if b < 1 << 256 else b""
            if seed_commitment(job, rnd.round_id, v, seed) != rnd.adv[v].b_commit:
                raise AggregationError(f"client {v!r} dealt inconsistent shares of its self-mask seed: the seed "
                                       f"reconstructed from shares matching its commitments does not match its "
                                       f"advertised commitment; round {rnd.round_id} cannot be unmasked")
            rnd.acc -= prg(seed, rnd.acc.size, rnd.acc.dtype)

    def _remove_pairwise_masks(self, rnd: _ServerRound, s_shares: dict[str, dict[int, int]]) -> None:
        """Reconstruct s_v^SK of each dropped v ∈ U2 \\ U3 (checked against s_v^PK); cancel its PRG(s_uv)."""
        job, acc = self.t.job_id, rnd.acc
        for v, sh in s_shares.items():
            if len(sh) < rnd.t:
                raise AggregationError(f"cannot remove masks of dropped {v!r}: {len(sh)} valid s-shares, t={rnd.t} "
                                       f"needed{self._offender_note(rnd)}")
            try:
                s_v = private_from_int(shamir.reconstruct(sh, rnd.t))
            except ValueError as exc:
                raise AggregationError(f"client {v!r} dealt inconsistent shares of its mask key: the "
                                       f"reconstructed key is invalid ({exc})") from None
            if s_v.public_key().public_bytes_raw() != rnd.adv[v].s_pk:
                raise AggregationError(f"client {v!r} dealt inconsistent shares of its mask key: the key "
                                       f"reconstructed from shares matching its commitments does not match its "
                                       f"advertised s_pk; round {rnd.round_id} cannot be unmasked")
            for u in rnd.u3:
                p = prg(mask_seed(s_v, rnd.adv[u].s_pk, job, rnd.round_id, u, v), acc.size, acc.dtype)
                if u < v:  # u added +PRG(s_uv)
                    acc -= p
                else:
                    acc += p
