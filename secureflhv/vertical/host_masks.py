"""Zero-sum masks on the hosts' encrypted partial scores (vertical LR, arbiter mode, two or more hosts).

Why: in arbiter mode every host sends the guest [[u_h]] = Enc(X_h w_h) under the arbiter's key, and the
arbiter decrypts whatever (masked) ciphertext the guest asks it to. A guest that asks for one host's
[[u_h]] alone (in a prediction request, or in a training batch's gradient or loss request: the arbiter
cannot tell) would learn u_h row by row. With these masks each host sends instead

    [[u~_h]] = Enc(enc(u_h) + m_h),   m_h = sum_{k != h} sign(h, k) * PRG(s_hk, context, row)

on the fixed-point mantissas enc(u) = rint(u * 2^precision_bits), sign(h, k) = +1 if h < k (party ids,
as strings) else -1, so sum_h m_h = 0 over the integers and sum_h u~_h = sum_h enc(u_h) exactly: the
total the guest is entitled to is bit for bit the unmasked one. Any part of fewer than all hosts
decrypts to noise. (Pairwise masks as in Bonawitz et al., CCS 2017, Sec. 3, without the dropout
recovery: a vertical job stops when a host is lost.)

Masks are integers, uniform in [0, 2^W) per pair, W = precision_bits + SCORE_BITS + HIDE_BITS, not
uniform in Z_n: OU's plaintext order is secret, and integer masks keep the cross-term products of the
loss (:mod:`secureflhv.vertical.lr`) cheap (W-bit exponents instead of |n|-bit ones). A host refuses
to send a score with |u| >= 2^SCORE_BITS, so each masked value is within statistical distance
2^-HIDE_BITS of a distribution independent of u_h (the same statistical hiding as OU's decryption
masks, :class:`secureflhv.crypto.homomorphic.backend.OUHE`).

Key agreement: each host draws a fresh X25519 key pair per session (a training run, or a prediction
service) and sends the public key *directly* to every other host listed in the job file (tag
``vlr.mask_key``); the transport authenticates the sender (mutual TLS: the certificate's CN is the
sender, :mod:`secureflhv.transport.grpc_transport`), so no party can substitute a key, and the guest
never relays one. s_hk = HKDF-SHA256(X25519(sk_h, pk_k), "secureflhv-vlr-host-mask" | job | h | k);
per value the PRG (AES-256-CTR, :func:`secureflhv.crypto.secagg_primitives.prg`) is keyed with
HKDF(s_hk, context | row): fresh per (job, session, phase, batch or request, row). Prediction masks are
keyed by the row *index*, so a guest that asks different hosts for different rows in one request gets
noise too.

What each role learns: the guest, from any combination of the hosts' masked parts, only their sum per
row (as without masks when it follows the protocol); the arbiter nothing new; a host nothing about the
others (it sees no other host's scores). With three or more hosts, a guest colluding with hosts learns
nothing about the honest hosts' individual parts beyond their sum (each honest pair's mask is unknown
to it). Not covered: a host that deviates and asks the arbiter to decrypt a ciphertext the guest gave it
(the cross-term input below, or [[d]]) -- arbiter mode trusts the arbiter to serve only the protocol's
requests, and cannot tell them apart (``docs/security.md``).
"""
from __future__ import annotations

from typing import Sequence

import gmpy2
import numpy as np

from ..crypto.homomorphic import paillier as pl
from ..crypto.homomorphic.paillier_encoding import encode_mantissas
from ..crypto.secagg_primitives import KeyPair, agree, check_public_key, derive_key, prg
from ..proto import messages_pb2
from ..transport import ProtocolError, Transport, parse_message

TAG_MASK_KEY = "vlr.mask_key"
SCORE_BITS = 48  # a host refuses to mask (and send) a partial score with |u| >= 2^48
HIDE_BITS = 40  # statistical hiding parameter of every mask
_LABEL = "secureflhv-vlr-host-mask"
_LIMB = 62  # paillier.dot takes int64 multipliers below 2^62
_LIMB_MASK = (1 << _LIMB) - 1


