"""A party's batch crypto on a real two-node Ray cluster on loopback (``ray start --head`` + ``ray start --address``).

One cluster for the module (starting one is slow), always stopped (only its own processes). Shows:
the Ray executor's results equal the local pool's; vertical LR and vertical SecureBoost jobs with real
party processes (gRPC + mutual TLS) give identical models whether the parties' work runs on the local
pool or on Ray (the Ray runs also read their tables in row batches, the SecureBoost guest's from
Parquet, and bin them in bounded memory); a Ray worker killed mid-step is retried by Ray (exact result), and with retries off the
step fails with an error naming the party and the step, without hanging.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from secureflhv.compute import executor as ex
from secureflhv.crypto.homomorphic import paillier as pl
from secureflhv.crypto.homomorphic import paillier_hist as ph
from secureflhv.compute.executor import ComputeError
from secureflhv.runtime.job.demo import breast_cancer_tables, vertical_parties, write_job

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).parent / "ray")
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args, env=None, sessions: list[int] | None = None) -> None:
    """``ray ARGS`` in a session of its own, whose id is appended to ``sessions``: the daemons it starts stay in
    that session (the agents among them rename their command line, so only the session finds them)."""
    proc = subprocess.Popen([RAY, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    if sessions is not None:
        sessions.append(proc.pid)
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]


@pytest.fixture(scope="module")
def cluster():
    """``host:port`` of a fresh cluster: a head and one more node, one CPU each, on 127.0.0.1."""
    temp = tempfile.mkdtemp(prefix="sfray", dir="/tmp")  # Ray's socket paths must stay short
    port = _free_port()
    # several parties' drivers share this one cluster: keep each one's idle workers instead of restarting them
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_num_workers_soft_limit": "8"}
    env.pop("RAY_ADDRESS", None)
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    sessions: list[int] = []
    try:
        _ray("start", "--head", "--port", str(port), "--ray-client-server-port", str(_free_port()),
             "--include-dashboard=false", "--temp-dir", temp, *common, env=env, sessions=sessions)
        _ray("start", "--address", f"127.0.0.1:{port}", *common, env=env, sessions=sessions)
        yield {"address": f"127.0.0.1:{port}", "temp": temp}
    finally:
        # not `ray stop`: it stops every Ray cluster on the machine, e.g. the other xdist worker's mid-job
        _stop_cluster(temp, sessions)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def executor(cluster):
    """This test process as a Ray driver (everything to Ray: min_batch=1)."""
    from secureflhv.compute.ray_executor import RayExecutor

    r = RayExecutor(cluster["address"], owner="host-1", min_batch=1)
    yield r
    r.shutdown()


# ------------------------------------------------------------------------------------- job runs
def _compute(job: Path, compute: dict | None, parquet_guest: bool = False) -> None:
    """Every party on ``compute``; every data party's table read in row batches of 7 rows (its size
    exceeds data.max_memory_mb), the guest's from a Parquet copy with ``parquet_guest``."""
    doc = yaml.safe_load(job.read_text())
    for p in doc["parties"]:
        if compute is not None:
            p["compute"] = compute
        if "data" in p:
            p["data"].update(max_memory_mb=0.001, batch_rows=7)
            if parquet_guest and p["role"] == "guest":
                src = Path(p["data"]["path"])
                dst = job.parent / (src.stem + ".parquet")
                pd.read_csv(src, dtype={"id": str}).to_parquet(dst, row_group_size=50)
                p["data"]["path"] = str(dst)
    job.write_text(yaml.safe_dump(doc, sort_keys=False))


JOBS = {
    "vertical_lr": ({"mode": "arbiter", "epochs": 1, "batch_size": 128, "learning_rate": 0.15, "key_bits": 1024,
                     "seed": 7, "test_fraction": 0.3, "split_seed": 5}, True),
    "secureboost_vertical": ({"n_trees": 2, "max_depth": 2, "key_bits": 1024, "test_fraction": 0.3,
                              "split_seed": 5}, False),
}


