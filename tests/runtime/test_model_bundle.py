"""Model bundles (write / verify / refuse) and the notebook API ``secureflhv.load_model`` — no network.

Bundles are signed with the party's certificate key (test certificates from ``generate_certificates``);
attacks on the signature are in ``test_bundle_signature.py``."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import secureflhv
from secureflhv.runtime.store.model_bundle import (FORMAT_VERSION, ModelBundleError,
                                                   read_bundle as _read_bundle, write_bundle)
from secureflhv.transport.certs import generate_certificates, load_party_credentials


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A job CA and certificates for the parties these tests' bundles belong to."""
    d = tmp_path_factory.mktemp("certs")
    generate_certificates(d, ["guest", "host-1", "c1"])
    return d


def read_bundle(path, certs, **kw):
    return _read_bundle(path, ca=certs / "ca.pem", **kw)


def _write(tmp_path, certs, **kw):
    args = dict(credentials=load_party_credentials(certs, "guest"), job_id="job-a", algorithm="vertical_lr", party_id="guest", role="guest",
                files={"weights.npy": np.array([0.1, -2.5, 1e-300]), "meta.json": {"a": [1, 2]},
                       "state.safetensors": {"layer.weight": np.arange(6, dtype=np.float32).reshape(2, 3)},
                       "model.xgboost.json": '{"learner": {}}'},
                feature_names=["f1", "f2", "f3"], preprocessing={"standardisation": {"mean": [1.0], "std": [2.0]}},
                metrics={"test": {"auc": 0.9}}, paillier_key_sha256="ab" * 32)
    args.update(kw)
    return write_bundle(tmp_path / "guest", **args)


def test_round_trip_is_exact_and_complete(tmp_path, certs):
    where = _write(tmp_path, certs)
    assert where == tmp_path / "guest" / "model"
    b = read_bundle(tmp_path / "guest", certs, expect_party="guest", expect_job="job-a", expect_role="guest")
    np.testing.assert_array_equal(b.file("weights.npy"), [0.1, -2.5, 1e-300])
    assert b.file("weights.npy").dtype == np.float64
    assert b.file("meta.json") == {"a": [1, 2]}
    np.testing.assert_array_equal(b.file("state.safetensors")["layer.weight"], np.arange(6).reshape(2, 3))
    assert b.file("model.xgboost.json") == '{"learner": {}}'
    assert b.format_version == FORMAT_VERSION and b.feature_names == ["f1", "f2", "f3"]
    assert b.preprocessing["standardisation"]["std"] == [2.0] and b.paillier_key_sha256 == "ab" * 32
    assert {f: i["format"] for f, i in b.manifest["files"].items()} == {
        "weights.npy": "npy", "meta.json": "json", "state.safetensors": "safetensors",
        "model.xgboost.json": "xgboost-json"}
    with pytest.raises(ModelBundleError, match=r"files: no 'nope.npy'"):
        b.file("nope.npy")


def test_rewrite_replaces_atomically(tmp_path, certs):
    _write(tmp_path, certs)
    _write(tmp_path, certs, files={"weights.npy": np.ones(2)})
    assert sorted(p.name for p in (tmp_path / "guest").iterdir()) == ["model"]  # no temporary folder left
    assert list(read_bundle(tmp_path / "guest", certs).files) == ["weights.npy"]


@pytest.mark.parametrize("change, message", [
    (lambda d: (d / "weights.npy").write_bytes((d / "weights.npy").read_bytes()[:-8] + b"\0" * 8),
     r"files\[weights.npy\].sha256: the file does not match"),
    (lambda d: (d / "meta.json").unlink(), r"files\[meta.json\]: cannot read it"),
    (lambda d: _edit(d, metrics={"test": {"auc": 0.99}}), "signature: signature of 'guest' does not verify"),
    (lambda d: _edit(d, format_version=FORMAT_VERSION + 1), "format_version: 3 is not supported"),
    (lambda d: _edit(d, format="something"), "format: 'something' is not a secureflhv model bundle"),
    (lambda d: (d / "manifest.json").write_text("{"), "manifest.json: not valid JSON"),
    (lambda d: (d / "manifest.json").unlink(), "no readable manifest.json"),
])
def test_damage_is_refused_naming_the_field(tmp_path, certs, change, message):
    change(_write(tmp_path, certs))
    with pytest.raises(ModelBundleError, match=message):
        read_bundle(tmp_path / "guest", certs)