def mask_bits(precision_bits: int) -> int:
    """W: bits of each pairwise mask (values are uniform in [0, 2^W))."""
    return precision_bits + SCORE_BITS + HIDE_BITS


def _key_parser(sender: str):
    def validate(m: messages_pb2.Bundle):
        hexkey = m.text.get("x25519", "")
        if set(m.text) != {"x25519"} or m.scalars or m.tensors or m.encrypted or len(hexkey) != 64:
            raise ProtocolError(f"{TAG_MASK_KEY} from {sender}: needs text 'x25519' (64 hex digits) only")
        try:
            key = bytes.fromhex(hexkey)
            check_public_key(key)
        except ValueError as exc:
            raise ProtocolError(f"{TAG_MASK_KEY} from {sender}: {exc}") from None
        return key
    return parse_message(messages_pb2.Bundle, validate)


class HostMasks:
    """One host's pairwise mask seeds with every other host of the job, for one session.

    Args:
        transport: the host's transport (its ``party_id`` and ``job_id`` enter every seed).
        host_ids: every host of the job (from the job file, this host included).
        precision_bits: fraction bits of the masked mantissas (sets W, :func:`mask_bits`).
    Raises ValueError when this host is not in ``host_ids`` or there is no other host.
    """

    def __init__(self, transport: Transport, host_ids: Sequence[str], precision_bits: int):
        self.t = transport
        self.me = transport.party_id
        if self.me not in host_ids or len(set(host_ids)) < 2:
            raise ValueError(f"host_ids: host masks need this host ({self.me!r}) and another, got {list(host_ids)}")
        self.others = sorted(set(host_ids) - {self.me})
        self.bits = mask_bits(precision_bits)
        self._words = -(-self.bits // 64)
        self._seeds: dict[str, bytes] = {}

    def agree(self) -> "HostMasks":
        """Exchange fresh X25519 public keys with every other host (direct, authenticated channels) and
        derive the pair seeds. Raises PeerTimeout naming a host that sends no valid key in time."""
        kp = KeyPair()
        msg = messages_pb2.Bundle(text={"x25519": kp.public.hex()})
        for h in self.others:
            self.t.send(h, TAG_MASK_KEY, msg, round=0)
        for h in self.others:
            peer = self.t.recv(h, TAG_MASK_KEY, round=0, parse=_key_parser(h))
            self._seeds[h] = derive_key(agree(kp.private, peer), _LABEL, self.t.job_id, *sorted((self.me, h)))
        return self

    def masks(self, context: Sequence, rows: Sequence[int], width: int) -> list[int]:
        """m_h for ``len(rows) * width`` values (row-major): the sum over all hosts of the job is 0.

        ``context``: what makes the masks fresh (phase, round, ...); ``rows``: the row index of each
        group of ``width`` values (prediction: the index in the prediction set)."""
        out = [0] * (len(rows) * width)
        top, words = (1 << self.bits) - 1, self._words
        for h, seed in self._seeds.items():
            sign = 1 if self.me < h else -1
            for i, row in enumerate(rows):
                stream = prg(derive_key(seed, "row", *context, int(row)), words * width).tobytes()
                for c in range(width):
                    v = int.from_bytes(stream[8 * words * c:8 * words * (c + 1)], "little") & top
                    out[i * width + c] += sign * v
        return out


def check_scores(u: np.ndarray, who: str) -> None:
    """ValueError unless every |u| < 2^SCORE_BITS (the bound the masks hide within 2^-HIDE_BITS)."""
    if u.size and not np.max(np.abs(u)) < 2.0 ** SCORE_BITS:
        raise ValueError(f"{who}: a partial score of {float(np.max(np.abs(u))):.3g} exceeds 2^{SCORE_BITS}; "
                         f"the host masks would not hide it (diverging weights?)")


def encrypt_masked(he, pub, u: np.ndarray, masks: list[int]):
    """[[enc(u) + masks]] at exponent -precision_bits, shape of ``u`` (the identity backend: plain u,
    no security there anyway). The masks are added to a fresh encryption (g^m with g = n + 1 for
    Paillier, G^m for OU), so the result is a fresh encryption of the masked mantissas."""
    enc = he.encrypt(pub, u)
    if he.name == "identity":
        return enc
    n2 = pub.nsquare
    flat = enc.ciphertexts.reshape(-1).tolist()
    adder = getattr(pub, "add_plain_raw", None)  # OU adds its own way (range-checked)
    if adder is not None:
        out = adder(flat, masks)
    else:
        n = pub.n
        out = [c * (1 + (m % n) * n) % n2 for c, m in zip(flat, masks)]
    arr = np.empty(len(out), dtype=object)
    arr[:] = out
    return pl.EncryptedArray(pub, arr.reshape(enc.shape), enc.exponent)


def masked_mantissas(he, u: np.ndarray, masks: list[int]) -> list:
    """The host's own u~ = enc(u) + masks as Python ints, C order (the multiplier of its cross term;
    the identity backend: the plain values)."""
    if he.name == "identity":
        return np.asarray(u, dtype=np.float64).ravel().tolist()
    return [int(a) + b for a, b in zip(encode_mantissas(u, he.precision_bits, 1 << 4096), masks)]


def int_dot(he, enc, ints: list, exponent: int):
    """[[sum_i ints_i * v_i]] (1,) for ciphertexts ``enc`` of v (any shape, C order) and Python ints of
    any size and sign, read at ``exponent`` (the identity backend: the plain float dot).

    The ints are cut into signed 62-bit limbs, x_i = sum_l x_il 2^(62 l), so the multi-exponentiation is
    :func:`secureflhv.crypto.homomorphic.paillier.dot`'s (bucket method, worker pool) once per limb; the limbs' results
    are then combined with one power of two each."""
    if he.name == "identity":
        return np.array([float(np.dot(np.asarray(enc, dtype=np.float64).ravel(), np.asarray(ints, dtype=float)))])
    flat = enc.reshape(-1)
    limbs = max(1, -(-max((abs(v).bit_length() for v in ints), default=1) // _LIMB))
    X = np.zeros((len(ints), limbs), dtype=np.int64)
    for i, v in enumerate(ints):
        a, sign = abs(v), (1 if v >= 0 else -1)
        for j in range(limbs):
            X[i, j] = sign * ((a >> (_LIMB * j)) & _LIMB_MASK)
    parts = pl.dot(X, flat, precision_bits=0).ciphertexts.tolist()  # (limbs,) at flat.exponent
    n2 = gmpy2.mpz(flat.public_key.nsquare)
    acc = gmpy2.mpz(1)
    for j, c in enumerate(parts):
        acc = acc * gmpy2.powmod(c, 1 << (_LIMB * j), n2) % n2
    arr = np.empty(1, dtype=object)
    arr[0] = acc
    return pl.EncryptedArray(flat.public_key, arr, exponent)


def cross_terms(he, V, ints: list, k: int, exponent: int):
    """A host's answer to the loss's quadratic: [[u~ . V]] for its masked mantissas ``ints`` (C order of
    (n_b, K)) and the guest's [[V]] (n_b,) or (n_b, K); for K > 1 also [[rowsum(u~) . rowsum(V)]].
    Shape (1,) or (2,) at ``exponent``."""
    out = [int_dot(he, V, ints, exponent)]
    if k > 1:
        out.append(int_dot(he, V.sum(axis=1), [sum(ints[i:i + k]) for i in range(0, len(ints), k)], exponent))
    if len(out) == 1:
        return out[0]
    return np.concatenate(out) if he.name == "identity" else pl.concatenate(out)
