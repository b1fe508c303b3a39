"""Rendezvous over real gRPC with mutual TLS: a party started well before its partner says it is
waiting, at the configured cadence, then meets it; a partner that never comes is named at the
start-up timeout; a partner with another job description is refused before any protocol message."""
from __future__ import annotations

import logging
import re
import threading
import time

import pytest
import yaml

from secureflhv.runtime.job.load import load_job
from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.runtime.process.party import build_transport
from secureflhv.runtime.process.rendezvous import PartnerMissing, meet

from job_harness import make_job

DELAY_S = 4.0  # a real delay between the two starts
EVERY_S = 0.5  # the waiting-line cadence, shortened for the test


def _two_party_job(tmp_path, **job_fields):
    job = make_job(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["parties"] = [p for p in doc["parties"] if p["id"] != "server"]
    doc["params"]["mode"] = "two_party"
    doc["job"].update({"startup_log_interval_s": EVERY_S, **job_fields})
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    return job


def _meet_in_thread(cfg, party, results, **kw):
    def go():
        t = build_transport(cfg, cfg.party(party), insecure=False)
        try:
            results[party] = meet(t, cfg, [p.id for p in cfg.parties if p.id != party], **kw)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            results[party] = exc
        finally:
            t.close()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def test_early_party_logs_waiting_lines_then_meets_its_late_partner(tmp_path, caplog):
    cfg = load_job(_two_party_job(tmp_path, startup_timeout_s=60))
    host = cfg.party("host-1")
    results: dict = {}
    caplog.set_level(logging.INFO, logger="secureflhv.rendezvous")
    started = time.monotonic()
    guest = _meet_in_thread(cfg, "guest", results)
    time.sleep(DELAY_S)
    host_thread = _meet_in_thread(cfg, "host-1", results)
    guest.join(30)
    host_thread.join(30)
    assert isinstance(results["guest"], dict) and isinstance(results["host-1"], dict), results
    waiting = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for host-1 at")]
    pattern = re.compile(rf"waiting for host-1 at {re.escape(host.address)} \(attempt (\d+), 0:00:0\d of 0:01:00\)")
    assert all(pattern.fullmatch(line) for line in waiting), waiting
    attempts = [int(pattern.fullmatch(line).group(1)) for line in waiting]
    assert attempts == list(range(1, len(attempts) + 1))
    assert DELAY_S / EVERY_S * 0.6 <= len(attempts) <= DELAY_S / EVERY_S + 2  # a modest cadence, not a flood
    assert time.monotonic() - started >= DELAY_S
    assert any(r.getMessage().startswith("guest met host-1") for r in caplog.records)


def test_a_partner_that_never_comes_is_named_at_the_startup_timeout(tmp_path):
    cfg = load_job(_two_party_job(tmp_path, startup_timeout_s=1.5))
    results: dict = {}
    started = time.monotonic()
    _meet_in_thread(cfg, "guest", results).join(20)
    exc = results["guest"]
    assert isinstance(exc, PartnerMissing) and exc.peer == "host-1", exc
    assert "job.startup_timeout_s" in str(exc) and cfg.party("host-1").address in str(exc)
    assert 1.4 < time.monotonic() - started < 10


def test_a_different_job_description_is_refused_at_the_hello(tmp_path):
    job = _two_party_job(tmp_path, startup_timeout_s=20)
    cfg = load_job(job)
    doc = yaml.safe_load(job.read_text())
    doc["params"]["learning_rate"] = 0.5  # host-1's copy of the job file differs
    other = job.with_name("other.yaml")
    other.write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg_other = load_job(other)
    results: dict = {}
    threads = [_meet_in_thread(cfg, "guest", results), _meet_in_thread(cfg_other, "host-1", results)]
    for t in threads:
        t.join(30)
    for party, peer in (("guest", "host-1"), ("host-1", "guest")):
        assert isinstance(results[party], JobConfigError), results
        assert f"{peer} runs a different job description" in str(results[party])


def test_check_prints_a_table_of_peers(tmp_path, capsys):
    """`secureflhv check`: host-1 is up (reached over mutual TLS, both identities proved); the server is not."""
    from secureflhv.cli import main

    job = make_job(tmp_path)
    cfg = load_job(job)
    host = build_transport(cfg, cfg.party("host-1"), insecure=False)
    try:
        rc = main(["check", str(job), "--party", "guest", "--timeout", "1.5"])
    finally:
        host.close()
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:3]}
    assert rc == 1, out  # one peer unreachable
    assert rows["host-1"][1:4] == [cfg.party("host-1").address, "yes", "yes"] and rows["host-1"][5] == "ms", out
    assert rows["server"][1:5] == [cfg.party("server").address, "no", "?", "-"], out
    assert "server: guest: could not deliver '__check__'" in out
    assert host.received_bytes > 0  # the check messages did arrive at host-1


@pytest.mark.parametrize("field", ["startup_timeout_s", "startup_log_interval_s"])
def test_startup_settings_must_be_positive(tmp_path, field):
    with pytest.raises(JobConfigError, match=f"job.{field}"):
        load_job(_two_party_job(tmp_path, **{field: 0}))
