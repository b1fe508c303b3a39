"""secureflhv: secure cross-silo federated learning.

Layers, bottom to top (each imports only from layers below it):
crypto -> transport -> data -> algorithms (vertical, horizontal, tree) -> runtime -> cli.

``secureflhv.load_model(dir, ca=...)`` (:mod:`secureflhv.runtime.model_api`) opens a saved model bundle and verifies
its signature against the job CA.
"""
__version__ = "0.1.0"


def __getattr__(name: str):
    # lazy: importing secureflhv stays cheap; the API pulls in the runtime only when used
    if name == "load_model":
        from .runtime.model_api import load_model

        return load_model
    raise AttributeError(f"module 'secureflhv' has no attribute {name!r}")
