"""Homomorphic values on the wire: Paillier / OU public keys, ciphertexts and masked plaintexts
(docs/architecture.md, "One message, from the job file to the wire"). Plaintext arrays are
:mod:`secureflhv.transport.codec`'s; the other encoders are listed there.

OU (``he_scheme: ou``): :class:`OUCodec` below, the same messages with ``PaillierPublicKey.scheme = "ou"``.

Paillier encoding (messages.proto):

* ``PaillierPublicKey``: n as minimal big-endian bytes, ``fingerprint`` = SHA-256 of those bytes.
* ``EncryptedTensor``: the key's fingerprint, the shape, ``byte_width`` = bytes of n^2, the
  ciphertexts as fixed-width big-endian integers (C order), the fixed-point exponent, and for packed
  ciphertexts the packing layout (slots, slot_bits, slot_bound) and the summands bound.
* ``MaskedValues``: the key's fingerprint, shape, exponent and the raw residues in Z_n, fixed-width
  big-endian (width = bytes of n).

The identity backend (benchmarks only, NO encryption) sends the same messages with float64 payloads
(``byte_width`` 8, little-endian) under a fixed fingerprint, so a benchmark's messages and rounds are
those of the real protocol.

A receiver checks everything before the protocol sees a value: the key fingerprint, the shape (so the
ciphertext count) against the shape it expects, the fixed-point exponent against the one the protocol
agreed for that message, the byte counts, every ciphertext in Z*_{n^2}, every residue in Z_n, the
packing metadata, a peer's modulus (odd, not a square, no small factor, not prime, at least 2048 bits
unless the job allows test keys). The exponent check matters: aligning two ciphertexts of exponents e1 <
e2 costs an exponentiation by 2^(e2 - e1), so a peer-chosen exponent of 2^31 would stall the receiver for
hours; the codecs' ``exponent`` argument is therefore required (identity backend: always 0). The primitive functions raise :class:`~secureflhv.crypto.homomorphic.paillier.CiphertextError`; the
backend codecs (:func:`codec_for`) raise :class:`~secureflhv.transport.base.ProtocolError`, which makes
``Transport.recv`` reject and log the message and keep waiting.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

from ..crypto.homomorphic import ou
from ..crypto.homomorphic import paillier as pl
from ..crypto.homomorphic.backend import (VERTICAL_DOT_PRECISION_BITS, HEBackend, IdentityKey, MaskedValues,
                                          PairSums, make_backend)
from ..crypto.homomorphic.paillier import CiphertextError, PackingSpec
from ..crypto.homomorphic.paillier_engine import from_blob, to_blob
from ..proto import messages_pb2
from .base import ProtocolError, parse_message
from .codec import check_shape, shape_of, tensor_from_proto, tensor_to_proto


# --------------------------------------------------------------------------- Paillier primitives
def public_key_to_proto(pub: pl.PublicKey) -> messages_pb2.PaillierPublicKey:
    """``PaillierPublicKey`` of ``pub``: n as minimal big-endian bytes and its SHA-256 fingerprint.

    Raises nothing for a valid :class:`~secureflhv.crypto.homomorphic.paillier.PublicKey`; AttributeError for
    anything else (an identity key is encoded by :class:`IdentityCodec`).
    """
    return messages_pb2.PaillierPublicKey(n=pl.int_to_bytes(pub.n), fingerprint=pub.fingerprint)


def public_key_from_proto(msg, *, insecure_test_key: bool = False) -> pl.PublicKey:
    """Parse and validate a peer's key; raises CiphertextError (bad fingerprint, size, or modulus)."""
    n = int.from_bytes(bytes(msg.n), "big")
    if pl.key_fingerprint(n) != bytes(msg.fingerprint):
        raise CiphertextError("PaillierPublicKey.fingerprint does not match SHA-256 of n")
    return pl.PublicKey.from_peer(n, insecure_test_key=insecure_test_key, what="PaillierPublicKey.n")


