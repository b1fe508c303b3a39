"""Imported by the party's multiprocessing ``forkserver`` only (first in ``pool.PRELOAD``):
the forkserver dies with its party (:mod:`.lifeline`), and records its pid for the workers it forks.

The forkserver is started by whichever party thread first starts a pool (often a short-lived one),
so it watches its parent rather than use ``PR_SET_PDEATHSIG`` (prctl(2): that signal follows the
forking *thread*). Its workers are forked by its one thread and use the prctl
(``pool._init_worker``).
"""
import os

from .lifeline import PARENT_ENV, die_with_parent

FORKSERVER_PID = None  # set in the forkserver; its forked workers inherit it (their parent's pid)

_party = os.environ.get(PARENT_ENV)  # set by the party before it starts the forkserver (mp_context)
if _party and _party.isdigit() and int(_party) != os.getpid():  # not the party itself (imported by mistake)
    FORKSERVER_PID = os.getpid()
    die_with_parent(int(_party), pdeathsig=False)
