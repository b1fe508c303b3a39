"""Signed model bundles against someone who edits them (issue 36): a re-hashed edit, a missing CA field,
another party's or another CA's signature, an old unsigned bundle. Each is refused naming what failed;
an honest bundle still loads. No network: bundles are written with test certificates."""
from __future__ import annotations

import base64
import io
import json
import logging

import numpy as np
import pytest

from secureflhv.runtime.store import model_bundle as mb
from secureflhv.runtime.job.job_file import parse_job_file
from secureflhv.runtime.store.model_bundle import ModelBundleError, read_bundle, save_job_bundle, write_bundle
from secureflhv.transport.certs import generate_certificates, load_party_credentials
from secureflhv.transport.identity import PartyIdentity

WEIGHTS = np.array([0.5, -1.25, 2.0])


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """The job's CA (guest, host-1) and an attacker's own CA that also issued a certificate named 'guest'."""
    job, evil = tmp_path_factory.mktemp("job-certs"), tmp_path_factory.mktemp("attacker-certs")
    generate_certificates(job, ["guest", "host-1"])
    generate_certificates(evil, ["guest"])
    return job, evil


@pytest.fixture
def bundle(tmp_path, pki):
    """An honest guest bundle of job 'job-a' (its ``model/`` folder)."""
    return write_bundle(tmp_path / "guest", credentials=load_party_credentials(pki[0], "guest"), job_id="job-a",
                        algorithm="vertical_lr", party_id="guest", role="guest", files={"weights.npy": WEIGHTS},
                        feature_names=["f1", "f2", "f3"])


def manifest(d):
    return json.loads((d / "manifest.json").read_text())


def save(d, doc):
    (d / "manifest.json").write_text(json.dumps(doc, indent=1))


def rehashed_edit(d, **fields) -> dict:
    """What a forger without the key does: new weights, their SHA-256 recomputed, other fields changed."""
    buf = io.BytesIO()
    np.save(buf, WEIGHTS * 100, allow_pickle=False)
    (d / "weights.npy").write_bytes(buf.getvalue())
    doc = manifest(d)
    doc["files"]["weights.npy"].update(sha256=mb.sha256_hex(buf.getvalue()), bytes=len(buf.getvalue()))
    doc.update(fields)
    save(d, doc)
    return doc


def resign(d, cert_dir, party):
    """Sign the manifest as it is now with ``party``'s key from ``cert_dir`` (a key the forger holds)."""
    doc = manifest(d)
    body = {k: v for k, v in doc.items() if k != "signature"}
    me = PartyIdentity.from_cert_dir(cert_dir, party)
    doc["signature"] = {"scheme": mb.SIGNATURE_SCHEME, "certificate": me.certificate.decode(),
                        "value": base64.b64encode(me.sign(mb._SIGNED_PREFIX + mb._canonical(body))).decode()}
    save(d, doc)


def refused(d, pki, match, **kw):
    with pytest.raises(ModelBundleError, match=match) as err:
        read_bundle(d, ca=pki[0] / "ca.pem", **kw)
    assert str(d) in str(err.value)  # names the bundle


def test_honest_bundle_round_trips(bundle, pki):
    b = read_bundle(bundle, ca=pki[0] / "ca.pem", expect_party="guest", expect_job="job-a", expect_role="guest")
    np.testing.assert_array_equal(b.file("weights.npy"), WEIGHTS)
    assert b.manifest["format_version"] == 2 and b.manifest["signature"]["scheme"] == "ecdsa-p256-sha256"
    assert b.ca_sha256 == mb.certificate_sha256(pki[0] / "ca.pem")
    assert b.cert_sha256 == mb.certificate_sha256(pki[0] / "guest.pem")


def test_rehashed_edit_is_refused(bundle, pki):
    """Weights edited, their hash recomputed, job id and CA field changed: the signature no longer holds."""
    doc = rehashed_edit(bundle, job_id="job-b", ca_sha256=mb.certificate_sha256(pki[0] / "ca.pem"))
    assert doc["job_id"] == "job-b"
    refused(bundle, pki, r"signature: signature of 'guest' does not verify under its certificate")


def test_rehashed_edit_resigned_by_another_party_is_refused(bundle, pki):
    """host-1 holds a key of the same CA; it can sign, but not as the guest."""
    rehashed_edit(bundle, job_id="job-b")
    resign(bundle, pki[0], "host-1")
    refused(bundle, pki, r"signature: signed by party 'host-1', expected 'guest' \(party_id\)")


def test_bundle_relabelled_as_another_party_is_refused(bundle, pki):
    """host-1 re-signs the guest's model as its own: valid, but not the party the loader expects."""
    doc = manifest(bundle)
    doc["party_id"] = "host-1"
    doc["cert_sha256"] = mb.certificate_sha256(pki[0] / "host-1.pem")
    save(bundle, doc)
    resign(bundle, pki[0], "host-1")
    assert read_bundle(bundle, ca=pki[0] / "ca.pem").party_id == "host-1"
    refused(bundle, pki, r"party_id: this bundle belongs to party 'host-1', not 'guest'", expect_party="guest")