def encrypted_to_proto(enc: pl.EncryptedArray) -> messages_pb2.EncryptedTensor:
    """Fixed-width big-endian ciphertexts (C order) with the key fingerprint and encoding metadata."""
    w = enc.public_key.byte_width
    data = to_blob(enc.ciphertexts.reshape(-1).tolist(), w)
    msg = messages_pb2.EncryptedTensor(key_fingerprint=enc.public_key.fingerprint, shape=list(enc.shape),
                                       byte_width=w, ciphertexts=data, exponent=enc.exponent)
    if enc.packing:
        msg.slots, msg.slot_bits = enc.packing.slots, enc.packing.slot_bits
        msg.slot_bound, msg.summands = enc.packing.slot_bound, enc.summands
    return msg


def encrypted_from_proto(msg, public_key: pl.PublicKey, expected_shape=None,
                         expected_exponent: int | None = None) -> pl.EncryptedArray:
    """Parse and validate; raises CiphertextError naming the bad field.

    Checks: key fingerprint, shape (if ``expected_shape``), exponent (if ``expected_exponent``), byte
    width, every ciphertext in Z*_{n^2}, packing metadata (see
    :meth:`~secureflhv.crypto.homomorphic.paillier.EncryptedArray.from_peer`). Protocol receivers go through
    :class:`PaillierCodec`, which requires the shape and exponent.
    """
    pk = public_key
    if bytes(msg.key_fingerprint) != pk.fingerprint:
        raise CiphertextError("EncryptedTensor.key_fingerprint does not match the expected public key")
    shape = shape_of(msg)
    if expected_shape is not None and shape != tuple(expected_shape):
        raise CiphertextError(f"EncryptedTensor.shape {shape} != expected {tuple(expected_shape)}")
    if expected_exponent is not None and int(msg.exponent) != int(expected_exponent):
        raise CiphertextError(f"EncryptedTensor.exponent {msg.exponent} != the agreed {expected_exponent}")
    w = pk.byte_width
    if msg.byte_width != w:
        raise CiphertextError(f"EncryptedTensor.byte_width {msg.byte_width} != {w} for this key")
    size = math.prod(shape)
    data = bytes(msg.ciphertexts)
    if len(data) != size * w:
        raise CiphertextError(f"EncryptedTensor.ciphertexts has {len(data)} bytes, expected {size * w}")
    ints = from_blob(data, w)
    packing = None
    if msg.slot_bits:
        try:
            packing = PackingSpec(int(msg.slots), int(msg.slot_bits), -int(msg.exponent), int(msg.slot_bound))
        except ValueError as e:
            raise CiphertextError(f"EncryptedTensor packing fields invalid: {e}") from None
    return pl.EncryptedArray.from_peer(pk, ints, shape, int(msg.exponent), packing, int(msg.summands),
                                       what="EncryptedTensor.ciphertexts")


def _split(data: bytes, width: int, count: int) -> list[int]:
    """Python ints (what :class:`~secureflhv.crypto.homomorphic.backend.MaskedValues` holds), not from_blob's mpz."""
    return [int.from_bytes(data[i * width:(i + 1) * width], "big") for i in range(count)]


