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
:class:`~secureflhv.secagg.result.AggregationError` names the stage and who dropped where.
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

Roles: :class:`~secureflhv.secagg.bonawitz_client.SecAggClient` and
:class:`~secureflhv.secagg.bonawitz_server.SecAggServer`; their methods are the stages above. This
module holds what both sides derive alike (tags, binding strings, key derivation, share points).

Parameters: t defaults to ceil(2n/3); field p = 2^521 − 1 (> 2^256, holds every secret); k from
:func:`secureflhv.crypto.quantise.choose_k_bits`; PRG AES-256-CTR keyed by a full 256-bit seed.
"""
from __future__ import annotations

import logging
from typing import Sequence

from ..crypto import shamir
from ..crypto.secagg_primitives import agree, check_public_key, commitment, derive_key, share_ad

log = logging.getLogger("secureflhv.secagg.bonawitz")

TAG_ADVERTISE = "agg.advertise"
TAG_SHARE = "agg.share"
TAG_MASKED = "agg.masked"
TAG_SIGN = "agg.sign"
TAG_UNMASK = "agg.unmask"

STAGE_NAMES = ("AdvertiseKeys", "ShareKeys", "MaskedInputCollection", "ConsistencyCheck", "Unmasking")
SHARE_PLAINTEXT = 2 * shamir.SHARE_BYTES
SHARE_CIPHERTEXT = SHARE_PLAINTEXT + 16  # GCM tag


def advert_bytes(job: str, round_id: int, client: str, adv) -> bytes:
    """What a client's certificate key signs in AdvertiseKeys: job, round, its id, c^PK, s^PK, the
    Ed25519 ConsistencyCheck key and the commitment to b_u (each field length-prefixed)."""
    fields = (adv.c_pk, adv.s_pk, adv.signing_pk, adv.b_commit)
    return f"secagg-advertise|{job}|{round_id}|{client}|".encode() + b"".join(
        len(f).to_bytes(2, "big") + f for f in fields)


def check_advert(job: str, round_id: int, client: str, adv, verifier) -> None:
    """Validate one client's AdvertiseKeys (the server on arrival, every client on the relayed copy).

    Checks: c^PK and s^PK are 32-byte X25519 keys of large order and differ, the Ed25519 key and the
    b_u commitment are 32 bytes, and, with a ``verifier`` (:class:`~secureflhv.transport.identity.PeerVerifier`),
    the certificate is the job CA's for ``client`` and signs :func:`advert_bytes`.

    Raises:
        ValueError: names what is wrong (``IdentityError``, a ValueError, for the signature/certificate).
    """
    for name, pk in (("c_pk", adv.c_pk), ("s_pk", adv.s_pk)):
        try:
            check_public_key(pk)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    if adv.c_pk == adv.s_pk:
        raise ValueError("c_pk and s_pk are the same key")
    if len(adv.signing_pk) != 32 or len(adv.b_commit) != 32:
        raise ValueError(f"signing_pk and b_commit must be 32 bytes, got {len(adv.signing_pk)} and "
                         f"{len(adv.b_commit)}")
    if verifier is not None:
        verifier.verify(client, adv.certificate, adv.signature, advert_bytes(job, round_id, client, adv))


def seed_commitment(job: str, round_id: int, client: str, seed: bytes) -> bytes:
    """Commitment to ``client``'s self-mask seed b_u (in its signed AdvertiseKeys); checked after reconstruction."""
    return commitment("secagg-seed-commit", job, round_id, client, value=seed)


def share_commitment(kind: str, job: str, round_id: int, owner: str, holder: str, value: int) -> bytes:
    """Commitment to ``holder``'s Shamir share of ``owner``'s secret (``kind`` "b": b_owner, "s": s_owner^SK)."""
    return commitment("secagg-share-commit", kind, job, round_id, owner, holder, value=shamir.to_bytes(value))


def share_pair_ad(job: str, round_id: int, sender: str, recipient: str, commit) -> bytes:
    """AES-GCM associated data of a share pair: ids, round, and the dealer's commitments (``ShareCommit``),
    so the server cannot change the commitments it forwards without the recipient noticing."""
    return share_ad(job, round_id, sender, recipient) + commit.b + commit.s


_warned_unauthenticated: set[str] = set()


def warn_unauthenticated(party: str) -> None:
    """Log once per party that its AdvertiseKeys are not certificate-signed (semi-honest server only)."""
    if party not in _warned_unauthenticated:
        _warned_unauthenticated.add(party)
        log.warning("%s: no certificate identity on this transport: secure-aggregation key advertisements "
                    "are unauthenticated, so the protocol is secure against a semi-honest server only "
                    "(use mutual TLS or InProcessNetwork(cert_dir=...))", party)


def survivors_bytes(job: str, round_id: int, survivors: Sequence[str]) -> bytes:
    """What each client signs in ConsistencyCheck: the survivor set U3 of the round."""
    return "|".join(["secagg-survivors", job, str(round_id), *sorted(survivors)]).encode()


def share_key(private, peer_pk: bytes, job: str, round_id: int, a: str, b: str) -> bytes:
    """AES-256-GCM key of the shares between ``a`` and ``b``: HKDF(X25519(c_a^SK, c_b^PK))."""
    return derive_key(agree(private, peer_pk), "secagg-share-enc", job, round_id, *sorted((a, b)))


def mask_seed(private, peer_pk: bytes, job: str, round_id: int, a: str, b: str) -> bytes:
    """Seed s_ab of the pairwise mask between ``a`` and ``b``: HKDF(X25519(s_a^SK, s_b^PK))."""
    return derive_key(agree(private, peer_pk), "secagg-pairwise-mask", job, round_id, *sorted((a, b)))


def share_points(participants: Sequence[str]) -> dict[str, int]:
    """Shamir x-coordinate of each participant: 1 + its index in the sorted participant list."""
    return {p: i + 1 for i, p in enumerate(sorted(participants))}
