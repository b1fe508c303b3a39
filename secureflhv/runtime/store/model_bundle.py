"""Model bundles: one party's part of a trained model, versioned, hashed, and checked when loaded.

A bundle is a folder, ``<output_dir>/<party id>/model/``, holding ``manifest.json`` and the
parameter files it lists. Nothing in it is ever unpickled or evaluated:

* ``.npy`` — one numpy array, read with ``np.load(..., allow_pickle=False)``;
* ``.safetensors`` — named float arrays (a torch ``state_dict``), read with ``safetensors.numpy``;
* ``.json`` — plain JSON (e.g. a host's split table; a tree model is ``model.json``, a name kept from
  format version 2, since renaming it would refuse or special-case every tree bundle already signed;
  no other ``model.json`` is written since the bundle became the one model format);
* ``.xgboost.json`` — an XGBoost JSON model (``xgboost.Booster.load_model``).

The manifest (``format: secureflhv.bundle``, ``format_version`` 2) names the job, the algorithm, the
party and its role, the task where the job records it (``binary`` / ``multiclass`` / ``regression``:
what the model's outputs are, so a regression model's values are returned as they are), the feature
names in column order, the preprocessing state (e.g. standardisation means and standard deviations),
the algorithm's configuration, metrics, the peers the model was trained with (party ids, roles and,
where this party can read them, certificate SHA-256 fingerprints), the job CA's fingerprint
(``ca_sha256``) and the signer's (``cert_sha256``), the Paillier public key fingerprint where one was
used, and every file's SHA-256.

**Signed.** ``signature`` holds the writing party's certificate (PEM) and an ECDSA-P256-SHA256 signature,
made with that certificate's key (the party's mutual-TLS key, :class:`~secureflhv.transport.identity.PartyIdentity`),
over the canonical JSON of everything else in the manifest; the files are covered through their
hashes. A hash alone is a checksum: anyone who edits a file can recompute it. A signature needs the
party's private key, which never leaves its machine.

:func:`read_bundle` needs the job CA (``ca``) and checks, in order: the format and its version (an
unsigned version-1 bundle is refused: retrain to get a signed one), ``ca_sha256`` (present, and the
CA given), the signer's certificate (issued by that CA, valid now, its CN the manifest's ``party_id``),
the signature, every file's hash, and (when asked) the expected party, job and role. Any failure
raises :class:`ModelBundleError` naming the field. Writing is atomic: files go to a temporary folder
next to ``model/``, are fsynced, and the folder is renamed into place, so a crash leaves the previous
bundle or the new one, never half of one.
"""
from __future__ import annotations

import base64
import binascii
import datetime as _dt
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..._version import __version__
from ...transport.certs import CertificateError, TlsConfig, certificate_identity
from ...transport.identity import IdentityError, PartyIdentity, PeerVerifier
from .artifacts import fsync_dir, plain_json, sha256_hex

FORMAT = "secureflhv.bundle"
FORMAT_VERSION = 2  # 2: signed by the party's certificate key (1: hashes only, refused)
SIGNATURE_SCHEME = "ecdsa-p256-sha256"
_SIGNED_PREFIX = b"secureflhv.bundle/2\0"  # domain separation: a bundle signature signs nothing else
MANIFEST = "manifest.json"
BUNDLE_DIR = "model"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
log = logging.getLogger("secureflhv.runtime.store.model_bundle")


class ModelBundleError(ValueError):
    """A bundle is missing, damaged, of an unknown version, or not the one expected; the message names the field."""


def _plain(obj: Any) -> Any:
    return plain_json(obj, nan_as_none=True)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _file_format(name: str) -> str:
    for suffix, kind in ((".xgboost.json", "xgboost-json"), (".json", "json"), (".npy", "npy"),
                         (".safetensors", "safetensors")):
        if name.endswith(suffix):
            return kind
    raise ValueError(f"parameter file {name!r}: use .npy, .safetensors, .json or .xgboost.json")