# --------------------------------------------------------------------------- backend codecs
class HECodec(ABC):
    """Encoding of one :class:`~secureflhv.crypto.homomorphic.backend.HEBackend`'s keys and values.

    ``*_from_proto`` and the parsers raise ProtocolError naming ``what`` for a payload under another
    key, of the wrong shape or size, at another fixed-point exponent than ``exponent`` (the one the
    protocol agreed for this message; the identity backend's values always carry 0), or (Paillier)
    outside Z*_{n^2} / Z_n.
    """

    @abstractmethod
    def public_key_to_proto(self, pub) -> messages_pb2.PaillierPublicKey:
        """Encode a public key."""

    @abstractmethod
    def public_key_from_proto(self, msg, insecure_test_key: bool, what: str = "public key"):
        """A peer's public key (keys below 2048 bits only with ``insecure_test_key``)."""

    @abstractmethod
    def to_proto(self, enc) -> messages_pb2.EncryptedTensor:
        """Encode a ciphertext array."""

    @abstractmethod
    def from_proto(self, msg, pub, expected_shape, what: str, *, exponent: int):
        """A peer's ciphertext array under ``pub``, of ``expected_shape`` (None: any), at ``exponent``."""

    @abstractmethod
    def masked_to_proto(self, mv: MaskedValues, priv) -> messages_pb2.MaskedValues:
        """Encode the key holder's (``priv``) masked values."""

    @abstractmethod
    def masked_from_proto(self, msg, pub, expected_shape, what: str, *, exponent: int) -> MaskedValues:
        """The key holder's masked values for ciphertexts under ``pub`` at ``exponent`` (residues in Z_n)."""

    # SecureBoost (tree_pb2 messages): where the key, the row pairs and the candidate sums go
    @abstractmethod
    def put_setup_key(self, setup, pub) -> None:
        """Write the guest's public key into an SbSetup."""

    @abstractmethod
    def setup_key(self, setup, insecure_test_key: bool):
        """The guest's public key of an SbSetup (ProtocolError if unacceptable)."""

    @abstractmethod
    def put_pairs(self, part, rows) -> None:
        """Write encrypted (g, h) row pairs (:meth:`PairSums.encrypt` of some rows) into an SbRowPart."""

    @abstractmethod
    def pairs_from(self, part, pub, sums: PairSums, n: int):
        """The ``n`` row pairs of an SbRowPart (ProtocolError if they are not ``n`` pairs of ``sums``)."""

    @abstractmethod
    def join_pairs(self, parts: list):
        """The row pairs of consecutive parts (:meth:`pairs_from` results) as one input of
        :meth:`PairSums.histogram`."""

    @abstractmethod
    def pair_bytes(self, pub) -> int:
        """Bytes on the wire per row pair (sizes the parts within the job's message limit)."""

    @abstractmethod
    def put_pair_sums(self, msg, value) -> None:
        """Write the candidates' sums into an SbHistograms."""

    @abstractmethod
    def pair_sums_from(self, msg, pub, sums: PairSums, counts: list[int], what: str):
        """The candidate sums of an SbHistograms (input of :meth:`PairSums.decrypt`)."""

    # parse callbacks for Transport.recv
    def enc_parser(self, pub, shape, what: str, *, exponent: int):
        """A ``Transport.recv`` parse callback: :meth:`from_proto` of an EncryptedTensor (ProtocolError if bad)."""
        return parse_message(messages_pb2.EncryptedTensor,
                             lambda m: self.from_proto(m, pub, shape, what, exponent=exponent))

    def masked_parser(self, pub, shape, what: str, *, exponent: int):
        """A ``Transport.recv`` parse callback: :meth:`masked_from_proto` of a MaskedValues message."""
        return parse_message(messages_pb2.MaskedValues,
                             lambda m: self.masked_from_proto(m, pub, shape, what, exponent=exponent))

    def public_key_parser(self, insecure_test_key: bool, what: str = "public key"):
        """A ``Transport.recv`` parse callback: :meth:`public_key_from_proto` of a PaillierPublicKey message."""
        return parse_message(messages_pb2.PaillierPublicKey,
                             lambda m: self.public_key_from_proto(m, insecure_test_key, what))


def _check_fingerprint(msg, pub, what: str) -> None:
    if bytes(msg.key_fingerprint) != pub.fingerprint:
        raise ProtocolError(f"{what}: values for key {bytes(msg.key_fingerprint).hex()[:16]}, "
                            f"expected key {pub.fingerprint.hex()[:16]}")


def _check_exponent(msg, exponent: int, what: str) -> None:
    if int(msg.exponent) != int(exponent):
        raise ProtocolError(f"{what}: exponent {msg.exponent}, the protocol agreed {exponent}")


