"""secureflhv: secure cross-silo federated learning.

Layers, bottom to top (each imports only from layers below it; docs/architecture.md):
compute -> crypto -> transport -> data -> algorithms (vertical, horizontal, tree, secagg, fedstats) -> runtime -> cli.

``secureflhv.load_model(dir, ca=...)`` (:mod:`secureflhv.runtime.store.model_api`) opens a saved model bundle and
verifies its signature against the job CA. ``secureflhv.Job`` builds a job in Python, ``secureflhv.simulate(job)``
runs every party of it in this process and returns a ``secureflhv.SimulationResult`` (:mod:`secureflhv.runtime.api`).
"""
from ._version import __version__

__all__ = ["__version__", "Job", "SimulationError", "SimulationResult", "load_model", "simulate"]

_API = ("Job", "SimulationError", "SimulationResult", "simulate")


def __getattr__(name: str):
    # lazy: importing secureflhv stays cheap; the API pulls in the runtime only when used
    if name == "load_model":
        from .runtime.store.model_api import load_model

        return load_model
    if name in _API:
        from .runtime import api

        return getattr(api, name)
    raise AttributeError(f"module 'secureflhv' has no attribute {name!r}")
