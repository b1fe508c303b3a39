"""Preflight: each mistake a new user makes first is found locally, before any protocol message.

`secureflhv validate JOB --party ID`, `party` and `run` exit 2 naming the party, the job-file field,
and the file / column / row; `party` sends nothing to a listening peer and `run` starts no process.
Also `secureflhv certs` giving each party only its own host names.
"""
from __future__ import annotations

import datetime as dt
import socket
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from secureflhv.cli import main
from secureflhv.runtime.process import launcher as launcher_mod
from secureflhv.runtime.job.load import load_job
from secureflhv.runtime.process.os_errors import plain_error, port_problem
from secureflhv.runtime.job.preflight import preflight
from secureflhv.transport.certs import _issue_party, generate_certificates, load_party_credentials

from job_harness import GUEST, HOST, edit, make_job

def validate(job: Path, party: str, capsys) -> tuple[int, str]:
    rc = main(["validate", str(job), "--party", party])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_a_good_party_passes(tmp_path, capsys):
    job = make_job(tmp_path)
    for party in ("server", "guest", "host-1"):
        rc, out = validate(job, party, capsys)
        assert rc == 0 and f"preflight of party {party!r} passed" in out, out


def _expired_cert(job: Path) -> None:
    certs = job.parent / "certs"
    ca_cert = x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), password=None)
    now = dt.datetime.now(dt.timezone.utc)
    key, cert = _issue_party("guest", [], ca_key, ca_cert, (now - dt.timedelta(days=30), now - dt.timedelta(days=1)))
    (certs / "guest.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (certs / "guest.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))


def _other_ca(job: Path) -> None:
    generate_certificates(job.parent / "other", ["guest"])
    edit(job, "guest", cert=str(job.parent / "other" / "guest.pem"), key=str(job.parent / "other" / "guest.key"))


