"""Certificates for mutual TLS between parties: a job CA and one certificate per party.

The identity of a party is its certificate's subject common name (CN), which must equal the
party id used in the job file. Receivers compare it with the ``sender`` of every message
(:mod:`secureflhv.transport.grpc_transport`); senders check the receiver's certificate by
verifying its subject alternative name (SAN) ``DNS:<party id>``.

Keys are ECDSA P-256 (accepted by gRPC's BoringSSL for TLS 1.2 and 1.3); certificates are
signed with SHA-256. Every party certificate carries both ``serverAuth`` and ``clientAuth``
extended key usages because each party is a server (receives) and a client (sends).

Files written by :func:`generate_certificates` into ``out_dir``::

    ca.pem         the CA certificate (give it to every party)
    ca.key         the CA private key (0600; keep it off the party machines)
    <party>.pem    the party's certificate
    <party>.key    the party's private key (0600; only that party's machine needs it)

This module does not import grpc: the CLI (``secureflhv certs``) uses it directly.
"""
from __future__ import annotations

import datetime as _dt
import ipaddress
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger("secureflhv.transport.certs")

# Party ids become file names and DNS SAN entries: keep them to DNS-label-like characters.
_PARTY_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62})$")
_RESERVED_IDS = {"ca"}
_CLOCK_SKEW = _dt.timedelta(minutes=5)  # not_before is back-dated so peers with slightly late clocks accept it


class CertificateError(ValueError):
    """A certificate or key file is malformed, mismatched, expired or signed by another CA."""


@dataclass(frozen=True)
class TlsConfig:
    """PEM material for one party's mutual TLS, as gRPC wants it.

    Attributes:
        ca_cert: PEM bytes of the CA that signs every party's certificate (trust root).
        cert: PEM bytes of this party's certificate.
        key: PEM bytes of this party's private key (PKCS#8, unencrypted).
        identity: the CN of ``cert``, i.e. the party id this configuration authenticates as.
    """

    ca_cert: bytes
    cert: bytes
    key: bytes
    identity: str

    def __repr__(self) -> str:  # never print the key
        return f"TlsConfig(identity={self.identity!r})"

    @classmethod
    def from_files(cls, ca_cert, cert, key) -> "TlsConfig":
        """Load and check PEM files (see :func:`load_party_credentials`)."""
        return load_party_credentials(ca_cert=ca_cert, cert=cert, key=key)


# ---------------------------------------------------------------------------------- helpers
def validate_party_id(party_id: str) -> str:
    """Return ``party_id`` or raise ValueError: ids are file names and DNS names, so ``[A-Za-z0-9._-]``."""
    if not isinstance(party_id, str) or not _PARTY_ID.match(party_id) or party_id.lower() in _RESERVED_IDS:
        raise ValueError(
            f"invalid party id {party_id!r}: use 1-63 characters from A-Z a-z 0-9 . _ - starting with a "
            f"letter or digit (and not {sorted(_RESERVED_IDS)})")
    return party_id


def _san_entry(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write_private(path: Path, data: bytes) -> None:
    # Create with 0600 from the start (no window where the key is world-readable); fchmod covers
    # a pre-existing file whose mode was wider.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _read(path, what: str) -> bytes:
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} file not found: {p}") from None
    except PermissionError:
        raise PermissionError(f"{what} file is not readable (permission denied): {p}") from None
    except IsADirectoryError:
        raise CertificateError(f"{what} path is a directory, expected a PEM file: {p}") from None
    except OSError as exc:
        raise CertificateError(f"cannot read {what} file {p}: {exc}") from None


