"""Ready-made jobs on this machine: party tables, certificates and a job file in one folder.

Used by ``examples/*.py`` and the end-to-end tests, so both run exactly the same set-up a user would
write by hand: one table per party, a CA and one certificate per party (``secureflhv certs``), and a
job file listing every party on a free loopback port (:func:`write_job`).
"""
from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import yaml


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports that are free right now on ``host``."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def vertical_tables(dataset, out_dir: Path, n_hosts: int = 1, seed: int = 0, *, host_overlap: float = 0.92,
                    guest_missing: float = 0.05, scheme: str = "even", id_column: str = "id",
                    label_column: str = "label") -> tuple[Path, list[Path]]:
    """Write ``dataset`` as vertical party CSVs (``id_column``, features, ``label_column`` at the guest).

    Columns are split by ``scheme`` (see :func:`secureflhv.data.vertical_split`); each host holds ``host_overlap`` of the ids and the guest then loses ``guest_missing`` of
    its rows, so each side has ids the other lacks and PSI has real work. Returns (guest csv, [host csvs]).
    """
    import pandas as pd

    from ...data import vertical_split, write_vertical_csvs

    vp = vertical_split(dataset, n_hosts, scheme, seed, sample_overlap=host_overlap)
    paths = write_vertical_csvs(dataset, vp, Path(out_dir), id_column=id_column, label_column=label_column)
    guest = pd.read_csv(paths["guest"], dtype={id_column: str})
    keep = np.random.default_rng([seed, 1]).random(len(guest)) >= guest_missing
    guest[keep].to_csv(paths["guest"], index=False, float_format="%.17g")
    return paths["guest"], [paths[f"host_{i}"] for i in range(1, n_hosts + 1)]


def breast_cancer_tables(out_dir: Path, n_hosts: int = 1, seed: int = 0, *, host_overlap: float = 0.92,
                         guest_missing: float = 0.05, scheme: str = "even") -> tuple[Path, list[Path]]:
    """scikit-learn's breast-cancer data as vertical party CSVs (:func:`vertical_tables`)."""
    from ...data import load_sklearn

    return vertical_tables(load_sklearn("breast_cancer"), out_dir, n_hosts, seed, host_overlap=host_overlap,
                           guest_missing=guest_missing, scheme=scheme)


def write_job(work: Path, job_id: str, algorithm: str, parties: list[dict], params: dict, *,
              deadline_s: float = 300, tls: bool = True, insecure_test_keys: bool = False) -> Path:
    """Certificates (if ``tls``) and ``job.yaml`` in ``work`` for parties on free loopback ports.

    Args:
        parties: ``{"id", "role"[, "data"]}`` per party, in job-file order; each gets an ``address``
            (and, with ``tls``, ``cert``/``key`` under ``work/certs``).
        params: the job's ``params`` section.
    Returns the job file's path.
    """
    from ...transport.certs import generate_certificates

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    ids = [party["id"] for party in parties]
    if tls:
        generate_certificates(work / "certs", ids, overwrite=True)
    entries = []
    for party, port in zip(parties, free_ports(len(ids))):
        entry = {"id": party["id"], "role": party["role"], "address": f"127.0.0.1:{port}"}
        if tls:
            entry.update(cert=f"certs/{party['id']}.pem", key=f"certs/{party['id']}.key")
        if "data" in party:
            entry["data"] = party["data"]
        entries.append(entry)
    security = {"ca": "certs/ca.pem"} if tls else {"insecure": True}
    if insecure_test_keys:
        security["insecure_test_keys"] = True
    job = {
        "job": {"id": job_id, "algorithm": algorithm, "output_dir": "out", "deadline_s": deadline_s},
        "security": security,
        "parties": entries,
        "params": params,
    }
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    return path


def vertical_parties(guest_csv: Path, host_csvs: list[Path], *, server: bool, id_column: str,
                      label_column: str) -> list[dict]:
    """``server`` (if asked), ``guest`` and ``host-1`` ... ``host-H`` with their tables."""
    parties = [{"id": "server", "role": "server"}] if server else []
    parties.append({"id": "guest", "role": "guest",
                    "data": {"path": str(Path(guest_csv).resolve()), "id_column": id_column,
                             "label_column": label_column}})
    parties += [{"id": f"host-{i}", "role": "host", "data": {"path": str(Path(csv).resolve()), "id_column": id_column}}
                for i, csv in enumerate(host_csvs, 1)]
    return parties


def write_vertical_lr_job(work: Path, guest_csv: Path, host_csvs: list[Path], params: dict, *,
                          job_id: str = "vertical-lr-demo", mode: str = "arbiter", id_column: str = "id",
                          label_column: str = "label", deadline_s: float = 300, tls: bool = True,
                          insecure_test_keys: bool = False) -> Path:
    """Write certificates (if ``tls``) and ``job.yaml`` into ``work``; return the job file's path.

    Parties: ``server`` (arbiter mode only), ``guest``, ``host-1`` ... ``host-H`` on free loopback ports.
    """
    parties = vertical_parties(guest_csv, host_csvs, server=mode == "arbiter", id_column=id_column,
                                label_column=label_column)
    return write_job(work, job_id, "vertical_lr", parties, {"mode": mode, **params}, deadline_s=deadline_s,
                     tls=tls, insecure_test_keys=insecure_test_keys)


def write_vertical_nn_job(work: Path, guest_csv: Path, host_csvs: list[Path], params: dict, *,
                          job_id: str = "vertical-nn-demo", dataset=None, n_hosts: int | None = None,
                          seed: int = 0, scheme: str = "even", host_overlap: float = 0.92,
                          guest_missing: float = 0.05, id_column: str = "id", label_column: str = "label",
                          deadline_s: float = 600, tls: bool = True, insecure_test_keys: bool = False) -> Path:
    """A split-NN (``algorithm: vertical_nn``) job in ``work``: guest + hosts, no server.

    With ``dataset`` (a :class:`secureflhv.data.Dataset`) and ``n_hosts``, first writes its vertical party
    CSVs into ``work/data`` (:func:`vertical_tables`: columns split by ``scheme``, each host holding
    ``host_overlap`` of the ids, the guest losing ``guest_missing`` of its rows, so PSI has work) and
    ignores ``guest_csv``/``host_csvs``. Certificates (if ``tls``) and ``job.yaml`` as in
    :func:`write_vertical_lr_job`; returns the job path.
    """
    work = Path(work)
    if dataset is not None:
        guest_csv, host_csvs = vertical_tables(dataset, work / "data", int(n_hosts or 1), seed,
                                               host_overlap=host_overlap, guest_missing=guest_missing,
                                               scheme=scheme, id_column=id_column, label_column=label_column)
    parties = vertical_parties(guest_csv, host_csvs, server=False, id_column=id_column, label_column=label_column)
    return write_job(work, job_id, "vertical_nn", parties, dict(params), deadline_s=deadline_s, tls=tls,
                     insecure_test_keys=insecure_test_keys)
