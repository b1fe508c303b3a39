"""Certificate generation and loading (secureflhv.transport.certs)."""
import datetime as dt
import ipaddress
import os
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from secureflhv.transport.certs import (CertificateError, TlsConfig, certificate_identity,
                                        generate_certificates, load_party_credentials)

PARTIES = ["guest", "host-1", "server"]


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    paths = generate_certificates(out, PARTIES, days=30, hostnames=("localhost", "127.0.0.1", "node7.example"))
    return out, paths


def _cert(path):
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_files_and_permissions(cert_dir):
    out, paths = cert_dir
    assert paths["ca_cert"] == out / "ca.pem" and paths["ca_key"] == out / "ca.key"
    for pid in PARTIES:
        assert paths["parties"][pid] == {"cert": out / f"{pid}.pem", "key": out / f"{pid}.key"}
        assert stat.S_IMODE(os.stat(out / f"{pid}.key").st_mode) == 0o600
        assert (out / f"{pid}.pem").read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    assert stat.S_IMODE(os.stat(out / "ca.key").st_mode) == 0o600


def test_party_certificate_contents(cert_dir):
    out, _ = cert_dir
    ca = _cert(out / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    for pid in PARTIES:
        cert = _cert(out / f"{pid}.pem")
        cert.verify_directly_issued_by(ca)  # raises if not signed by the CA
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == pid
        assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
        assert cert.public_key().curve.name == "secp256r1"
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(san.get_values_for_type(x509.DNSName)) == {pid, "localhost", "node7.example"}
        assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature
        assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
        lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
        assert dt.timedelta(days=30) <= lifetime <= dt.timedelta(days=30, minutes=10)
        key = serialization.load_pem_private_key((out / f"{pid}.key").read_bytes(), None)
        sig = key.sign(b"challenge", ec.ECDSA(hashes.SHA256()))
        cert.public_key().verify(sig, b"challenge", ec.ECDSA(hashes.SHA256()))  # key matches certificate


def test_certificate_identity_accepts_bytes_text_path(cert_dir):
    out, _ = cert_dir
    pem = (out / "host-1.pem").read_bytes()
    assert certificate_identity(pem) == "host-1"
    assert certificate_identity(pem.decode()) == "host-1"
    assert certificate_identity(out / "host-1.pem") == "host-1"
    assert certificate_identity(str(out / "guest.pem")) == "guest"
    with pytest.raises(CertificateError, match="not a PEM"):
        certificate_identity(b"-----BEGIN CERTIFICATE-----\nnonsense\n-----END CERTIFICATE-----\n")


def test_per_party_hostnames(tmp_path):
    generate_certificates(tmp_path, ["guest", "host-1"], hostnames={"guest": ["10.0.0.5", "bank-a.example"]})
    san = _cert(tmp_path / "guest.pem").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"guest", "bank-a.example"}
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    san1 = _cert(tmp_path / "host-1.pem").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san1.get_values_for_type(x509.DNSName) == ["host-1"]


def test_load_from_dir_and_explicit_paths(cert_dir):
    out, _ = cert_dir
    a = load_party_credentials(out, "guest")
    b = TlsConfig.from_files(out / "ca.pem", out / "guest.pem", out / "guest.key")
    assert a == b and a.identity == "guest"
    assert a.ca_cert == (out / "ca.pem").read_bytes()
    assert "PRIVATE" not in repr(a)


def test_load_errors_name_the_file(cert_dir, tmp_path):
    out, _ = cert_dir
    with pytest.raises(FileNotFoundError, match="nobody.pem"):
        load_party_credentials(out, "nobody")
    with pytest.raises(FileNotFoundError, match="certificate directory"):
        load_party_credentials(tmp_path / "missing", "guest")
    with pytest.raises(CertificateError, match=r"is for party 'guest'"):
        load_party_credentials(ca_cert=out / "ca.pem", cert=out / "guest.pem", key=out / "guest.key",
                               party_id="host-1")
    with pytest.raises(CertificateError, match=r"host-1\.key does not belong"):
        load_party_credentials(ca_cert=out / "ca.pem", cert=out / "guest.pem", key=out / "host-1.key")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(CertificateError, match="garbage.pem"):
        load_party_credentials(ca_cert=out / "ca.pem", cert=garbage, key=out / "guest.key")
    with pytest.raises(CertificateError, match="garbage.pem"):
        load_party_credentials(ca_cert=out / "ca.pem", cert=out / "guest.pem", key=garbage)
    with pytest.raises(ValueError, match="missing key"):
        load_party_credentials(ca_cert=out / "ca.pem", cert=out / "guest.pem")


def test_unreadable_key_names_the_path(tmp_path, monkeypatch):
    generate_certificates(tmp_path, ["guest"])
    key_path = tmp_path / "guest.key"
    real_read = type(key_path).read_bytes

    def read_bytes(self):  # tests run as root, which reads any file: simulate EACCES on the key only
        if self == key_path:
            raise PermissionError(13, "Permission denied")
        return real_read(self)

    monkeypatch.setattr(type(key_path), "read_bytes", read_bytes)
    with pytest.raises(PermissionError, match=r"private key file is not readable.*guest\.key"):
        load_party_credentials(tmp_path, "guest")


def test_directory_instead_of_file_names_the_path(tmp_path):
    generate_certificates(tmp_path, ["guest"])
    (tmp_path / "sub").mkdir()
    with pytest.raises(CertificateError, match="sub"):
        load_party_credentials(tmp_path, "guest", cert=tmp_path / "sub")


def test_certificate_from_another_ca_is_refused(cert_dir, tmp_path):
    out, _ = cert_dir
    generate_certificates(tmp_path, ["guest"])
    with pytest.raises(CertificateError, match="not signed by the CA"):
        load_party_credentials(ca_cert=out / "ca.pem", cert=tmp_path / "guest.pem", key=tmp_path / "guest.key")


def test_refuses_to_overwrite_and_bad_ids(tmp_path):
    generate_certificates(tmp_path, ["guest"])
    with pytest.raises(FileExistsError, match="ca.pem"):
        generate_certificates(tmp_path, ["guest"])
    old = (tmp_path / "ca.pem").read_bytes()
    generate_certificates(tmp_path, ["guest"], overwrite=True)
    assert (tmp_path / "ca.pem").read_bytes() != old
    for bad in ["../etc", "a b", "", "ca", "-lead"]:
        with pytest.raises(ValueError, match="invalid party id"):
            generate_certificates(tmp_path / "x", [bad])
    with pytest.raises(ValueError, match="duplicate"):
        generate_certificates(tmp_path / "y", ["guest", "guest"])