class PaillierCodec(HECodec):
    """Paillier keys and ciphertexts as above."""

    def public_key_to_proto(self, pub):
        """n as minimal big-endian bytes and its fingerprint."""
        return public_key_to_proto(pub)

    scheme = "paillier"

    def _check_scheme(self, msg, what: str) -> None:
        theirs = msg.scheme or "paillier"
        if theirs != self.scheme:
            raise ProtocolError(f"{what}: a key of scheme {theirs!r}, but this job uses he_scheme {self.scheme!r}")

    def public_key_from_proto(self, msg, insecure_test_key: bool, what: str = "public key"):
        """A peer's Paillier key, checked (scheme, fingerprint, a plausible modulus); ProtocolError naming ``what``."""
        self._check_scheme(msg, what)
        try:
            return public_key_from_proto(msg, insecure_test_key=insecure_test_key)
        except ValueError as exc:
            raise ProtocolError(f"{what}: {exc}") from exc

    def to_proto(self, enc):
        """An EncryptedArray as an EncryptedTensor (fixed-width big-endian ciphertexts, exponent, packing)."""
        return encrypted_to_proto(enc)

    def from_proto(self, msg, pub, expected_shape, what: str, *, exponent: int):
        """A peer's EncryptedTensor as an EncryptedArray, checked as the module docstring lists; ProtocolError
        naming ``what`` on any mismatch.
        """
        try:
            return encrypted_from_proto(msg, pub, None if expected_shape is None else tuple(expected_shape),
                                        int(exponent))
        except (ValueError, OverflowError) as exc:  # CiphertextError is a ValueError
            raise ProtocolError(f"{what}: {exc}") from exc

    def masked_to_proto(self, mv, priv):
        """MaskedValues as residues in Z_n, fixed width (bytes of n), big-endian."""
        w = (priv.public_key.n.bit_length() + 7) // 8
        return messages_pb2.MaskedValues(key_fingerprint=mv.key_fingerprint, shape=list(mv.shape), byte_width=w,
                                         values=to_blob(mv.values, w), exponent=mv.exponent)

    def masked_from_proto(self, msg, pub, expected_shape, what: str, *, exponent: int) -> MaskedValues:
        """A peer's MaskedValues, checked (fingerprint, shape, exponent, byte counts, every residue in Z_n);
        ProtocolError naming ``what``.
        """
        _check_fingerprint(msg, pub, what)
        check_shape(what, shape_of(msg), expected_shape)
        _check_exponent(msg, exponent, what)
        count = math.prod(shape_of(msg))
        w = msg.byte_width
        if w == 0 or w > (pub.n.bit_length() + 7) // 8 or len(msg.values) != count * w:
            raise ProtocolError(f"{what}: {len(msg.values)} bytes for {count} values of width {w}")
        vals = _split(msg.values, w, count)
        for i, v in enumerate(vals):
            if v >= pub.n:
                raise ProtocolError(f"{what}: value {i} is not in Z_n")
        return MaskedValues(bytes(msg.key_fingerprint), shape_of(msg), int(msg.exponent), vals)

    def put_setup_key(self, setup, pub):
        """Write the public key into ``setup.public_key``."""
        setup.public_key.CopyFrom(self.public_key_to_proto(pub))

    def setup_key(self, setup, insecure_test_key: bool):
        """The guest's public key of an SbSetup, checked as :meth:`public_key_from_proto`."""
        return self.public_key_from_proto(setup.public_key, insecure_test_key, "the guest's public key")

    def put_pairs(self, part, rows):
        """Write the GH-packed row ciphertexts into ``part.gh``."""
        part.gh.CopyFrom(encrypted_to_proto(rows))

    def pairs_from(self, part, pub, sums, n: int):
        """The ``n`` row ciphertexts (mpz list) of ``part.gh``; ProtocolError when the packing is not ``sums.spec``."""
        enc = self.from_proto(part.gh, pub, (n,), "encrypted gradients", exponent=sums.spec.exponent)
        if enc.packing != sums.spec:
            raise ProtocolError(f"encrypted gradients packed as {enc.packing}, expected {sums.spec}")
        return enc.ciphertexts.tolist()

    def join_pairs(self, parts):
        """The parts' ciphertext lists concatenated."""
        return [c for part in parts for c in part]

    def pair_bytes(self, pub):
        """One ciphertext per pair: the key's ciphertext width in bytes."""
        return pub.byte_width

    def put_pair_sums(self, msg, value):
        """Write the compressed candidate sums into ``msg.sums``."""
        msg.sums.CopyFrom(encrypted_to_proto(value))

    def pair_sums_from(self, msg, pub, sums, counts, what: str):
        """The compressed sums of ``msg.sums`` (one element per ``per`` candidates); ProtocolError on another
        count or packing than ``sums.cspec``.
        """
        enc = self.from_proto(msg.sums, pub, (sums.n_elements(counts),), what, exponent=sums.cspec.exponent)
        if enc.packing != sums.cspec:
            raise ProtocolError(f"{what}: packing {enc.packing} differs from {sums.cspec}")
        return enc


