"""The executor interface without a cluster: job-file ``compute`` validation, engine choice, encoding, progress.

The Ray cluster tests are in ``tests/runtime/test_ray_cluster.py``.
"""
import logging
import socket

import gmpy2
import numpy as np
import pytest

from secureflhv.compute import executor as ex
from secureflhv.crypto.homomorphic import paillier as pl
from secureflhv.compute.ray_executor import IntBlock, decode, encode
from secureflhv.runtime.process.party_compute import make_executor, reachable
from secureflhv.runtime.job.job_file import ComputeSpec, JobConfigError, parse_job_file



def good_job() -> dict:
    return {
        "job": {"id": "j1", "algorithm": "vertical_lr"},
        "security": {"insecure": True},
        "parties": [
            {"id": "server", "role": "server", "address": "127.0.0.1:5001"},
            {"id": "guest", "role": "guest", "address": "127.0.0.1:5002",
             "data": {"path": "g.csv", "id_column": "id", "label_column": "y"}},
            {"id": "host-1", "role": "host", "address": "127.0.0.1:5003", "data": {"path": "h.csv"}},
        ],
    }


def _job_with_compute(compute) -> dict:
    doc = good_job()
    doc["parties"][2]["compute"] = compute
    return doc


@pytest.mark.parametrize("compute, field", [
    ({"engine": "spark"}, "parties[2].compute.engine"),
    ({"engine": "ray", "address": "no-port"}, "parties[2].compute.address"),
    ({"engine": "local", "address": "10.0.0.5:6379"}, "parties[2].compute"),
    ({"engine": "ray", "max_retries": -1}, "parties[2].compute.max_retries"),
    ({"engine": "ray", "adress": "h:1"}, "parties[2].compute.adress"),
])
def test_bad_compute_section_names_the_field(compute, field):
    with pytest.raises(JobConfigError) as err:
        parse_job_file(_job_with_compute(compute))
    assert field in str(err.value)


def test_compute_defaults_to_the_local_pool():
    cfg = parse_job_file(good_job())
    assert cfg.parties[2].compute.engine == "local"
    assert isinstance(make_executor(cfg.parties[2].compute, "host-1"), ex.LocalExecutor)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_auto_falls_back_to_local_and_ray_refuses_an_unreachable_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port = _closed_port()
    assert not reachable(f"127.0.0.1:{port}", timeout=0.5)
    assert isinstance(make_executor(ComputeSpec(engine="auto"), "h"), ex.LocalExecutor)
    assert isinstance(make_executor(ComputeSpec(engine="auto", address=f"127.0.0.1:{port}"), "h"), ex.LocalExecutor)
    monkeypatch.setenv("RAY_ADDRESS", f"ray://127.0.0.1:{port}")
    assert isinstance(make_executor(ComputeSpec(engine="auto"), "h"), ex.LocalExecutor)
    with pytest.raises(JobConfigError, match=r"parties\[2\]\.compute\.address: no Ray cluster answers"):
        make_executor(ComputeSpec(engine="ray"), "host-1", "parties[2].compute")
    monkeypatch.delenv("RAY_ADDRESS")
    with pytest.raises(JobConfigError, match="needs an address"):
        make_executor(ComputeSpec(engine="ray"), "host-1")


def test_int_blocks_round_trip_big_signed_and_missing_values():
    n2 = (1 << 4095) + 12345
    values = [gmpy2.mpz(0), gmpy2.mpz(n2 - 1), -7, None, 1 << 64, gmpy2.mpz(3)]
    block = encode(values)
    assert isinstance(block, IntBlock) and block.mag.dtype == np.uint8
    assert decode(block) == values
    assert decode(block.take(np.array([1, 3]))) == [n2 - 1, None]
    nested = encode(([1, -2], [[5], [None, 6]], np.arange(3), 9))
    got = decode(nested)
    assert got[:2] == ([1, -2], [[5], [None, 6]]) and got[3] == 9 and (got[2] == np.arange(3)).all()


class _Inline(ex.Executor):
    """A test executor that runs chunks inline and counts them: shows the crypto layer goes through it."""

    name = "inline"

    def __init__(self, workers: int = 4, task_min_batches: int = 0):
        self.steps = []
        self.n_workers, self.task_min_batches = workers, task_min_batches

    def workers(self):
        return self.n_workers

    def run(self, fn, common, chunks):
        self.steps.append((ex.step_name(fn), len(chunks)))
        return [fn(*common, *c) for c in chunks]


def test_batch_crypto_runs_on_the_installed_executor():
    pub, priv = pl.generate_keypair(512, insecure_test_key=True)
    x = np.linspace(-2, 2, 300)
    inline = _Inline()
    with ex.using(inline):
        enc = pl.encrypt(pub, x)
        dec = pl.decrypt(priv, enc)
    assert ex.current() is not inline
    np.testing.assert_allclose(dec, x, atol=1e-9)
    assert [s for s, _ in inline.steps] == ["encrypt", "decrypt"] and all(k > 1 for _, k in inline.steps)