def _encode(name: str, value: Any) -> bytes:
    """The bytes of parameter file ``name`` (its format follows the suffix)."""
    kind = _file_format(name)
    if kind == "npy":
        import io

        buf = io.BytesIO()
        arr = np.asarray(value)
        if arr.dtype == object:
            raise ValueError(f"{name}: object arrays cannot be stored (they would need pickle)")
        np.save(buf, arr, allow_pickle=False)
        return buf.getvalue()
    if kind == "safetensors":
        from safetensors.numpy import save

        return save({k: np.ascontiguousarray(v) for k, v in value.items()})
    if kind == "xgboost-json":
        return value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return (json.dumps(_plain(value), indent=1, allow_nan=False) + "\n").encode("utf-8")


def _decode(name: str, data: bytes) -> Any:
    kind = _file_format(name)
    if kind == "npy":
        import io

        return np.load(io.BytesIO(data), allow_pickle=False)
    if kind == "safetensors":
        from safetensors.numpy import load

        return load(data)
    if kind == "xgboost-json":
        return data.decode("utf-8")
    return json.loads(data.decode("utf-8"))


def certificate_sha256(path: Path | None) -> str | None:
    """SHA-256 (hex) of a PEM certificate's DER bytes, or None when ``path`` is unset or unreadable."""
    if path is None:
        return None
    try:
        return _pem_sha256(Path(path).read_bytes())
    except (OSError, ValueError):
        return None


def _pem_sha256(pem: bytes) -> str:
    """SHA-256 (hex) of a PEM certificate's DER bytes; ValueError when it is not one."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    return sha256_hex(x509.load_pem_x509_certificate(bytes(pem)).public_bytes(Encoding.DER))


def job_peers(cfg, party) -> list[dict]:
    """The ``peers`` entry of a manifest for ``party`` of job ``cfg``: every other party (id, role,
    certificate fingerprint where its file is readable here)."""
    return [{"id": p.id, "role": p.role, "cert_sha256": certificate_sha256(cfg.resolve(p.cert))}
            for p in cfg.parties if p.id != party.id]


def job_credentials(cfg, party) -> TlsConfig | None:
    """The certificate, key and job CA ``party`` signs its bundle with (the job file's ``security.ca``,
    ``parties[i].cert`` / ``.key``, checked by :func:`~secureflhv.transport.certs.load_party_credentials`),
    or None when the job file names none of them (an ``insecure`` test job without certificates).

    Raises:
        ModelBundleError: only some are set, or they do not load (missing file, wrong CA, CN not the party).
    """
    paths = {"security.ca": cfg.security.ca, f"parties[{party.id}].cert": party.cert,
             f"parties[{party.id}].key": party.key}
    if all(v is None for v in paths.values()):
        return None
    missing = [k for k, v in paths.items() if v is None]
    if missing:
        raise ModelBundleError(f"{', '.join(missing)}: needed to sign {party.id}'s model bundle")
    try:
        return TlsConfig.from_files(cfg.resolve(cfg.security.ca), cfg.resolve(party.cert), cfg.resolve(party.key))
    except (OSError, CertificateError) as exc:
        raise ModelBundleError(f"cannot sign {party.id}'s model bundle: {exc}") from None


@dataclass
class ModelBundle:
    """A loaded, verified bundle: ``manifest`` (dict) and ``files`` (name -> decoded content)."""

    path: Path
    manifest: dict
    files: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:  # job_id, algorithm, party_id, role, feature_names, ...
        manifest = self.__dict__.get("manifest") or {}
        if name in manifest:
            return manifest[name]
        raise AttributeError(name)

    def file(self, name: str) -> Any:
        """The decoded content of parameter file ``name``; ModelBundleError naming it when absent."""
        if name not in self.files:
            raise ModelBundleError(f"{self.path}: files: no {name!r} in this {self.manifest.get('algorithm')} "
                                   f"bundle (it has {sorted(self.files)})")
        return self.files[name]


def write_bundle(out_dir: Path, *, credentials: TlsConfig, job_id: str, algorithm: str, party_id: str, role: str,
                 files: dict[str, Any], feature_names: list[str] | None = None, preprocessing: dict | None = None,
                 config: dict | None = None, metrics: dict | None = None, peers: list[dict] | None = None,
                 paillier_key_sha256: str | None = None, extra: dict | None = None, task: str | None = None) -> Path:
    """Write a signed bundle to ``out_dir/model/`` atomically (replacing an older one); returns that folder.

    Args:
        out_dir: the party's output folder (``<output_dir>/<party id>``).
        credentials: the party's certificate, key and job CA (:class:`~secureflhv.transport.certs.TlsConfig`,
            its CN must be ``party_id``): the manifest is signed with the key; ``ca_sha256`` and
            ``cert_sha256`` are the fingerprints of its CA and certificate.
        files: parameter file name -> content: ``.npy`` an array, ``.safetensors`` a dict of arrays,
            ``.json`` JSON-able data, ``.xgboost.json`` XGBoost's JSON text.
        feature_names: this party's feature columns, in the order the parameters use them.
        preprocessing: e.g. ``{"standardisation": {"mean": [...], "std": [...]}}`` (None: none).
        config: the algorithm's configuration (what a prediction needs to rebuild the model).
        peers: :func:`job_peers` (the other parties and their certificate fingerprints).
        paillier_key_sha256: the Paillier public key fingerprint (hex) used in training, if any.
        task: ``binary``, ``multiclass`` or ``regression`` (None: not recorded; readers infer it from
            ``config``).
    Raises ValueError for a bad file name or content (e.g. object arrays) or credentials of another
    party, CertificateError for a key that is not EC, OSError from the disk.
    """
    if credentials.identity != party_id:
        raise ValueError(f"credentials: the certificate of {credentials.identity!r}, not of party {party_id!r}")
    if task not in (None, "binary", "multiclass", "regression"):
        raise ValueError(f"task must be binary, multiclass or regression, got {task!r}")
    blobs = _encode_files(files)
    body = _plain({
        "format": FORMAT, "format_version": FORMAT_VERSION, "secureflhv_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "job_id": job_id, "algorithm": algorithm, "party_id": party_id, "role": role,
        **({"task": task} if task is not None else {}),
        "feature_names": list(feature_names or []), "preprocessing": preprocessing or {}, "config": config or {},
        "metrics": metrics or {}, "peers": peers or [], "ca_sha256": _pem_sha256(credentials.ca_cert),
        "cert_sha256": _pem_sha256(credentials.cert), "paillier_key_sha256": paillier_key_sha256,
        "extra": extra or {},
        "files": {n: {"format": _file_format(n), "sha256": sha256_hex(b), "bytes": len(b)} for n, b in blobs.items()},
    })
    return _write_atomically(Path(out_dir), blobs, {**body, "signature": _sign(credentials, body)})


def _encode_files(files: dict[str, Any]) -> dict[str, bytes]:
    """Parameter file name -> its bytes; ValueError for a name outside ``_NAME`` or the manifest's."""
    blobs = {}
    for name, value in files.items():
        if not _NAME.match(name) or name == MANIFEST:
            raise ValueError(f"parameter file name {name!r}: letters, digits, '_', '.', '-' only")
        blobs[name] = _encode(name, value)
    return blobs