@pytest.mark.parametrize("ca_field", ["attacker", "job"])
def test_bundle_signed_under_another_ca_is_refused(bundle, pki, ca_field):
    """The forger's own CA issued it a 'guest' certificate; the loader trusts only the job CA."""
    own_ca = mb.certificate_sha256(pki[1] / "ca.pem")
    rehashed_edit(bundle, ca_sha256=own_ca if ca_field == "attacker" else mb.certificate_sha256(pki[0] / "ca.pem"),
                  cert_sha256=mb.certificate_sha256(pki[1] / "guest.pem"))
    resign(bundle, pki[1], "guest")
    if ca_field == "attacker":
        refused(bundle, pki, r"ca_sha256: the bundle was signed under another CA than the one given")
        assert read_bundle(bundle, ca=pki[1] / "ca.pem").party_id == "guest"  # only under the forger's own CA
    else:
        refused(bundle, pki, r"signature: 'guest': certificate of 'guest' is not signed by the CA")


@pytest.mark.parametrize("how", ["empty", "absent"])
def test_bundle_without_ca_field_is_refused(bundle, pki, how):
    """Even correctly signed by the guest itself: the CA field is mandatory."""
    doc = manifest(bundle)
    if how == "empty":
        doc["ca_sha256"] = ""
    else:
        del doc["ca_sha256"]
    save(bundle, doc)
    resign(bundle, pki[0], "guest")
    refused(bundle, pki, r"ca_sha256 missing")


def test_unsigned_or_old_bundle_is_refused_saying_what_to_do(bundle, pki):
    doc = manifest(bundle)
    del doc["signature"]
    save(bundle, doc)
    refused(bundle, pki, r"signature missing")
    doc = {k: v for k, v in doc.items()}  # a version-1 bundle: content_sha256, no signature
    doc["format_version"] = 1
    doc["content_sha256"] = mb.sha256_hex(mb._canonical(doc))
    save(bundle, doc)
    refused(bundle, pki, r"format_version: 1 is an unsigned bundle .* run the training job again")


def test_signature_with_a_swapped_certificate_is_refused(bundle, pki):
    doc = manifest(bundle)
    doc["signature"]["certificate"] = (pki[0] / "host-1.pem").read_text()
    save(bundle, doc)
    refused(bundle, pki, r"signature: signed by party 'host-1', expected 'guest'")


def test_loader_needs_the_ca(bundle, pki):
    with pytest.raises(ModelBundleError, match=r"ca: the job CA is needed"):
        read_bundle(bundle, ca=None)
    with pytest.raises(ModelBundleError, match=r"ca: cannot read the job CA"):
        read_bundle(bundle, ca=pki[0] / "nope.pem")


def test_writer_signs_only_as_itself(tmp_path, pki):
    with pytest.raises(ValueError, match=r"credentials: the certificate of 'host-1', not of party 'guest'"):
        write_bundle(tmp_path / "guest", credentials=load_party_credentials(pki[0], "host-1"), job_id="j",
                     algorithm="vertical_lr", party_id="guest", role="guest", files={})
    assert not (tmp_path / "guest" / "model").exists()


def _job(tmp_path, certs=None) -> object:
    parties = [{"id": "guest", "role": "guest", "address": "127.0.0.1:50001", "data": {"path": "g.csv"}},
               {"id": "host-1", "role": "host", "address": "127.0.0.1:50002", "data": {"path": "h.csv"}}]
    security = {"insecure": True}
    if certs is not None:
        security = {"ca": str(certs / "ca.pem")}
        for p in parties:
            p.update(cert=str(certs / f"{p['id']}.pem"), key=str(certs / f"{p['id']}.key"))
    return parse_job_file({"job": {"id": "job-a", "algorithm": "vertical_lr", "output_dir": str(tmp_path / "out")},
                           "security": security, "parties": parties}, tmp_path)


def test_job_bundle_is_signed_with_the_partys_certificate(tmp_path, pki):
    cfg = _job(tmp_path, pki[0])
    where = save_job_bundle(cfg, cfg.party("host-1"), files={"weights.npy": WEIGHTS})
    b = read_bundle(where, ca=pki[0] / "ca.pem", expect_party="host-1", expect_job="job-a", expect_role="host")
    assert [p["id"] for p in b.peers] == ["guest"] and b.peers[0]["cert_sha256"]


def test_job_without_certificates_writes_no_bundle(tmp_path, caplog):
    cfg = _job(tmp_path)
    with caplog.at_level(logging.WARNING, logger="secureflhv.runtime.store.model_bundle"):
        assert save_job_bundle(cfg, cfg.party("guest"), files={"weights.npy": WEIGHTS}) is None
    assert "no model bundle written" in caplog.text and not (tmp_path / "out" / "guest" / "model").exists()