def test_progress_lines_report_done_total_rate_and_eta(monkeypatch, caplog):
    clock = iter([0.0, 6.0, 12.0, 30.0])
    monkeypatch.setattr(ex.time, "monotonic", lambda: next(clock))
    events = []
    listener = lambda *a: events.append(a)  # noqa: E731
    p = ex.Progress("host-1", "histograms", 4, "ray")
    ex.add_progress_listener(listener)
    try:
        with caplog.at_level(logging.INFO, logger="secureflhv.compute"):
            p.advance()      # t=6: first line
            p.advance()      # t=12: within 10 s of the last line: silent
            p.advance(2)     # t=30: the last one is always logged
    finally:
        ex.remove_progress_listener(listener)
    assert [(e[3], e[4]) for e in events] == [(1, 4), (4, 4)] and events[0][:3] == ("host-1", "histograms", "ray")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "host-1: histograms on ray: 1/4 shards done, 0.17 shards/s, ETA 18s"
    assert lines[-1].startswith("host-1: histograms on ray: 4/4 shards done") and len(lines) == 2


@pytest.mark.parametrize("workers", [1, 2, 3, 16])
def test_dot_split_by_columns_and_rows_gives_the_same_ciphertexts(workers):
    # the products are exact, so however the columns and rows are cut the ciphertexts are identical
    pub, _ = pl.generate_keypair(512, insecure_test_key=True)
    rng = np.random.default_rng(workers)
    enc = pl.encrypt(pub, rng.normal(size=2400))
    for d in (1, 3, 10):
        X = rng.normal(size=(2400, d))
        pl.set_workers(1)  # the reference: one multi-exponentiation per column over all rows, in this process
        try:
            whole = pl.dot(X, enc)
        finally:
            pl.set_workers(None)
        split = _Inline(workers, task_min_batches=2)
        with ex.using(split):
            got = pl.dot(X, enc)
        assert [int(c) for c in got.ciphertexts] == [int(c) for c in whole.ciphertexts]
        assert len(split.steps) == 1 and split.steps[0][0] == "dot" and split.steps[0][1] >= min(workers, 2)


def test_chunks_per_task_cost():
    """An executor whose tasks cost something (Ray) gets fewer, bigger chunks, never fewer than one per
    worker, and a single-worker cluster still takes the work off the party process (>= 2 chunks, not inline)."""
    local_like, ray_like = _Inline(2), _Inline(2, task_min_batches=2)
    with ex.using(local_like):
        assert ex.parallel_chunks(1024, 256) == 8  # four per worker balance the load
    with ex.using(ray_like):
        assert ex.parallel_chunks(1024, 256) == 2  # LR's mini-batch: one task per worker
        assert ex.parallel_chunks(1_000_000, 256) == 8  # big batches: as before
        assert ex.parallel_chunks(2_600, 256) == 4  # not 5: whole rounds of one chunk per worker
        assert ex.parallel_chunks(100, 256) == 1  # below break-even: inline
    for engine in (_Inline(1, task_min_batches=2), _Inline(16, task_min_batches=2)):
        with ex.using(engine):
            assert ex.parallel_chunks(1024, 256) == max(2, engine.workers())
            assert ex.parallel_chunks(10_240, 2000, per_worker=1) == max(2, engine.workers())


def test_a_gradients_few_decryptions_are_split_over_the_workers():
    """Each decryption costs ~2.5 ms: a 10-value LR gradient goes to two workers (one task each on Ray)."""
    pub, priv = pl.generate_keypair(512, insecure_test_key=True)
    enc = pl.encrypt(pub, np.linspace(-1, 1, 10))
    for engine, chunks in ((_Inline(2), 8), (_Inline(2, task_min_batches=2), 2)):
        with ex.using(engine):
            np.testing.assert_allclose(pl.decrypt(priv, enc), np.linspace(-1, 1, 10), atol=1e-9)
        assert engine.steps[-1] == ("decrypt", chunks)


class _FakeRay:
    def __init__(self):
        self.puts = []

    def put(self, obj):
        self.puts.append(obj)
        return ("ref", len(self.puts))


def test_shared_task_arguments_go_through_the_object_store_only_when_big():
    from secureflhv.compute.ray_executor import INLINE_COMMON_BYTES, RayExecutor

    executor = RayExecutor.__new__(RayExecutor)  # no cluster: only the choice is tested
    executor._ray = _FakeRay()
    small = (gmpy2.mpz(1) << 4095, [gmpy2.mpz(7)] * 8)
    inline = executor._common(small)
    assert executor._ray.puts == [] and decode(inline) == (small[0], small[1])
    big = (12, [gmpy2.mpz(1) << 4095] * (INLINE_COMMON_BYTES // 512 + 1))
    assert executor._common(big) == ("ref", 1) and len(executor._ray.puts) == 1
    assert decode(executor._ray.puts[0])[1] == big[1]