def _load_cert(data: bytes, where: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise CertificateError(f"{where} is not a PEM X.509 certificate: {exc}") from None


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


# ---------------------------------------------------------------------------------- public API
def certificate_identity(pem) -> str:
    """The party id a certificate authenticates: its subject common name (CN).

    Args:
        pem: PEM bytes, PEM text (``str`` starting with ``-----BEGIN``), an ``x509.Certificate``,
            or a path to a PEM file.

    Raises:
        CertificateError: not a certificate, or no CN in the subject.
    """
    if isinstance(pem, x509.Certificate):
        cert, where = pem, "certificate"
    elif isinstance(pem, (bytes, bytearray)):
        cert, where = _load_cert(bytes(pem), "certificate"), "certificate"
    elif isinstance(pem, str) and pem.lstrip().startswith("-----BEGIN"):
        cert, where = _load_cert(pem.encode(), "certificate"), "certificate"
    else:
        where = str(pem)
        cert = _load_cert(_read(pem, "certificate"), where)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise CertificateError(f"{where} has no common name (CN) in its subject: {cert.subject.rfc4514_string()}")
    return str(names[0].value)


def generate_certificates(out_dir, party_ids: Iterable[str], *, days: int = 365,
                          hostnames: Iterable[str] | Mapping[str, Iterable[str]] = ("localhost", "127.0.0.1"),
                          overwrite: bool = False) -> dict:
    """Create a CA and one certificate + key per party for mutual TLS.

    Each party certificate has CN = party id and SANs ``DNS:<party id>`` plus ``hostnames``
    (IP addresses become IP SANs), key usage digitalSignature, and extended key usages
    serverAuth + clientAuth.

    Args:
        out_dir: folder to write into (created if missing).
        party_ids: the job's party ids (e.g. ``["guest", "host-1", "server"]``); unique.
        days: validity in days (from 5 minutes ago, to tolerate clock skew).
        hostnames: extra SANs for every party, or a mapping party id -> SANs for per-machine names.
        overwrite: replace existing files; by default an existing file raises FileExistsError so a
            deployment's keys are never clobbered by accident.

    Returns:
        ``{"ca_cert": Path, "ca_key": Path, "parties": {party_id: {"cert": Path, "key": Path}}}``

    Raises:
        ValueError: invalid or duplicate party id, ``days < 1``.
        FileExistsError: a target file exists and ``overwrite`` is False (names the file).
    """
    ids, extra = _check_request(party_ids, days, hostnames)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = _target_paths(out, ids, overwrite)
    now = _now()
    validity = (now - _CLOCK_SKEW, now + _dt.timedelta(days=int(days)))
    ca_key, ca_cert = _issue_ca(validity)
    paths["ca_cert"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(paths["ca_key"], _key_pem(ca_key))
    for pid in ids:
        key, cert = _issue_party(pid, extra[pid], ca_key, ca_cert, validity)
        paths["parties"][pid]["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(paths["parties"][pid]["key"], _key_pem(key))
    log.info("wrote a CA and certificates for %s to %s (valid %d days)", ", ".join(ids), out, days)
    return paths


def _check_request(party_ids, days, hostnames) -> tuple[list[str], dict[str, list[str]]]:
    """Validated party ids and each party's extra SANs (see :func:`generate_certificates`)."""
    ids = [validate_party_id(p) for p in party_ids]
    if not ids:
        raise ValueError("party_ids is empty: give at least one party id")
    dupes = sorted({p for p in ids if ids.count(p) > 1})
    if dupes:
        raise ValueError(f"duplicate party ids: {dupes}")
    if int(days) < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    if isinstance(hostnames, Mapping):
        unknown = sorted(set(hostnames) - set(ids))
        if unknown:
            raise ValueError(f"hostnames names parties that are not in party_ids: {unknown}")
        return ids, {p: list(hostnames.get(p, ())) for p in ids}
    common = list(hostnames)
    return ids, {p: common for p in ids}


def _target_paths(out: Path, ids: list[str], overwrite: bool) -> dict:
    """The files :func:`generate_certificates` writes; FileExistsError if one exists and not ``overwrite``."""
    paths = {"ca_cert": out / "ca.pem", "ca_key": out / "ca.key",
             "parties": {p: {"cert": out / f"{p}.pem", "key": out / f"{p}.key"} for p in ids}}
    if not overwrite:
        targets = [paths["ca_cert"], paths["ca_key"]] + [f for p in ids for f in paths["parties"][p].values()]
        for f in targets:
            if f.exists():
                raise FileExistsError(f"{f} already exists (pass overwrite=True / --overwrite to replace it)")
    return paths


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """CA: keyCertSign + cRLSign only; party: digitalSignature only."""
    return x509.KeyUsage(digital_signature=not signs_certificates, content_commitment=False,
                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                         key_cert_sign=signs_certificates, crl_sign=signs_certificates, encipher_only=False,
                         decipher_only=False)


def _issue_ca(validity) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A fresh P-256 key and the self-signed job CA certificate (path length 0)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "secureflhv"),
                         x509.NameAttribute(NameOID.COMMON_NAME, "secureflhv job CA")])
    ca_cert = (x509.CertificateBuilder()
               .subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(validity[0]).not_valid_after(validity[1])
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(_key_usage(signs_certificates=True), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))
    return ca_key, ca_cert


