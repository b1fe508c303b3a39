"""Secure aggregation: Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning", CCS 2017 — the protocol of Fig. 4 with the ConsistencyCheck round, in the actively secure
variant of Sec. 6 (Fig. 5): advertisements signed under a PKI (the job CA of the mutual-TLS
certificates), plus hash commitments to every share and to the self-mask seed so that a dishonest
client cannot corrupt the sum unnoticed.

Stages (envelope round = round_id * 16 + stage; client -> server tags ``agg.advertise``,
``agg.share``, ``agg.masked``, ``agg.sign``, ``agg.unmask``; server -> client tag ``agg.server``):

0. AdvertiseKeys — each client u makes two X25519 key pairs, (c_u^PK, c_u^SK) for share encryption
   and (s_u^PK, s_u^SK) for pairwise masks, an Ed25519 key for its ConsistencyCheck signature, and
   draws the self-mask seed b_u (256 bits). It sends c_u^PK, s_u^PK, the Ed25519 key and the
   commitment H(b_u) (:func:`seed_commitment`), signed (ECDSA P-256/SHA-256, :func:`advert_bytes`)
   with the private key of its CA-issued certificate, which it attaches
   (:class:`~secureflhv.transport.identity.PartyIdentity`). The server validates each advertisement
   (:func:`check_advert`: keys of large order, certificate chains to the job CA, is in date, names
   the client, signature valid) and refuses keys that two clients advertise or that were advertised
   in the last rounds; a refused client is an *offender* and drops here. U1 = the valid ones (>= t).
   The server relays U1's advertisements verbatim; every client verifies every one of them the same
   way and aborts the round naming the client if one fails (a server that validates cannot relay a
   bad one, so it is lying; going on with a partial view would leave clients with inconsistent masks).
1. ShareKeys — u Shamir-shares b_u and s_u^SK t-of-|U1| over GF(2^521 - 1)
   (:mod:`secureflhv.crypto.shamir`); for each v it sends the share pair AES-256-GCM-encrypted under
   HKDF(X25519(c_u^SK, c_v^PK)) with commitments to the two plaintext shares
   (:func:`share_commitment`, bound to job, round, u, v), the commitments also in the associated data
   (:func:`share_pair_ad`); it also sends the commitments to the pair it keeps. The server forwards to
   each v the ciphertexts addressed to it; v refuses (and logs) a pair that fails AES-GCM or does not
   match its commitments — it then holds no share of u, the others' shares suffice. U2 = clients whose
   shares arrived.
2. MaskedInputCollection — u sends y_u = x_u + PRG(b_u) + Σ_{v∈U2, u<v} PRG(s_uv) − Σ_{v∈U2, u>v}
   PRG(s_uv) mod 2^k, s_uv = HKDF(X25519(s_u^SK, s_v^PK)); PRG = AES-256-CTR (see
   :mod:`secureflhv.crypto.secagg_primitives`). x_u is the quantised weighted update with the weight and
   the clipped count appended (:mod:`secureflhv.crypto.quantise`). U3 = clients whose y arrived.
3. ConsistencyCheck (on by default) — the server sends U3; each client checks U3 ⊆ U2 and
   |U3| >= t, signs (job, round, U3) with its Ed25519 key (authenticated by stage 0), and unmasks only
   after verifying >= t valid signatures of that same U3 from clients of U3. With t > n/2 two
   disjoint sets of t signers cannot exist, so a server cannot show different survivor sets to two
   halves of the clients (which would get b-shares of a victim from one half and its s-shares from
   the other).
4. Unmasking — each client answers one unmask request per round, with its shares of b_v for v ∈ U3
   and of s_v^SK for v ∈ U2 \\ U3 (it computes these sets itself: never both for one v). The server
   checks every share against its dealer's commitment: a mismatch makes the *holder* an offender (it
   had checked that commitment on receipt), all of its shares are ignored, and the round goes on when
   >= t valid shares remain for every secret (else AggregationError naming the offender). It
   reconstructs b_v (v ∈ U3) and checks it against v's committed H(b_v), and s_v^SK (v dropped) against
   s_v^PK — a mismatch means v dealt shares off its polynomial: AggregationError naming v. Then it
   removes PRG(b_v) and the dropped clients' pairwise masks and obtains Σ_{u∈U3} x_u mod 2^k.

Dropout: any client may vanish at any stage (the server detects it by the per-stage deadline, or a
failed send); the round completes as long as >= max(t, min_clients) clients remain at every stage,
else :class:`~secureflhv.secagg.result.AggregationError` names the stage and who dropped where.
Unlike Flower's SecAgg+ implementation, a drop during key set-up does not abort the round.

Threat model and what each role learns. *Server*: the participants' public keys and certificates,
who dropped or offended at which stage, the sum Σ_{u∈U3} (weight_u · clip(x_u)) quantised, Σ weight_u
and the total number of clipped coordinates — nothing else about an individual x_u: each y_u is
uniform in Z_{2^k}^d given its view, b_u (u ∈ U3) stays hidden, the dropped clients' pairwise masks
are removed only after y is fixed, and the commitments hide what they commit to (b_u and each share
have >= 256 bits of min-entropy; shares are uniform because t >= 2). This holds for a *malicious*
server colluding with fewer than 2t − n clients (Bonawitz et al. Thm. 6.5: t > (n + n_C)/2) when
every party has a certificate identity: it cannot substitute a client's keys (signature), show two
survivor sets (ConsistencyCheck), ask twice (one answer per round; the transport refuses a replayed
request), or list survivors outside U2 or fewer than t (clients refuse). It can still abort rounds,
drop honest clients, and choose which clients are in U3. A semi-honest server colluding with < t
clients learns nothing more either; >= t colluders can reconstruct b_u and s_u and so x_u. *Clients*:
a client learns the others' advertisements (public keys, certificates, commitments), U2, U3, the
signatures of U3, and t-1 or fewer shares of each other client's secrets, which reveal nothing.
*Dishonest clients* cannot crash honest ones (bad keys are refused at the server and, if relayed,
abort cleanly with a named offender), nor make the server return a wrong sum by corrupting shares
(detected by commitments; the round ends exact or with an error naming the offender). What no
secure-aggregation protocol prevents: a client may submit any input it likes (e.g. y_u masked with a
seed other than its committed b_u is just another, garbage, input), so the sum is the sum of what
the clients submitted — bound inputs by validation elsewhere if needed; and the stochastic-rounding
noise is not differential privacy.

Without certificate identities (``insecure`` gRPC, or an :class:`InProcessNetwork` without
``cert_dir``) the protocol still runs, logging once per party that advertisements are
unauthenticated: it is then secure against a semi-honest server only (a server could substitute keys).
With ``consistency_check=False`` likewise.

Roles: :class:`~secureflhv.secagg.bonawitz_client.SecAggClient` and
:class:`~secureflhv.secagg.bonawitz_server.SecAggServer`; their methods are the stages above. This
module holds what both sides derive alike (tags, signed and committed bytes, key derivation, share
points, advertisement checks).

Parameters: n/2 < t <= n; min_clients >= 2; field
p = 2^521 − 1 (> 2^256, holds every secret); k from :func:`secureflhv.crypto.quantise.choose_k_bits`;
PRG AES-256-CTR keyed by a full 256-bit seed; commitments SHA-256 with domain labels.
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
