"""The job settings that keep PSI safe against a party that lies (issue 36): ``job.psi_security`` picks the
protocol (ECDH-PSI unless the job declares semi-honest parties; KKRT under the malicious default is refused,
because a guest that crafts its OT-extension matrix learns every host ID), and ``job.psi_max_ids`` bounds
every set, wired through to both protocols."""
import types

import numpy as np
import pytest

from secureflhv.runtime.job import data_prep
from secureflhv.runtime.job.job_file import JobConfigError, parse_job_file
from secureflhv.vertical import psi as vpsi
from secureflhv.vertical import psi_kkrt as vk


def job(**settings) -> dict:
    return {
        "job": {"id": "j1", "algorithm": "vertical_lr", **settings},
        "security": {"insecure": True},
        "parties": [
            {"id": "guest", "role": "guest", "address": "127.0.0.1:5002",
             "data": {"path": "g.csv", "id_column": "id", "label_column": "y"}},
            {"id": "host-1", "role": "host", "address": "127.0.0.1:5003", "data": {"path": "h.csv"}},
        ],
    }


@pytest.mark.parametrize("settings, protocol", [
    ({}, "ecdh"),                                                       # the default: malicious parties
    ({"psi_security": "malicious"}, "ecdh"),
    ({"psi_security": "semi_honest"}, "kkrt"),                          # declared semi-honest: the fast one
    ({"psi_security": "semi_honest", "psi_protocol": "ecdh"}, "ecdh"),
    ({"psi_security": "semi_honest", "psi_protocol": "kkrt"}, "kkrt"),
    ({"psi_protocol": "ecdh"}, "ecdh")])
def test_psi_protocol_follows_psi_security(settings, protocol):
    cfg = parse_job_file(job(**settings))
    assert cfg.job.psi_protocol == protocol
    assert data_prep.PSI_PROTOCOLS[protocol] is {"ecdh": vpsi, "kkrt": vk}[protocol]
    assert cfg.job.psi_security == settings.get("psi_security", "malicious")


def test_kkrt_under_the_malicious_default_is_refused_with_the_way_out():
    for settings in ({"psi_protocol": "kkrt"}, {"psi_protocol": "kkrt", "psi_security": "malicious"}):
        with pytest.raises(JobConfigError) as err:
            parse_job_file(job(**settings), source="job.yaml")
        msg = str(err.value)
        assert "invalid job file job.yaml" in msg and "psi_protocol: kkrt is safe only when every party follows " \
            "the protocol" in msg and "learns every host ID" in msg and "psi_security: semi_honest" in msg, msg


def test_psi_max_ids_default_and_bounds():
    cfg = parse_job_file(job())
    assert cfg.job.psi_max_ids == vpsi.DEFAULT_MAX_IDS == 10_000_000  # the job's default is the protocols'
    assert parse_job_file(job(psi_max_ids=5)).job.psi_max_ids == 5
    for bad in (0, -1, 2 ** 32, "many"):
        with pytest.raises(JobConfigError, match=r"job.psi_max_ids"):
            parse_job_file(job(psi_max_ids=bad))
    with pytest.raises(JobConfigError, match=r"job.psi_security"):
        parse_job_file(job(psi_security="trusting"))


@pytest.mark.parametrize("role, protocol", [("guest", "ecdh"), ("host", "ecdh"), ("guest", "kkrt"), ("host", "kkrt")])
def test_align_by_psi_passes_the_jobs_protocol_and_bound(monkeypatch, role, protocol):
    settings = {"psi_max_ids": 1234} if protocol == "ecdh" else {"psi_max_ids": 1234, "psi_security": "semi_honest"}
    cfg = parse_job_file(job(**settings))
    calls = []

    def fake(transport, ids, peers, **kw):
        calls.append((peers, kw))
        return vpsi.PsiResult(ids=["a", "b"], rows=np.arange(2), peer_sizes={})

    module = data_prep.PSI_PROTOCOLS[protocol]
    monkeypatch.setattr(module, f"align_ids_{role}", fake)
    party = cfg.guest if role == "guest" else cfg.hosts[0]
    data_prep.align_by_psi(cfg, party, None, types.SimpleNamespace(ids=["a", "b"], n_rows=2))
    assert calls == [(["host-1"] if role == "guest" else "guest", {"max_ids": 1234})]