def _edit(d, **fields):
    doc = json.loads((d / "manifest.json").read_text())
    doc.update(fields)
    (d / "manifest.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("kw, message", [
    ({"expect_party": "host-1"}, "party_id: this bundle belongs to party 'guest', not 'host-1'"),
    ({"expect_job": "job-b"}, "job_id: this bundle belongs to job 'job-a', not 'job-b'"),
    ({"expect_role": "host"}, "role: this bundle belongs to role 'guest', not 'host'"),
])
def test_foreign_bundle_is_refused(tmp_path, certs, kw, message):
    _write(tmp_path, certs)
    with pytest.raises(ModelBundleError, match=message):
        read_bundle(tmp_path / "guest", certs, **kw)


def test_unsafe_content_is_never_written(tmp_path, certs):
    with pytest.raises(ValueError, match="object arrays"):
        _write(tmp_path, certs, files={"w.npy": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(ValueError, match="parameter file name"):
        _write(tmp_path, certs, files={"../w.npy": np.ones(1)})
    with pytest.raises(ValueError, match="use .npy"):
        _write(tmp_path, certs, files={"w.pkl": np.ones(1)})
    assert not (tmp_path / "guest" / "model").exists()


# --------------------------------------------------------------------------------- load_model
def test_horizontal_torch_model_scores_locally(tmp_path, certs):
    import torch

    from secureflhv.horizontal.models import ModelSpec, build_model, named_arrays

    spec = ModelSpec(name="mlp", n_features=5, n_classes=3, hidden=(4,))
    net = build_model(spec, seed=3)
    write_bundle(tmp_path / "c1", credentials=load_party_credentials(certs, "c1"),
                 job_id="fl", algorithm="horizontal", party_id="c1", role="host",
                 files={"model.safetensors": named_arrays(net)}, config={"model": spec.model_dump(mode="json")})
    model = secureflhv.load_model(tmp_path / "c1", ca=certs / "ca.pem", expect_party="c1")
    X = np.random.default_rng(0).normal(size=(7, 5))
    with torch.no_grad():
        want = torch.softmax(net(torch.from_numpy(X.astype(np.float32))), 1).numpy()
    np.testing.assert_array_equal(model.predict_proba(X), want.astype(np.float64))
    np.testing.assert_array_equal(model.predict(X), want.argmax(1))
    assert model.describe()["local"] is True and model.describe()["algorithm"] == "horizontal"


def test_horizontal_trees_score_locally_and_match_xgboost(tmp_path, certs):
    import pandas as pd
    import xgboost

    from secureflhv.tree.binning import fit_cuts
    from secureflhv.tree.model import model_to_dict
    from secureflhv.tree.params import SecureBoostParams
    from secureflhv.tree.reference import fit_reference
    from secureflhv.tree.xgb_export import to_xgboost_json

    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 4))
    y = (X[:, 0] + 0.5 * X[:, 2] > 0).astype(int)
    prm = SecureBoostParams(n_trees=3, max_depth=3)
    ref = fit_reference(X, y, fit_cuts(X, prm.max_bin), prm)
    ref = getattr(ref, "model", ref)
    names = ["a", "b", "c", "d"]
    write_bundle(tmp_path / "c1", credentials=load_party_credentials(certs, "c1"),
                 job_id="hsb", algorithm="secureboost_horizontal", party_id="c1", role="guest",
                 files={"model.json": model_to_dict(ref), "model.xgboost.json": json.dumps(to_xgboost_json(ref))},
                 feature_names=names)
    model = secureflhv.load_model(tmp_path / "c1" / "model", ca=certs / "ca.pem")
    p = model.predict_proba(pd.DataFrame(X[:, ::-1], columns=names[::-1]))  # columns taken by name
    np.testing.assert_array_equal(p, ref.predict(X))
    booster = xgboost.Booster()
    booster.load_model(bytearray(model.bundle.file("model.xgboost.json").encode()))
    np.testing.assert_allclose(booster.predict(xgboost.DMatrix(X.astype(np.float32))), p, rtol=1e-5)
    with pytest.raises(ValueError, match=r"no column\(s\) \['a'\]"):
        model.predict(pd.DataFrame(X[:, 1:], columns=names[1:]))


def test_vertical_model_points_to_the_prediction_job(tmp_path, certs):
    _write(tmp_path, certs)
    model = secureflhv.load_model(tmp_path / "guest", ca=(certs / "ca.pem").read_bytes())
    assert model.describe()["local"] is False and model.describe()["feature_names"] == ["f1", "f2", "f3"]
    with pytest.raises(ModelBundleError, match="job.algorithm: predict"):
        model.predict(np.zeros((1, 3)))


def test_load_model_is_a_lazy_export():
    code = "import sys, secureflhv; assert 'secureflhv.runtime' not in sys.modules; secureflhv.load_model; " \
           "assert 'secureflhv.runtime.store.model_api' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
