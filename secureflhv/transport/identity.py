"""A party's signing identity: its CA-issued mutual-TLS certificate and key, used to sign protocol
messages that travel through a relay (e.g. secure aggregation's AdvertiseKeys, which the server relays
to every client: Bonawitz et al., CCS 2017, Sec. 6, "active adversary" variant with a PKI).

* :class:`PartyIdentity` — ``party_id``, ``certificate`` (PEM bytes), :meth:`~PartyIdentity.sign`
  (ECDSA P-256 with SHA-256, the key of the party's certificate, :mod:`secureflhv.transport.certs`)
  and ``verifier`` (a :class:`PeerVerifier` for the same job CA).
* :class:`PeerVerifier` — :meth:`~PeerVerifier.verify` checks that a peer's certificate PEM is signed
  by the job CA, is valid now, names the claimed party (CN), and that the signature over the data is
  by that certificate's key; raises :class:`IdentityError` naming the party otherwise.

A relay (the aggregation server) can forward a certificate and signature but cannot forge either: it
holds no client's private key, and a certificate of its own names the server, not the client.

Where identities come from: :class:`~secureflhv.transport.grpc_transport.GrpcTransport` with TLS builds
one from its :class:`~secureflhv.transport.certs.TlsConfig`;
:class:`~secureflhv.transport.inprocess.InProcessNetwork` builds one per party when given a
``cert_dir`` (from :func:`~secureflhv.transport.certs.generate_certificates`). Without TLS (insecure
transport, plain in-process network) ``Transport.identity`` is ``None``.
"""
from __future__ import annotations

from functools import lru_cache

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .certs import (CertificateError, TlsConfig, _check_issued_by, _check_valid_now, _load_cert,
                    certificate_identity, load_party_credentials)

_SIGNATURE = ec.ECDSA(hashes.SHA256())


class IdentityError(CertificateError):
    """A peer's certificate or signature does not authenticate the party it claims to be."""


class PeerVerifier:
    """Verifies peers' certificate-signed data against the job CA (PEM bytes ``ca_cert``)."""

    def __init__(self, ca_cert: bytes):
        self._ca = _load_cert(bytes(ca_cert), "job CA certificate")

    def verify(self, party_id: str, cert_pem: bytes, signature: bytes, data: bytes) -> None:
        """Check that ``signature`` over ``data`` is by ``party_id``'s CA-issued, in-date certificate.

        Raises:
            IdentityError: malformed certificate, not issued by the job CA, not valid now, CN not
                ``party_id``, not an EC key, or a bad signature (the message names ``party_id``).
        """
        try:
            cert = _parsed(bytes(cert_pem))
            _check_issued_by(cert, self._ca, f"of {party_id!r}", "the job CA")
            _check_valid_now(((cert, f"certificate of {party_id!r}"),))
            named = certificate_identity(cert)
        except CertificateError as exc:
            raise IdentityError(f"{party_id!r}: {exc}") from None
        if named != party_id:
            raise IdentityError(f"certificate sent for {party_id!r} names {named!r} (CN)")
        key = cert.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise IdentityError(f"certificate of {party_id!r} does not hold an EC key")
        try:
            key.verify(bytes(signature), bytes(data), _SIGNATURE)
        except InvalidSignature:
            raise IdentityError(f"signature of {party_id!r} does not verify under its certificate") from None


@lru_cache(maxsize=256)
def _parsed(cert_pem: bytes) -> x509.Certificate:
    """A parsed certificate (cached: the same peers' certificates arrive every round)."""
    return _load_cert(cert_pem, "certificate")


class PartyIdentity:
    """This party's certificate and key: signs data its peers verify with :class:`PeerVerifier`.

    Args:
        tls: the party's credentials (checked by :func:`~secureflhv.transport.certs.load_party_credentials`).

    Attributes:
        party_id: the certificate's CN.
        certificate: PEM bytes of the certificate (sent alongside signatures).
        verifier: a :class:`PeerVerifier` for this party's job CA.
    """

    def __init__(self, tls: TlsConfig):
        self.party_id = tls.identity
        self.certificate = bytes(tls.cert)
        self._key = serialization.load_pem_private_key(tls.key, password=None)
        if not isinstance(self._key, ec.EllipticCurvePrivateKey):
            raise CertificateError(f"the key of {self.party_id!r} is not an EC key; regenerate with "
                                   f"secureflhv.transport.certs.generate_certificates")
        self.verifier = PeerVerifier(tls.ca_cert)

    def __repr__(self) -> str:  # never print the key
        return f"PartyIdentity({self.party_id!r})"

    @classmethod
    def from_cert_dir(cls, cert_dir, party_id: str) -> "PartyIdentity":
        """Load ``ca.pem``, ``<party_id>.pem``, ``<party_id>.key`` from ``cert_dir`` (checked)."""
        return cls(load_party_credentials(cert_dir, party_id))

    def sign(self, data: bytes) -> bytes:
        """ECDSA-SHA256 signature (DER) of ``data`` with this party's certificate key."""
        return self._key.sign(bytes(data), _SIGNATURE)