def _sign(credentials: TlsConfig, body: dict) -> dict:
    """The manifest's ``signature``: the signer's certificate and its ECDSA signature over ``body``."""
    signer = PartyIdentity(credentials)
    return {"scheme": SIGNATURE_SCHEME, "certificate": signer.certificate.decode("ascii"),
            "value": base64.b64encode(signer.sign(_SIGNED_PREFIX + _canonical(body))).decode("ascii")}


def _write_atomically(out_dir: Path, blobs: dict[str, bytes], manifest: dict) -> Path:
    """Write the files and the manifest to a temporary folder, fsync, and rename it to ``out_dir/model``
    (replacing an older bundle), so a crash leaves the old bundle or the new one; returns the folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".model-", dir=out_dir))
    try:
        for name, data in [*blobs.items(), (MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())]:
            with open(tmp / name, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        fsync_dir(tmp)
        final = out_dir / BUNDLE_DIR
        old = None
        if final.exists():
            old = out_dir / f".model-old-{os.getpid()}"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_dir(out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def bundle_dir(path: Path | str) -> Path:
    """``path`` itself when it holds a manifest, else ``path/model`` (a party's output folder)."""
    path = Path(path)
    return path if (path / MANIFEST).is_file() or not (path / BUNDLE_DIR / MANIFEST).is_file() else path / BUNDLE_DIR


def read_bundle(path: Path | str, *, ca: Path | str | bytes, expect_party: str | None = None,
                expect_job: str | None = None, expect_role: str | None = None) -> ModelBundle:
    """Load and verify a bundle (the ``model/`` folder, or the party folder holding it).

    Args:
        ca: the job CA the bundle must be signed under: a PEM file's path, or PEM bytes (a prediction
            job's ``security.ca``; in a notebook, the training job's ``ca.pem``).

    Checks, in order: the manifest exists and is JSON; ``format`` and ``format_version`` (version 1,
    unsigned, is refused); ``ca_sha256`` is present and is ``ca``'s; the signer's certificate is issued
    by ``ca``, valid now and names the manifest's ``party_id`` (CN); the signature over the manifest;
    ``cert_sha256`` is the signer's; each listed file's SHA-256; then ``party_id``, ``job_id`` and
    ``role`` against the expected values (when given).

    Raises:
        ModelBundleError: the first failed check, naming the bundle's path and the field (e.g.
            ``signature: ... does not verify``, ``ca_sha256: missing``, ``signed by party 'x', expected 'y'``).
    """
    where = bundle_dir(path)
    ca_pem = _ca_pem(ca)
    manifest = _read_manifest(where)
    _verify_signature(where, manifest, ca_pem)
    files = _read_files(where, manifest)
    for fld, want in (("party_id", expect_party), ("job_id", expect_job), ("role", expect_role)):
        if want is not None and manifest.get(fld) != want:
            what = {"party_id": "party", "job_id": "job", "role": "role"}[fld]
            raise ModelBundleError(f"{where}: {fld}: this bundle belongs to {what} {manifest.get(fld)!r}, "
                                   f"not {want!r}")
    return ModelBundle(where, manifest, files)


def _read_manifest(where: Path) -> dict:
    """The manifest of the bundle in ``where``, after the format and version checks (not yet the signature)."""
    try:
        raw = (where / MANIFEST).read_bytes()
    except OSError as exc:
        raise ModelBundleError(f"{where}: no readable {MANIFEST} ({exc.strerror or exc}): not a model bundle; "
                               f"train first (a job writes bundles only where its parties have certificates), "
                               f"or point at <output_dir>/<party id>/model") from None
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise ModelBundleError(f"{where}/{MANIFEST}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ModelBundleError(f"{where}: format: {got!r} is not a secureflhv model bundle ({FORMAT!r})")
    version = manifest.get("format_version")
    if version == 1:
        raise ModelBundleError(f"{where}: format_version: 1 is an unsigned bundle (hashes only, which anyone can "
                               f"recompute after an edit); this secureflhv {__version__} loads only signed bundles "
                               f"(version {FORMAT_VERSION}): run the training job again to write one")
    if version != FORMAT_VERSION:
        raise ModelBundleError(f"{where}: format_version: {version!r} is not supported "
                               f"(this secureflhv {__version__} reads version {FORMAT_VERSION})")
    return manifest


def _read_files(where: Path, manifest: dict) -> dict[str, Any]:
    """Every file the (verified) manifest lists, decoded, after checking its SHA-256 against the manifest's."""
    files = {}
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise ModelBundleError(f"{where}: files: missing from the manifest")
    for name, info in listed.items():
        if not _NAME.match(str(name)) or name == MANIFEST or not isinstance(info, dict):
            raise ModelBundleError(f"{where}: files: bad entry {name!r}")
        try:
            data = (where / name).read_bytes()
        except OSError as exc:
            raise ModelBundleError(f"{where}: files[{name}]: cannot read it ({exc.strerror or exc})") from None
        if sha256_hex(data) != info.get("sha256"):
            raise ModelBundleError(f"{where}: files[{name}].sha256: the file does not match the manifest's "
                                   f"hash: it was modified or damaged")
        try:
            files[name] = _decode(name, data)
        except Exception as exc:  # noqa: BLE001 - numpy / safetensors / json raise many types
            raise ModelBundleError(f"{where}: files[{name}]: unreadable ({exc})") from None
    return files


def _ca_pem(ca: Path | str | bytes) -> bytes:
    if isinstance(ca, (bytes, bytearray)):
        return bytes(ca)
    if ca is None:
        raise ModelBundleError("ca: the job CA is needed to verify a bundle's signature (the training job's "
                               "security.ca, e.g. certs/ca.pem)")
    try:
        return Path(ca).read_bytes()
    except OSError as exc:
        raise ModelBundleError(f"ca: cannot read the job CA {ca} ({exc.strerror or exc})") from None


def _verify_signature(where: Path, manifest: dict, ca_pem: bytes) -> None:
    """ModelBundleError naming the field unless ``manifest`` is signed by its ``party_id`` under ``ca_pem``."""
    try:
        ca_sha = _pem_sha256(ca_pem)
    except ValueError:
        raise ModelBundleError(f"{where}: ca: the job CA given is not a PEM certificate") from None
    if not manifest.get("ca_sha256"):
        raise ModelBundleError(f"{where}: ca_sha256 missing: a bundle must name the job CA it was signed under")
    if manifest["ca_sha256"] != ca_sha:
        raise ModelBundleError(f"{where}: ca_sha256: the bundle was signed under another CA than the one given "
                               f"({manifest['ca_sha256']!r}, not {ca_sha!r}); a model is used only by the "
                               f"federation that trained it")
    sig = manifest.get("signature")
    if not isinstance(sig, dict) or not all(isinstance(sig.get(k), str) for k in ("scheme", "certificate", "value")):
        raise ModelBundleError(f"{where}: signature missing or malformed (scheme, certificate, value)")
    if sig["scheme"] != SIGNATURE_SCHEME:
        raise ModelBundleError(f"{where}: signature.scheme: {sig['scheme']!r} is not {SIGNATURE_SCHEME!r}")
    party = manifest.get("party_id")
    cert = sig["certificate"].encode("ascii", "replace")
    try:
        signer = certificate_identity(cert)
        value = base64.b64decode(sig["value"], validate=True)
    except (CertificateError, binascii.Error, ValueError) as exc:
        raise ModelBundleError(f"{where}: signature: unreadable certificate or value ({exc})") from None
    if signer != party:
        raise ModelBundleError(f"{where}: signature: signed by party {signer!r}, expected {party!r} (party_id)")
    body = {k: v for k, v in manifest.items() if k != "signature"}
    try:
        signed = _SIGNED_PREFIX + _canonical(body)
    except ValueError as exc:
        raise ModelBundleError(f"{where}: signature: the manifest holds non-JSON values ({exc})") from None
    try:
        PeerVerifier(ca_pem).verify(party, cert, value, signed)
    except IdentityError as exc:  # not issued by the CA, expired, or the signature does not verify
        raise ModelBundleError(f"{where}: signature: {exc}") from None
    except CertificateError as exc:
        raise ModelBundleError(f"{where}: ca: {exc}") from None
    if manifest.get("cert_sha256") != _pem_sha256(cert):
        raise ModelBundleError(f"{where}: cert_sha256: not the fingerprint of the signing certificate")


def key_sha256(public_key) -> str | None:
    """Hex fingerprint of a Paillier public key (None when no key was used)."""
    fp = getattr(public_key, "fingerprint", None)
    return bytes(fp).hex() if fp is not None else None


def save_job_bundle(cfg, party, *, files: dict[str, Any], feature_names: list[str] | None = None,
                    preprocessing: dict | None = None, config: dict | None = None, metrics: dict | None = None,
                    public_key=None, extra: dict | None = None, task: str | None = None) -> Path | None:
    """:func:`write_bundle` for ``party`` of job ``cfg`` into ``<output_dir>/<party id>/model/``, signed with
    the party's certificate key (:func:`job_credentials`). A job whose file names no certificates (an
    ``insecure`` test job) writes no bundle: it logs a warning and returns None, since every bundle is signed.

    Raises ModelBundleError when the job file's certificate, key or CA cannot sign (naming the field).
    """
    credentials = job_credentials(cfg, party)
    if credentials is None:
        log.warning("%s: no model bundle written: bundles are signed with the party's certificate key, and this "
                    "job file names none (security.ca, parties[%s].cert / .key)", party.id, party.id)
        return None
    return write_bundle(cfg.output_dir(party.id), credentials=credentials, job_id=cfg.job.id,
                        algorithm=cfg.job.algorithm, party_id=party.id, role=party.role, files=files,
                        feature_names=feature_names, preprocessing=preprocessing, config=config, metrics=metrics,
                        peers=job_peers(cfg, party), paillier_key_sha256=key_sha256(public_key), extra=extra,
                        task=task)