CASES = {
    "wrong certificate path": (lambda job: edit(job, "guest", cert="certs/guest-typo.pem"),
                               "guest", ["parties[1].cert (party 'guest')", "file not found", "guest-typo.pem"]),
    "certificate of another party": (lambda job: edit(job, "guest", cert="certs/host-1.pem", key="certs/host-1.key"),
                                     "guest", ["parties[1].cert (party 'guest')", "for party 'host-1'", "not 'guest'"]),
    "key of another certificate": (lambda job: edit(job, "guest", key="certs/host-1.key"),
                                   "guest", ["parties[1].key (party 'guest')", "does not belong to certificate"]),
    "expired certificate": (_expired_cert, "guest", ["parties[1].cert (party 'guest')", "has expired",
                                                     "secureflhv certs"]),
    "certificate from another CA": (_other_ca, "guest", ["parties[1].cert (party 'guest')", "not signed by the CA"]),
    "label column that does not exist": (lambda job: edit(job, "guest", data_label_column="target"), "guest",
                                         ["parties[1].data.label_column (party 'guest')", "no column 'target'",
                                          "guest.csv", "id, label, f1, f2"]),
    "data file missing": (lambda job: edit(job, "host-1", data_path="data/nope.csv"), "host-1",
                          ["parties[2].data.path (party 'host-1')", "data file not found", "nope.csv"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_mistake_is_named_before_anything_starts(tmp_path, capsys, case):
    breaks, party, expected = CASES[case]
    job = make_job(tmp_path)
    breaks(job)
    rc, out = validate(job, party, capsys)
    assert rc == 2, out
    for text in expected:
        assert text in out, f"{text!r} not in:\n{out}"


@pytest.mark.parametrize("party, table, cell, expected", [
    ("host-1", "host", ("h2", 3, "abc"), ["parties[2].data (party 'host-1')", "host_1.csv", "column 'h2'",
                                          "row 3 (line 4)", "non-numeric value 'abc'"]),
    ("guest", "guest", ("f1", 5, "-inf"), ["parties[1].data (party 'guest')", "guest.csv", "column 'f1'",
                                           "row 5 (line 6)", "infinite value"]),
    ("guest", "guest", ("label", 2, ""), ["parties[1].data.label_column (party 'guest')", "column 'label'",
                                          "row 2 (line 3)", "empty cell"]),
    ("host-1", "host", ("id", 4, "u0"), ["parties[2].data.id_column (party 'host-1')", "row 4", "duplicate id 'u0'"]),
])
def test_bad_cells_are_named_with_file_column_and_row(tmp_path, capsys, party, table, cell, expected):
    column, row, value = cell
    lines = (GUEST if table == "guest" else HOST).splitlines()
    header = lines[0].split(",")
    cells = lines[row].split(",")
    cells[header.index(column)] = value
    lines[row] = ",".join(cells)
    text = "\n".join(lines) + "\n"
    job = make_job(tmp_path, **{table: text})
    rc, out = validate(job, party, capsys)
    assert rc == 2, out
    for piece in expected:
        assert piece in out, f"{piece!r} not in:\n{out}"
    finding = next(f for f in preflight(load_job(job), party) if f.column == column)
    assert finding.row == row and finding.file.name == ("guest.csv" if table == "guest" else "host_1.csv")


def test_port_in_use_is_one_plain_sentence(tmp_path, capsys):
    job = make_job(tmp_path)
    address = load_job(job).party("guest").address
    host, port = address.rsplit(":", 1)
    with socket.socket() as squatter:
        squatter.bind((host, int(port)))
        squatter.listen()
        rc, out = validate(job, "guest", capsys)
    assert rc == 2
    assert "parties[1].address (party 'guest')" in out
    assert f"port {port} on {host} is already in use by another program" in out
    assert "GRPC_VERBOSITY" not in out


def test_party_and_run_stop_before_any_protocol_message(tmp_path, capsys, monkeypatch):
    """A bad cell at the guest: `party` exits 2 and a listening host-1 receives nothing; `run` starts nothing."""
    from secureflhv.transport.grpc_transport import GrpcTransport

    lines = GUEST.splitlines()
    lines[5] = "u4,0,n/k,6"
    job = make_job(tmp_path, guest="\n".join(lines) + "\n")
    cfg = load_job(job)
    host = cfg.party("host-1")
    tls = load_party_credentials(ca_cert=cfg.resolve(cfg.security.ca), cert=cfg.resolve(host.cert),
                                 key=cfg.resolve(host.key), party_id="host-1")
    listener = GrpcTransport("host-1", cfg.job.id, host.address, {p.id: p.address for p in cfg.parties}, tls=tls)
    try:
        rc = main(["party", str(job), "--party", "guest"])
        err = capsys.readouterr().err
        assert rc == 2 and "column 'f1', row 5 (line 6): non-numeric value 'n/k'" in err and "nothing was sent" in err, err
        assert listener.received_bytes == 0 and listener.rejected == []
    finally:
        listener.close()

    def must_not_start(self):
        raise AssertionError("a party was started despite a preflight finding")

    monkeypatch.setattr(launcher_mod.Launcher, "start", must_not_start)
    rc = main(["run", str(job)])
    out = capsys.readouterr().out
    assert rc == 2 and "no party was started" in out and "parties[1].data (party 'guest')" in out, out


def test_certs_give_each_party_only_its_own_names(tmp_path, capsys):
    job = make_job(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["parties"][2]["address"] = "10.0.0.6:50553"  # host-1 on its own machine
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    out_dir = tmp_path / "issued"
    rc = main(["certs", "--job", str(job), "--out", str(out_dir), "--hostname", "guest=bank-a.example"])
    assert rc == 0, capsys.readouterr()

    def names(pid):
        cert = x509.load_pem_x509_certificate((out_dir / f"{pid}.pem").read_bytes())
        return {str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value}

    assert names("guest") == {"guest", "bank-a.example", "127.0.0.1"}
    assert names("host-1") == {"host-1", "10.0.0.6"}
    assert names("server") == {"server", "127.0.0.1"}
    rc = main(["certs", "--job", str(job), "--out", str(tmp_path / "x"), "--hostname", "gust=a.example"])
    assert rc == 2 and "'gust' is not one of the parties" in capsys.readouterr().err


def test_plain_sentences_for_common_os_errors(tmp_path):
    assert plain_error(FileNotFoundError(2, "No such file or directory", "/x/ca.pem")) == "file not found: /x/ca.pem"
    assert "permission denied on /x/k.key" in plain_error(PermissionError(13, "Permission denied", "/x/k.key"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        exc = port_problem(f"127.0.0.1:{port}")
        assert exc is not None and "already in use" in plain_error(exc)
        grpc_said = RuntimeError(f"guest: cannot listen on '127.0.0.1:{port}': Failed to bind to address; "
                                 f"set GRPC_VERBOSITY=debug")
        assert plain_error(grpc_said).startswith(f"port {port} on 127.0.0.1 is already in use")


def test_version_names_the_gmp_under_the_homomorphic_layer(capsys):
    """`secureflhv --version` says which GMP gmpy2 runs on (`make gmp`: the system's, ~25% faster powmod)."""
    import gmpy2

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("secureflhv ") and f"on {gmpy2.mp_version()}" in out
