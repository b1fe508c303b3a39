"""benchmarks/scale.py: a tiny local run reports its units and projection; stopping "our" Ray cluster kills
exactly the processes started for it (never another user's on the same machine)."""
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import scale  # noqa: E402


def test_stop_cluster_kills_only_the_processes_of_its_folder(tmp_path):
    temp = str(tmp_path / f"sfbench{uuid.uuid4().hex[:8]}")
    ours = subprocess.Popen(["sh", "-c", "sleep 60; true", temp])  # sh names the folder; its child sleep does not
    other = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while len(scale.cluster_processes(temp)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = scale.cluster_processes(temp)
        assert ours.pid in found and len(found) == 2 and other.pid not in found
        scale.stop_cluster(temp)
        assert ours.wait(timeout=10) is not None and not scale.cluster_processes(temp)
        assert other.poll() is None  # untouched
    finally:
        for p in (ours, other):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_tiny_local_run_reports_trees_epochs_and_the_projection(capsys):
    scale.main(["--quick", "--rows", "300", "--host-features", "4", "--depth", "2", "--engines", "local1",
                "--nodes", "2", "--cores-per-node", "4"])
    out = capsys.readouterr().out
    assert "local1  (1 workers" in out and "s/tree" in out and "s/epoch" in out
    assert "projection secureboost:" in out and "projection lr:" in out and "2 nodes x 4 cores" in out
