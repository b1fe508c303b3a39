"""A party whose compute cluster dies mid-job: it fails with the executor's own error and its peers stop
at once naming it (the role's abort), not at their deadline and not with a bare exception.

The host's executor here stands in for a Ray cluster that is lost during its first histogram step; it
raises exactly the error :class:`~secureflhv.compute.ray_executor.RayExecutor` raises then (the real
cluster death is in ``tests/runtime/test_ray_cluster.py``). Everything else runs inline.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

from sb_harness import vertical_run
from secureflhv.compute import executor as ex
from secureflhv.crypto.homomorphic import paillier as pl
from secureflhv.compute.executor import ComputeError
from secureflhv.compute.ray_executor import RayExecutor
from secureflhv.tree.params import SecureBoostParams


class _ClusterLostAtHistograms(ex.Executor):
    name = "ray"
    min_batch = 1  # every batch goes to the "cluster"

    def workers(self) -> int:
        return 2

    def run(self, fn, common, chunks):
        return [fn(*common, *c) for c in chunks]

    def run_sharded(self, fn, common, data, rows, extra=(), aligned=()):
        if ex.step_name(fn) == "histograms":  # only the host builds histograms
            fake = SimpleNamespace(owner="host-1", _head="10.0.0.5:6379", cluster_lost_s=10.0)
            raise RayExecutor._lost_error(fake, "histograms", 1, 4)
        return None


def test_host_losing_its_cluster_stops_the_guest_naming_the_host_and_step():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 4))
    y = (X[:, 0] + X[:, 2] > 0).astype(int)
    params = SecureBoostParams(n_trees=1, max_depth=2, key_bits=512, insecure_test_key=True)
    started = time.monotonic()
    with ex.using(_ClusterLostAtHistograms()):
        run = vertical_run(X, y, [[0, 1], [2, 3]], params, deadline=30.0,
                           keypair=pl.generate_keypair(512, insecure_test_key=True))
    elapsed = time.monotonic() - started
    host_err, guest_err = run["errors"].get("host-1"), run["errors"].get("guest")
    assert isinstance(host_err, ComputeError), run["errors"]
    assert str(host_err).startswith("host-1: the Ray cluster stopped during step 'histograms'")
    assert "Restart the cluster" in str(host_err)
    # the guest stops because the host told it, naming the host and the cause
    assert guest_err is not None and "host-1" in str(guest_err), run["errors"]
    assert "Ray cluster stopped during step 'histograms'" in str(guest_err)
    assert "10.0.0.5" not in str(guest_err)  # the party's internal cluster address stays with it
    assert elapsed < 30.0  # well within the deadline: the abort, not a timeout
