"""secureflhv: secure cross-silo federated learning.

Layers, bottom to top (each imports only from layers below it; docs/architecture.md):
compute -> crypto -> transport -> data -> algorithms (vertical, horizontal, tree, secagg, fedstats) -> runtime -> cli.

``secureflhv.load_model(dir, ca=...)`` (:mod:`secureflhv.runtime.store.model_api`) opens a saved model bundle and
verifies its signature against the job CA.
"""
from ._version import __version__

__all__ = ["__version__", "load_model"]


def __getattr__(name: str):
    # lazy: importing secureflhv stays cheap; the API pulls in the runtime only when used
    if name == "load_model":
        from .runtime.store.model_api import load_model

        return load_model
    raise AttributeError(f"module 'secureflhv' has no attribute {name!r}")
