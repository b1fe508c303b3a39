"""A malformed job file is refused with an error that names the file and the bad field."""
from pathlib import Path

import pytest
import yaml

from secureflhv.cli import main
from secureflhv.runtime.job.load import JobConfigError, load_job
from secureflhv.runtime.job.registry import job_params


def good_job() -> dict:
    return {
        "job": {"id": "j1", "algorithm": "vertical_lr"},
        "security": {"ca": "certs/ca.pem"},
        "parties": [
            {"id": "server", "role": "server", "address": "127.0.0.1:5001", "cert": "c", "key": "k"},
            {"id": "guest", "role": "guest", "address": "127.0.0.1:5002", "cert": "c", "key": "k",
             "data": {"path": "g.csv", "id_column": "id", "label_column": "y"}},
            {"id": "host-1", "role": "host", "address": "127.0.0.1:5003", "cert": "c", "key": "k",
             "data": {"path": "h.csv"}},
        ],
        "params": {"epochs": 3},
    }


def write(tmp_path: Path, doc) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return path


def test_good_job_loads_and_resolves_paths_against_its_folder(tmp_path):
    cfg = load_job(write(tmp_path, good_job()))
    assert [p.id for p in cfg.hosts] == ["host-1"] and cfg.guest.id == "guest" and cfg.server.id == "server"
    assert cfg.resolve(cfg.guest.data.path) == (tmp_path / "g.csv").resolve()
    assert cfg.output_dir("guest") == (tmp_path / "out" / "guest").resolve()
    assert job_params(cfg).epochs == 3
    assert cfg.job.psi_protocol == "ecdh"  # the default (psi_security: malicious); see test_psi_job_settings.py
    assert load_job(write(tmp_path, mutate("job.psi_security", "semi_honest"))).job.psi_protocol == "kkrt"


def mutate(path_expr: str, value):
    doc = good_job()
    *parents, last = path_expr.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize("change, expected", [
    (("parties.1.address", "no-port"), "parties[1].address"),
    (("parties.2.data", KeyError), "parties[2].data: required for host"),
    (("parties.1.data.label_column", KeyError), "parties[1].data.label_column"),
    (("parties.0.role", "arbiterr"), "parties[0].role"),
    (("job.algorithm", "fedavg_typo"), "job.algorithm"),
    (("job.deadline_s", -1), "job.deadline_s"),
    (("parties.2.id", "guest"), "duplicate party id"),
    (("parties.2.address", "127.0.0.1:5002"), "two parties listen on"),
    (("security.ca", KeyError), "security.ca"),
    (("parties.1.cert", KeyError), "parties[1].cert"),
    (("parties.1.data.colour", "blue"), "parties[1].data.colour: unknown field"),
    (("parties.1.data.max_memory_mb", 0), "parties[1].data.max_memory_mb"),
    (("parties.2.data.batch_rows", 100), "parties[2].data: batch_rows: only used with max_memory_mb"),
])
def test_bad_field_is_named(tmp_path, change, expected):
    with pytest.raises(JobConfigError) as err:
        load_job(write(tmp_path, mutate(*change)))
    assert expected in str(err.value)
    assert str(tmp_path / "job.yaml") in str(err.value)


@pytest.mark.parametrize("params, expected", [
    ({"epochs": 0}, "params.epochs"),
    ({"learning_rat": 0.1}, "params.learning_rat: unknown parameter"),
    ({"key_bits": 1024}, "key_bits"),
    ({"insecure_test_key": True}, "security.insecure_test_keys"),
    ({"mode": "two_party"}, "params.mode"),
    ({"test_fraction": 1.5}, "params.test_fraction"),
    ({"task": "ordinal"}, "params.task"),
])
def test_bad_params_are_named(tmp_path, params, expected):
    with pytest.raises(JobConfigError) as err:
        load_job(write(tmp_path, mutate("params", params)))
    assert expected in str(err.value)
    assert str(tmp_path / "job.yaml") in str(err.value)


def test_small_keys_only_through_the_explicit_test_setting(tmp_path):
    doc = mutate("params", {"key_bits": 1024})
    doc["security"]["insecure_test_keys"] = True
    assert job_params(load_job(write(tmp_path, doc))).key_bits == 1024


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(JobConfigError, match="cannot read job file"):
        load_job(tmp_path / "missing.yaml")
    with pytest.raises(JobConfigError, match="not valid YAML"):
        load_job(write(tmp_path, "job: [unclosed"))
    with pytest.raises(JobConfigError, match="top level must be a mapping"):
        load_job(write(tmp_path, "- a\n- b\n"))


def test_cli_reports_the_field_and_exits_2(tmp_path, capsys):
    path = write(tmp_path, mutate("parties.1.address", "nowhere"))
    assert main(["validate", str(path)]) == 2
    assert "parties[1].address" in capsys.readouterr().err
    assert main(["party", str(path), "--party", "guest"]) == 2


def test_cli_party_unknown_id_and_insecure_confirmation(tmp_path, capsys):
    path = write(tmp_path, good_job())
    assert main(["party", str(path), "--party", "nobody"]) == 2
    assert "'nobody' is not in job" in capsys.readouterr().err
    doc = good_job()
    doc["security"] = {"insecure": True}
    path = write(tmp_path, doc)
    assert main(["party", str(path), "--party", "guest"]) == 2
    assert "pass --insecure" in capsys.readouterr().err


@pytest.mark.parametrize("algorithm, roles, expected", [
    ("vertical_lr", ["server", "guest", "guest"], "exactly one guest"),
    ("vertical_lr", ["server", "guest"], "at least one host"),
    ("horizontal", ["guest", "host", "host"], "exactly one server"),
    ("horizontal", ["server", "host"], "at least two clients"),
])
def test_family_role_rules_come_from_the_registry(tmp_path, algorithm, roles, expected):
    doc = good_job()
    doc["job"]["algorithm"] = algorithm
    doc["params"] = {}
    parties = []
    for i, role in enumerate(roles):
        party = {"id": f"p{i}", "role": role, "address": f"127.0.0.1:{5100 + i}", "cert": "c", "key": "k"}
        if role != "server":
            party["data"] = {"path": f"p{i}.csv", "label_column": "y"}
        parties.append(party)
    doc["parties"] = parties
    with pytest.raises(JobConfigError, match=expected):
        load_job(write(tmp_path, doc))


def test_every_registered_algorithm_is_known_to_validation_and_documented():
    from secureflhv.runtime.job.registry import JOBS, job_spec

    docs = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    for name, spec in JOBS.items():
        assert job_spec(name) is spec and spec.family in ("vertical", "horizontal", "peer")
        assert f"`{name}`" in docs, f"docs/architecture.md does not list algorithm {name}"
    with pytest.raises(JobConfigError, match="choose one of"):
        job_spec("fedavg_typo")