def _issue_party(pid: str, hostnames: list[str], ca_key, ca_cert: x509.Certificate,
                 validity) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A fresh P-256 key and its certificate: CN = ``pid``, SANs ``pid`` + ``hostnames``, signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans, seen = [], set()
    for name in [pid, *hostnames]:
        if name not in seen:
            seen.add(name)
            sans.append(_san_entry(name))
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "secureflhv"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, pid)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(validity[0]).not_valid_after(validity[1])
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(signs_certificates=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def load_party_credentials(cert_dir=None, party_id: str | None = None, *, ca_cert=None, cert=None,
                           key=None) -> TlsConfig:
    """Load and check one party's TLS material.

    Either ``cert_dir`` + ``party_id`` (files ``ca.pem``, ``<party_id>.pem``, ``<party_id>.key``
    as written by :func:`generate_certificates`), or explicit paths ``ca_cert``, ``cert``, ``key``;
    explicit paths override the ones derived from ``cert_dir``.

    Checks, each failing with an error that names the file: the files exist and are readable, are
    PEM, the key matches the certificate, the certificate is signed by the CA, is currently valid,
    and (when ``party_id`` is given) its CN equals ``party_id``.

    Raises:
        FileNotFoundError / PermissionError: a file is missing / unreadable (names the path).
        CertificateError: malformed PEM, key/cert mismatch, wrong CA, expired, CN != party_id.
        ValueError: neither a directory nor the three paths were given.
    """
    ca_cert, cert, key = _credential_paths(cert_dir, party_id, ca_cert, cert, key)
    ca_pem, cert_pem, key_pem = _read(ca_cert, "CA certificate"), _read(cert, "certificate"), _read(key, "private key")
    ca_obj = _load_cert(ca_pem, f"CA certificate {ca_cert}")
    cert_obj = _load_cert(cert_pem, f"certificate {cert}")
    try:
        key_obj = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"private key {key} is not an unencrypted PEM private key: {exc}") from None
    _check_key_matches(key_obj, cert_obj, key, cert)
    _check_issued_by(cert_obj, ca_obj, cert, ca_cert)
    _check_valid_now(((cert_obj, f"certificate {cert}"), (ca_obj, f"CA certificate {ca_cert}")))
    identity = certificate_identity(cert_obj)
    if party_id is not None and identity != party_id:
        raise CertificateError(f"certificate {cert} is for party {identity!r} (CN), not {party_id!r}")
    return TlsConfig(ca_cert=ca_pem, cert=cert_pem, key=key_pem, identity=identity)


def _credential_paths(cert_dir, party_id, ca_cert, cert, key) -> tuple:
    """(ca_cert, cert, key) paths: explicit ones, else derived from ``cert_dir`` + ``party_id``."""
    if cert_dir is not None:
        d = Path(cert_dir)
        if not d.is_dir():
            raise FileNotFoundError(f"certificate directory not found: {d}")
        if party_id is None and (cert is None or key is None):
            raise ValueError("load_party_credentials(cert_dir=...) needs party_id (or explicit cert= and key=)")
        ca_cert = ca_cert if ca_cert is not None else d / "ca.pem"
        cert = cert if cert is not None else d / f"{party_id}.pem"
        key = key if key is not None else d / f"{party_id}.key"
    missing = [n for n, v in (("ca_cert", ca_cert), ("cert", cert), ("key", key)) if v is None]
    if missing:
        raise ValueError(f"load_party_credentials: missing {', '.join(missing)} (give cert_dir + party_id "
                         f"or all of ca_cert, cert, key)")
    return ca_cert, cert, key


def _check_key_matches(key_obj, cert_obj: x509.Certificate, key, cert) -> None:
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    if (key_obj.public_key().public_bytes(serialization.Encoding.DER, pub)
            != cert_obj.public_key().public_bytes(serialization.Encoding.DER, pub)):
        raise CertificateError(f"private key {key} does not belong to certificate {cert}")


def _check_issued_by(cert_obj: x509.Certificate, ca_obj: x509.Certificate, cert, ca_cert) -> None:
    try:
        cert_obj.verify_directly_issued_by(ca_obj)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise CertificateError(f"certificate {cert} is not signed by the CA in {ca_cert}: "
                               f"{str(exc) or 'bad signature'}") from None


def _check_valid_now(certificates) -> None:
    """CertificateError naming the first of ``(certificate, description)`` pairs not valid now."""
    now = _now()
    for obj, where in certificates:
        if now < obj.not_valid_before_utc or now > obj.not_valid_after_utc:
            raise CertificateError(f"{where} is not valid now ({now:%Y-%m-%d %H:%M} UTC): valid from "
                                   f"{obj.not_valid_before_utc:%Y-%m-%d %H:%M} to "
                                   f"{obj.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