class OUCodec(PaillierCodec):
    """Okamoto-Uchiyama (:mod:`secureflhv.crypto.homomorphic.ou`): the key as ``PaillierPublicKey`` with
    ``scheme = "ou"``, n, G, H (big-endian) and ``plain_bits``, fingerprint
    :func:`~secureflhv.crypto.homomorphic.ou.key_fingerprint`; ciphertexts fixed-width big-endian in Z*_n (width =
    bytes of n); masked values non-negative integers below n, like Paillier's. Packing metadata must
    fit the key's plaintext bits (SecureBoost's pair sums); the protocol then compares it with its own."""

    scheme = "ou"

    def public_key_to_proto(self, pub):
        """n, G, H as minimal big-endian bytes, ``plain_bits``, the fingerprint, ``scheme = "ou"``."""
        return messages_pb2.PaillierPublicKey(n=pl.int_to_bytes(pub.n), fingerprint=pub.fingerprint, scheme="ou",
                                              g=pl.int_to_bytes(pub.g), h=pl.int_to_bytes(pub.h),
                                              plain_bits=pub.plain_bits)

    def public_key_from_proto(self, msg, insecure_test_key: bool, what: str = "public key"):
        """A peer's OU key, checked (scheme, fingerprint over n, G, H and plain_bits,
        :meth:`~secureflhv.crypto.homomorphic.ou.OUPublicKey.from_peer`); ProtocolError naming ``what``.
        """
        self._check_scheme(msg, what)
        n, g, h = (int.from_bytes(bytes(v), "big") for v in (msg.n, msg.g, msg.h))
        if ou.key_fingerprint(n, g, h, msg.plain_bits) != bytes(msg.fingerprint):
            raise ProtocolError(f"{what}: fingerprint does not match the OU key's n, G, H and plain_bits")
        try:
            return ou.OUPublicKey.from_peer(n, g, h, int(msg.plain_bits), insecure_test_key=insecure_test_key,
                                            what=what)
        except ValueError as exc:
            raise ProtocolError(f"{what}: {exc}") from exc

    def from_proto(self, msg, pub, expected_shape, what: str, *, exponent: int):
        """:meth:`PaillierCodec.from_proto`, after checking that the packing fits the key's plaintexts."""
        if msg.slot_bits and msg.slots * msg.slot_bits > pub.plain_bits:
            raise ProtocolError(f"{what}: packing of {msg.slots} x {msg.slot_bits} bits exceeds the OU key's "
                                f"{pub.plain_bits}-bit plaintexts")
        return super().from_proto(msg, pub, expected_shape, what, exponent=exponent)


