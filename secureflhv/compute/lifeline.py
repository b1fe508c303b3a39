"""Child processes die with their party, whatever ended it (SIGKILL, the OOM killer, a timeout).

Why: nothing in the Paillier pool (:mod:`.pool`) notices its party's death. The workers
wait for tasks forever, the ``forkserver`` they are forked from waits for them (each holds its "alive"
pipe), and the multiprocessing resource tracker waits for all of these: a party killed with SIGKILL left
every one of them behind (4 processes with 2 workers), holding their memory (key tables included), one
more set per crash or restart. (The PSI pool's spawned workers end on their own; both are checked by
tests/runtime/test_party_children_die.py.)

How (Linux): ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (prctl(2)) makes the kernel kill the child when its
parent ends. Two pitfalls from prctl(2): the signal is sent when the *thread* that created the child
exits, not the parent process, so it is used only for children forked by a thread that lives as long
as its process (the forkserver's single thread); and a parent that died before the call is not
noticed, so the parent is checked right after it (``getppid()`` is no longer the pid it was).
Elsewhere, and for children a party starts from any of its threads (the forkserver itself, spawned
workers), a daemon thread in the child polls ``getppid()`` (a child whose parent ended is re-parented)
and ends the child when it changes. The resource tracker needs neither: it exits when the last holder
of its pipe (party, forkserver, workers) has gone.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.5  # the watch's period: a child outlives its parent by at most this long
# The party's pid, for the forkserver it starts (set by pool.mp_context before the start):
# the forkserver's parent at the time it looks may already be another process if the party died at once.
PARENT_ENV = "SECUREFLHV_POOL_PARENT_PID"


def _set_pdeathsig(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` for this process; False where prctl is unavailable or fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)  # the interpreter's own symbols: libc's prctl (no ldconfig lookup)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(POLL_S)
        os._exit(1)  # no cleanup: what this process holds belongs to a party that is gone

    threading.Thread(target=watch, name="secureflhv-lifeline", daemon=True).start()


def die_with_parent(parent_pid: int, *, pdeathsig: bool = True) -> str:
    """End this process (at once, no cleanup) when its parent ``parent_pid`` ends; call it first thing
    in a child process.

    ``pdeathsig``: use ``PR_SET_PDEATHSIG`` where available; only for a child forked by a thread that
    lives as long as its parent process (see the module docstring), else a watch thread is started.
    Ends this process at once if the parent is already gone. Returns how: ``"prctl"`` or ``"watch"``.
    """
    parent_pid = int(parent_pid)
    how = "prctl" if pdeathsig and _set_pdeathsig(signal.SIGKILL) else "watch"
    if os.getppid() != parent_pid:  # the parent died before the prctl call (or before we looked)
        os._exit(1)
    if how == "watch":
        _watch(parent_pid)
    return how