@pytest.fixture(scope="module")
def job_runs(cluster, tmp_path_factory):
    """Each job twice at once, as real party processes: every party on the local pool, and on Ray."""
    tmp = tmp_path_factory.mktemp("rayjobs")
    guest_csv, host_csvs = breast_cancer_tables(tmp / "data", 1, seed=3, scheme="random")
    procs = {}
    for algorithm, (params, server) in JOBS.items():
        parties = vertical_parties(guest_csv, host_csvs, server=server, id_column="id", label_column="label")
        for engine in ("local", "ray"):
            job = write_job(tmp / algorithm / engine, f"{algorithm}-{engine}", algorithm, parties, params,
                            deadline_s=240, insecure_test_keys=True)  # slow when the machine is loaded
            if engine == "ray":  # (nearly) everything to the cluster, so that every step runs there;
                # and the tables streamed in row batches (binning by the bounded-memory quantile selection)
                _compute(job, {"engine": "ray", "address": cluster["address"], "min_batch": 64},
                         parquet_guest=not server)
            procs[algorithm, engine] = (job, subprocess.Popen(
                [sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", "420"], cwd=REPO,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    runs = {}
    for key, (job, proc) in procs.items():
        out, _ = proc.communicate(timeout=480)
        runs[key] = (job.parent / "out", proc.returncode, out)
    return runs


def _models(out: Path) -> dict:
    """Every party's parameter files (its verified bundle: guest trees / weights, host split tables /
    weights), as plain lists and dicts, by ``party/file``."""
    from secureflhv.runtime.store.model_bundle import read_bundle

    found = {}
    for party in sorted(p.parent.parent.name for p in out.glob("*/model/manifest.json")):
        bundle = read_bundle(out / party, ca=out.parent / "certs" / "ca.pem", expect_party=party)
        for name, value in bundle.files.items():
            found[f"{party}/{name}"] = value.tolist() if hasattr(value, "tolist") else value
    return found


@pytest.mark.parametrize("algorithm", sorted(JOBS))
def test_jobs_give_identical_models_on_the_local_pool_and_on_ray(job_runs, algorithm):
    local_out, code, log = job_runs[algorithm, "local"]
    assert code == 0, log[-3000:]
    ray_out, code, log = job_runs[algorithm, "ray"]
    assert code == 0, log[-3000:]
    assert "batch work on Ray cluster" in log  # the parties really used the cluster
    assert log.count("reading it in batches of 7 rows") == 2, log[-3000:]  # guest and host tables streamed
    if algorithm.startswith("secureboost"):  # split routing and prediction ran as tasks on the shards
        assert re.search(r"Ray tasks per step: .*\broute \d+", log), log[-3000:]
    local, on_ray = _models(local_out), _models(ray_out)
    assert local and local.keys() == on_ray.keys()
    assert local == on_ray  # exact: the same decrypted sums, the same splits
    pred = [(o / "guest" / "predictions.csv").read_text() for o in (local_out, ray_out)]
    assert pred[0] == pred[1]


# --------------------------------------------------------------------------- executor in-process
def test_ray_results_equal_the_local_pool(executor):
    pub, priv = pl.generate_keypair(512, insecure_test_key=True)
    rng = np.random.default_rng(0)
    x, X = rng.normal(size=700), rng.normal(size=(700, 6))
    enc = pl.encrypt(pub, x)  # local pool
    bins = rng.integers(0, 8, size=(700, 5)).astype(np.uint8)
    cts = [int(c) for c in enc.ciphertexts]
    rows = np.flatnonzero(rng.random(700) < 0.6)
    local = (pl.decrypt(priv, pl.dot(X, enc)), ph.build_node(cts, rows, bins, [8] * 5, pub.nsquare))
    with ex.using(executor):
        enc_r = pl.encrypt(pub, x)
        on_ray = (pl.decrypt(priv, pl.dot(X, enc)), ph.build_node(cts, rows, bins, [8] * 5, pub.nsquare))
        assert executor._shards  # the histogram rows were sharded in the object store
        np.testing.assert_allclose(pl.decrypt(priv, enc_r), x, atol=1e-12)
    assert (local[0] == on_ray[0]).all()
    assert local[1] == on_ray[1]  # the same ciphertext products, bin by bin


def test_shard_tasks_run_on_the_node_each_shard_is_assigned(executor):
    """Row shards are assigned to the nodes in turn and their tasks pinned there: after a step each node
    holds its shard (pulled from the driver's node, where ``ray.put`` leaves them all), and the step gets
    each shard's rows."""
    import ray
    big = np.arange(2 ** 22, dtype=np.float64)  # 32 MB: shards far above what Ray passes inline
    bounds, refs, nodes = executor._sharded(big)
    alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    assert len(alive) == 2 and len(refs) == 2 * executor.shards_per_worker == 2
    assert nodes == alive  # one shard per node
    rows = np.array([5, 2 ** 21 + 7, 2 ** 22 - 1])  # one row in the first shard, two in the last
    per_shard = [int(c) for c in np.diff(np.searchsorted(rows, bounds)) if c]
    assert [len(r) for r in executor.run_sharded(np.atleast_1d, (), (big,), rows)] == per_shard == [1, 2]
    where = ray.experimental.get_object_locations(refs)
    assert all(node in where[r]["node_ids"] for r, node in zip(refs, nodes)), where


def _my_task_workers(temp: str) -> list[int]:
    """Ray worker processes of this module's cluster that are running a task now (``ray::_call``)."""
    raylets, found = set(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "raylet" in cmd.split(" ")[0] and temp in cmd:
                raylets.add(int(d.name))
            elif cmd.startswith("ray::_call"):
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                found.append((int(d.name), ppid))
        except (OSError, ValueError, IndexError):
            continue
    return [pid for pid, ppid in found if ppid in raylets]


@pytest.fixture(scope="module")
def big_batch():
    """A 1024-bit key and 8,000 ciphertexts (made on the local pool): decrypting them takes a moment."""
    pub, priv = pl.generate_keypair(1024, insecure_test_key=True)
    x = np.linspace(-5, 5, 8_000)
    return priv, x, pl.encrypt(pub, x)


def _decrypt_killing_a_worker(executor, temp, batch):
    """Decrypt the batch on Ray while a worker running one of its tasks is SIGKILLed."""
    priv, x, enc = batch
    killed = []

    def killer():
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            pids = _my_task_workers(temp)
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            time.sleep(0.01)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        with ex.using(executor):
            return x, pl.decrypt(priv, enc), killed
    finally:
        killed.append(None)  # stop the killer if the step ended first
        t.join()


def test_killed_worker_is_retried_and_the_result_is_exact(executor, cluster, big_batch):
    x, dec, killed = _decrypt_killing_a_worker(executor, cluster["temp"], big_batch)
    assert killed[0] is not None  # a worker really died mid-step
    np.testing.assert_allclose(dec, x, atol=1e-9)


def test_killed_worker_without_retries_fails_naming_party_and_step(executor, cluster, big_batch):
    from secureflhv.compute.ray_executor import RayExecutor

    no_retry = RayExecutor(cluster["address"], owner="host-1", min_batch=1, max_retries=0, task_timeout_s=120)
    started = time.monotonic()
    with pytest.raises(ComputeError, match=r"^host-1: step 'decrypt' failed on the Ray cluster") as err:
        _decrypt_killing_a_worker(no_retry, cluster["temp"], big_batch)
    assert time.monotonic() - started < 120, err.value


def test_split_routing_on_ray_equals_the_local_masks(executor):
    """Training partitions (bins) and prediction routing (raw values, NaN by default side) as tasks on
    the row shards give the local masks bit for bit, for rows shared by several queries (trees)."""
    from secureflhv.tree.routing import left_masks

    rng = np.random.default_rng(4)
    X = rng.normal(size=(1_000, 4))
    X[rng.random(X.shape) < 0.1] = np.nan
    bins = rng.integers(0, 16, size=(1_000, 4)).astype(np.uint8)
    raw_q = [(j, float(rng.normal()), bool(j % 2), np.flatnonzero(rng.random(1_000) < 0.5)) for j in (0, 1, 3, 1)]
    bin_q = [(j, int(rng.integers(0, 15)), False, np.flatnonzero(rng.random(1_000) < 0.7)) for j in (2, 0)]
    local = (left_masks(X, raw_q, binned=False), left_masks(bins, bin_q, binned=True))
    before = dict(executor.tasks)
    with ex.using(executor):
        on_ray = (left_masks(X, raw_q, binned=False), left_masks(bins, bin_q, binned=True))
    assert executor.tasks.get("route", 0) > before.get("route", 0)  # it really ran as Ray tasks
    assert any(o is X for o, *_ in executor._shards) and any(o is bins for o, *_ in executor._shards)
    for a, b in zip(local, on_ray):
        assert len(a) == len(b) and all(m.dtype == bool and (m == n).all() for m, n in zip(a, b))
    assert 0 < sum(int(m.sum()) for m in local[0]) < sum(len(q[3]) for q in raw_q)  # both sides occur


def test_split_nn_on_ray_equals_the_local_pool(executor):
    """Split NN (guest + one host in threads): the hosts' encryptions and decryptions and the guest's
    plaintext-ciphertext products run as Ray tasks, and the model and predictions equal the local
    pool's to 1e-6 (the hosts' secret weight noise differs between runs; it cancels up to rounding)."""
    sys.path.insert(0, str(REPO / "tests" / "vertical"))
    from snn_harness import make_roles, run_roles, toy

    from secureflhv.vertical.split_nn import SplitNNConfig

    X, y = toy(n=24, d=6, seed=1)
    Xg, Xh = X[:, :3], X[:, 3:]
    cfg = SplitNNConfig(key_bits=512, insecure_test_key=True, host_bottom=[4, 3], guest_bottom=[3], interactive_units=3,
                        top_hidden=[3], epochs=1, batch_size=24, learning_rate=0.05, interactive_lr=0.2,
                        weight_noise=3.0, seed=5, init_seed=2)

    def train():
        _, guest, hosts = make_roles(Xg, y, [Xh], cfg)
        results, errors = run_roles(guest, hosts, predict_sets=(Xg, [Xh]), timeout=120)
        assert not errors, errors
        weights = {"W_h": guest.V["host-1"] + hosts[0].E, "W_g": guest.W_g, "bias": guest.bias,
                   **{f"top.{k}": v.numpy() for k, v in guest.top.state_dict().items()},
                   **{f"hb.{k}": v.numpy() for k, v in hosts[0].bottom.state_dict().items()}}
        return results["proba"], results["guest"].batch_losses, weights

    local = train()
    before = dict(executor.tasks)
    with ex.using(executor):
        on_ray = train()
    ran = {k for k, v in executor.tasks.items() if v > before.get(k, 0)}
    assert {"decrypt", "dot"} <= ran and ran & {"encrypt", "encrypt_crt"}, ran
    np.testing.assert_allclose(on_ray[0], local[0], atol=1e-6)
    np.testing.assert_allclose(on_ray[1], local[1], atol=1e-6)
    assert local[2].keys() == on_ray[2].keys()
    for k in local[2]:
        np.testing.assert_allclose(on_ray[2][k], local[2][k], atol=1e-6, err_msg=k)


_LOST_DRIVER = """
import sys, time
from secureflhv.compute import executor as ex
from secureflhv.compute.executor import ComputeError
from secureflhv.compute.ray_executor import RayExecutor

r = RayExecutor(sys.argv[1], owner="host-1", min_batch=1, cluster_lost_s=3)
print("submitting", flush=True)
try:
    with ex.using(r):
        ex.run(time.sleep, (), [(60,)])  # a step in flight on the cluster when it dies
except ComputeError as exc:
    print("ERROR", exc, flush=True)
    r.shutdown()
    sys.exit(3)
print("finished?!", flush=True)
"""


def test_whole_cluster_dying_mid_step_is_a_clear_error_of_the_party(tmp_path):
    """A party's own Ray cluster (here a separate one-node cluster: the module's cluster and this test
    process must survive) dies while a step waits: the party process gets a ComputeError that names it,
    the step and what to do, within seconds, not Ray's silent end of the driver process after 60 s."""
    temp = tempfile.mkdtemp(prefix="sflost", dir="/tmp")
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    head, sessions = None, []
    try:
        _ray("start", "--head", "--port", str(port), "--ray-client-server-port", str(_free_port()),
             "--include-dashboard=false", "--temp-dir", temp, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
             "--disable-usage-stats", env=env, sessions=sessions)
        head = subprocess.Popen([sys.executable, "-c", _LOST_DRIVER, f"127.0.0.1:{port}"], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in head.stdout:
            if line.startswith("submitting"):
                break
        time.sleep(1.5)  # the task is submitted and waiting on the cluster
        killed = _kill_cluster(temp, sessions)
        assert killed
        started = time.monotonic()
        out, _ = head.communicate(timeout=50)
        elapsed = time.monotonic() - started
    finally:
        if head is not None and head.poll() is None:
            head.kill()
        _stop_cluster(temp, sessions, grace_s=0)
        shutil.rmtree(temp, ignore_errors=True)
    assert head.returncode == 3, out[-3000:]
    assert "ERROR host-1: the Ray cluster stopped during step 'sleep'" in out, out[-3000:]
    assert "Restart the cluster" in out and "compute.engine to local" in out
    assert elapsed < 30, elapsed  # Ray alone would end the process silently after 60 s


def _stop_cluster(temp: str, sessions=(), grace_s: float = 2.0) -> None:
    """Stop the cluster whose temp dir is ``temp`` (started in ``sessions``): SIGTERM its processes (a raylet
    ends its workers), SIGKILL what is left after ``grace_s``. Ray's daemons (gcs_server, raylet, monitor)
    outlive SIGTERM for 20 s and more here, so a longer grace only waits."""
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while _kill_cluster(temp, sessions, sig):
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.5)


def _kill_cluster(temp: str, sessions=(), sig=signal.SIGKILL) -> list[int]:
    """Send ``sig`` to every live process of the cluster whose temp dir is ``temp`` or that runs in one of
    ``sessions`` (not any other Ray on this machine); returns their pids."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                stat = (d / "stat").read_text().rsplit(") ", 1)[1].split()  # state, ppid, pgrp, session, ...
                mine = temp.encode() in (d / "cmdline").read_bytes() or int(stat[3]) in sessions
                if mine and stat[0] != "Z":
                    os.kill(int(d.name), sig)
                    pids.append(int(d.name))
            except (OSError, ValueError, IndexError):
                continue
    return pids