class IdentityCodec(HECodec):
    """Identity backend: float64 payloads under a fixed fingerprint. NO SECURITY — benchmarks only."""

    def public_key_to_proto(self, pub):
        """The identity key's fixed fingerprint (n is one byte: there is no key)."""
        return messages_pb2.PaillierPublicKey(n=b"\x01", fingerprint=pub.fingerprint)

    def public_key_from_proto(self, msg, insecure_test_key: bool, what: str = "public key"):
        """The identity key; ProtocolError when the fingerprint is not its."""
        if bytes(msg.fingerprint) != IdentityKey().fingerprint:
            raise ProtocolError(f"{what}: not the identity backend's key")
        return IdentityKey()

    def to_proto(self, enc):
        """Float64 values as an EncryptedTensor (``byte_width`` 8, little-endian) under the identity fingerprint."""
        a = np.ascontiguousarray(enc, dtype="<f8")
        return messages_pb2.EncryptedTensor(key_fingerprint=IdentityKey().fingerprint, shape=list(a.shape),
                                            byte_width=8, ciphertexts=a.tobytes(), exponent=0, slots=1)

    def from_proto(self, msg, pub, expected_shape, what: str, *, exponent: int) -> np.ndarray:
        """The float64 values of an identity EncryptedTensor (fingerprint, shape, exponent 0 and byte count checked)."""
        return self._floats(msg, msg.ciphertexts, pub, expected_shape, what)

    def masked_to_proto(self, mv, priv):
        """Float64 masked values, ``byte_width`` 8, little-endian."""
        a = np.ascontiguousarray(mv.values, dtype="<f8")
        return messages_pb2.MaskedValues(key_fingerprint=mv.key_fingerprint, shape=list(mv.shape), byte_width=8,
                                         values=a.tobytes(), exponent=0)

    def masked_from_proto(self, msg, pub, expected_shape, what: str, *, exponent: int) -> MaskedValues:
        """The float64 values of an identity MaskedValues message, checked as :meth:`from_proto`."""
        vals = self._floats(msg, msg.values, pub, expected_shape, what)
        return MaskedValues(bytes(msg.key_fingerprint), vals.shape, 0, vals)

    @staticmethod
    def _floats(msg, data: bytes, pub, expected_shape, what: str) -> np.ndarray:
        """float64 values of ``msg``; the Paillier exponent the caller expects does not apply (always 0)."""
        _check_fingerprint(msg, pub, what)
        check_shape(what, shape_of(msg), expected_shape)
        _check_exponent(msg, 0, what)  # float64 values: no fixed-point exponent, whatever Paillier would use
        if msg.byte_width != 8 or len(data) != 8 * math.prod(shape_of(msg)):
            raise ProtocolError(f"{what}: payload size does not match the shape: {len(data)} bytes of width "
                                f"{msg.byte_width}, expected {8 * math.prod(shape_of(msg))} bytes of width 8")
        return np.frombuffer(data, dtype="<f8").reshape(shape_of(msg)).astype(np.float64)

    def put_setup_key(self, setup, pub):
        """Nothing: the plaintext baseline's SbSetup carries no key."""
        pass  # no key: the SbSetup of the plaintext baseline leaves public_key unset

    def setup_key(self, setup, insecure_test_key: bool):
        """The identity key."""
        return IdentityKey()

    def put_pairs(self, part, rows):
        """Write the int64 mantissas g and h as two tensors."""
        gq, hq = rows
        part.g.CopyFrom(tensor_to_proto(gq))
        part.h.CopyFrom(tensor_to_proto(hq))

    def pairs_from(self, part, pub, sums, n: int):
        """(g, h): the part's two int64 (n,) tensors, checked."""
        return (tensor_from_proto(part.g, what="g", dtype="<i8", shape=(n,)),
                tensor_from_proto(part.h, what="h", dtype="<i8", shape=(n,)))

    def join_pairs(self, parts):
        """(g, h) of the parts concatenated."""
        return tuple(np.concatenate([p[i] for p in parts]) for i in (0, 1))

    def pair_bytes(self, pub):
        """16: two int64 mantissas per row."""
        return 16  # two int64 mantissas

    def put_pair_sums(self, msg, value):
        """Write the int64 (candidates, 2) sums as one tensor."""
        msg.plain.CopyFrom(tensor_to_proto(value))

    def pair_sums_from(self, msg, pub, sums, counts, what: str):
        """The int64 (sum(counts), 2) candidate sums, checked."""
        return tensor_from_proto(msg.plain, what=what, dtype="<i8", shape=(sum(counts), 2))


CODECS = {"paillier": PaillierCodec, "ou": OUCodec, "identity": IdentityCodec}


def codec_for(backend: HEBackend) -> HECodec:
    """The codec of ``backend``, chosen by its ``name`` (a new instance each call).

    Raises ValueError for a backend whose name has no codec in :data:`CODECS` (e.g. a custom
    :class:`~secureflhv.crypto.homomorphic.backend.HEBackend` subclass: register its codec there first).
    """
    try:
        codec = CODECS[backend.name]
    except KeyError:
        raise ValueError(f"codec_for: no wire codec for HE backend {backend.name!r} "
                         f"({type(backend).__name__}); known: {sorted(CODECS)}") from None
    return codec()


def backend_and_codec(backend=None, precision_bits: int | None = None,
                      dot_precision_bits: int = VERTICAL_DOT_PRECISION_BITS) -> tuple[HEBackend, HECodec]:
    """``(he, wire)``: :func:`~secureflhv.crypto.homomorphic.backend.make_backend` of the arguments and its codec.

    Raises ValueError for an unknown backend name or a backend without a codec.
    """
    he = make_backend(backend, precision_bits, dot_precision_bits)
    return he, codec_for(he)
