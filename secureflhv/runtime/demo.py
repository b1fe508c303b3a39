"""Ready-made vertical LR jobs on this machine: party tables, certificates and a job file in one folder.

Used by ``examples/vertical_lr.py`` (the main job) and the end-to-end tests, so both run exactly the
same set-up a user would write by hand: one CSV per party, a CA and one certificate per party
(``secureflhv certs``), and a job file listing every party on a free loopback port.
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


def breast_cancer_tables(out_dir: Path, n_hosts: int = 1, seed: int = 0, *, host_overlap: float = 0.92,
                         guest_missing: float = 0.05, scheme: str = "even") -> tuple[Path, list[Path]]:
    """Write scikit-learn's breast-cancer data as vertical party CSVs (``id``, features, ``label`` at the guest).

    Columns are split by ``scheme`` (see :func:`secureflhv.data.vertical_split`); each host holds
    ``host_overlap`` of the ids and the guest then loses ``guest_missing`` of its rows, so each side has
    ids the other lacks and PSI has real work. Returns (guest csv, [host csvs]).
    """
    import pandas as pd

    from ..data import load_sklearn, vertical_split, write_vertical_csvs

    ds = load_sklearn("breast_cancer")
    vp = vertical_split(ds, n_hosts, scheme, seed, sample_overlap=host_overlap)
    paths = write_vertical_csvs(ds, vp, Path(out_dir), id_column="id", label_column="label")
    guest = pd.read_csv(paths["guest"], dtype={"id": str})
    keep = np.random.default_rng([seed, 1]).random(len(guest)) >= guest_missing
    guest[keep].to_csv(paths["guest"], index=False, float_format="%.17g")
    return paths["guest"], [paths[f"host_{i}"] for i in range(1, n_hosts + 1)]


def write_vertical_lr_job(work: Path, guest_csv: Path, host_csvs: list[Path], params: dict, *,
                          job_id: str = "vertical-lr-demo", mode: str = "arbiter", id_column: str = "id",
                          label_column: str = "label", deadline_s: float = 300, tls: bool = True,
                          insecure_test_keys: bool = False) -> Path:
    """Write certificates (if ``tls``) and ``job.yaml`` into ``work``; return the job file's path.

    Parties: ``server`` (arbiter mode only), ``guest``, ``host-1`` ... ``host-H`` on free loopback ports.
    """
    from ..transport.certs import generate_certificates

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    ids = (["server"] if mode == "arbiter" else []) + ["guest"] + [f"host-{i}" for i in range(1, len(host_csvs) + 1)]
    if tls:
        generate_certificates(work / "certs", ids, overwrite=True)
    parties = []
    for pid, port in zip(ids, free_ports(len(ids))):
        role = "server" if pid == "server" else "guest" if pid == "guest" else "host"
        party = {"id": pid, "role": role, "address": f"127.0.0.1:{port}"}
        if tls:
            party.update(cert=f"certs/{pid}.pem", key=f"certs/{pid}.key")
        if role == "guest":
            party["data"] = {"path": str(Path(guest_csv).resolve()), "id_column": id_column,
                             "label_column": label_column}
        elif role == "host":
            party["data"] = {"path": str(Path(host_csvs[int(pid.split("-")[1]) - 1]).resolve()),
                             "id_column": id_column}
        parties.append(party)
    security = {"ca": "certs/ca.pem"} if tls else {"insecure": True}
    if insecure_test_keys:
        security["insecure_test_keys"] = True
    job = {
        "job": {"id": job_id, "algorithm": "vertical_lr", "output_dir": "out", "deadline_s": deadline_s},
        "security": security,
        "parties": parties,
        "params": {"mode": mode, **params},
    }
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    return path


def write_vertical_nn_job(work: Path, guest_csv: Path, host_csvs: list[Path], params: dict, *,
                          job_id: str = "vertical-nn-demo", dataset=None, n_hosts: int | None = None,
                          seed: int = 0, scheme: str = "even", host_overlap: float = 0.92,
                          guest_missing: float = 0.05, id_column: str = "id", label_column: str = "label",
                          deadline_s: float = 600, tls: bool = True, insecure_test_keys: bool = False) -> Path:
    """A split-NN (``algorithm: vertical_nn``) job in ``work``: guest + hosts, no server.

    With ``dataset`` (a :class:`secureflhv.data.Dataset`) and ``n_hosts``, first writes its vertical party
    CSVs into ``work/data`` (columns split by ``scheme``, each host holding ``host_overlap`` of the ids,
    the guest losing ``guest_missing`` of its rows, so PSI has work) and ignores ``guest_csv``/``host_csvs``.
    Certificates (if ``tls``) and ``job.yaml`` as in :func:`write_vertical_lr_job`; returns the job path.
    """
    import pandas as pd

    from ..data import vertical_split, write_vertical_csvs

    work = Path(work)
    if dataset is not None:
        vp = vertical_split(dataset, int(n_hosts or 1), scheme, seed, sample_overlap=host_overlap)
        paths = write_vertical_csvs(dataset, vp, work / "data", id_column=id_column, label_column=label_column)
        guest = pd.read_csv(paths["guest"], dtype={id_column: str})
        keep = np.random.default_rng([seed, 1]).random(len(guest)) >= guest_missing
        guest[keep].to_csv(paths["guest"], index=False, float_format="%.17g")
        guest_csv, host_csvs = paths["guest"], [paths[f"host_{i}"] for i in range(1, int(n_hosts or 1) + 1)]
    path = write_vertical_lr_job(work, guest_csv, host_csvs, {}, job_id=job_id, mode="two_party",
                                 id_column=id_column, label_column=label_column, deadline_s=deadline_s, tls=tls,
                                 insecure_test_keys=insecure_test_keys)
    job = yaml.safe_load(path.read_text(encoding="utf-8"))
    job["job"]["algorithm"] = "vertical_nn"
    job["params"] = dict(params)
    path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    return path
